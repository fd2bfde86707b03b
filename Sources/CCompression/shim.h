#include <zstd.h>
#include <zlib.h>
