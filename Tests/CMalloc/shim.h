// glibc's heap statistics (mallinfo2), which Swift's Glibc module does not import: the fuzz corpus tests
// replay saved leaks and check that the heap does not grow.
#include <malloc.h>
