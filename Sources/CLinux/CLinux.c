#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include "CLinux.h"

int clinux_rename_exchange(const char *from, const char *to) { return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE); }
int clinux_rename_noreplace(const char *from, const char *to) { return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE); }
#include <unistd.h>
int clinux_syncfs(int fd) { return syncfs(fd); }
int clinux_start_writeback(int fd, long long offset, long long count) { return sync_file_range(fd, offset, count, SYNC_FILE_RANGE_WRITE); }
#include <malloc.h>
int clinux_mallopt(int param, int value) { return mallopt(param, value); }
int clinux_m_arena_max(void) { return M_ARENA_MAX; }
