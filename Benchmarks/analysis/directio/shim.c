#define _GNU_SOURCE
#include <fcntl.h>
int clinux_o_direct(void) { return O_DIRECT; }
