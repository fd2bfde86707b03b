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
int clinux_m_mmap_threshold(void) { return M_MMAP_THRESHOLD; }
int clinux_malloc_trim(unsigned long pad) { return malloc_trim(pad); }

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
long clinux_release_code_pages(void) {
    FILE *maps = fopen("/proc/self/maps", "re");
    if (maps == NULL) return -1;
    char line[4352];
    long total = 0;
    while (fgets(line, sizeof line, maps) != NULL) {
        unsigned long start, end, offset, inode;
        unsigned int major, minor;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s %lx %x:%x %lu", &start, &end, perms, &offset, &major, &minor, &inode) != 7) continue;
        // Code of a file, private and never written: what MADV_DONTNEED drops is read again from the file.
        if (inode == 0 || strcmp(perms, "r-xp") != 0) continue;
        if (madvise((void *)start, end - start, MADV_DONTNEED) == 0) total += (long)(end - start);
    }
    fclose(maps);
    return total;
}

#include <sys/ioctl.h>
#include <linux/fs.h>
// FICLONE: makes `dest` share `src`'s blocks (copy on write), where the filesystem can (btrfs, xfs); -1 with
// errno (EOPNOTSUPP, EXDEV, EINVAL) elsewhere. ioctl is variadic, which Swift cannot call.
int clinux_reflink(int dest, int src) {
    return ioctl(dest, FICLONE, src);
}
