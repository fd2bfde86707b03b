#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include "CLinux.h"

int clinux_o_direct(void) { return O_DIRECT; }

int clinux_rename_exchange(const char *from, const char *to) { return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE); }
int clinux_rename_noreplace(const char *from, const char *to) { return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE); }
#include <unistd.h>
int clinux_syncfs(int fd) { return syncfs(fd); }
int clinux_start_writeback(int fd, long long offset, long long count) { return sync_file_range(fd, offset, count, SYNC_FILE_RANGE_WRITE); }
#include <malloc.h>
int clinux_mallopt(int param, int value) { return mallopt(param, value); }
int clinux_m_arena_max(void) { return M_ARENA_MAX; }
int clinux_malloc_trim(unsigned long pad) { return malloc_trim(pad); }

#include <sys/ioctl.h>
#include <linux/fs.h>
// FICLONE: makes `dest` share `src`'s blocks (copy on write), where the filesystem can (btrfs, xfs); -1 with
// errno (EOPNOTSUPP, EXDEV, EINVAL) elsewhere. ioctl is variadic, which Swift cannot call.
int clinux_reflink(int dest, int src) {
    return ioctl(dest, FICLONE, src);
}
