#ifndef CLINUX_H
#define CLINUX_H
// Linux calls that Swift's Glibc module does not import (they need _GNU_SOURCE). One wrapper each, no logic.

/// renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE): swaps two paths atomically. Returns 0 or -1 with errno.
int clinux_rename_exchange(const char *from, const char *to);
/// renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE). Returns 0 or -1 with errno.
int clinux_rename_noreplace(const char *from, const char *to);
/// syncfs(fd): writes out the whole filesystem holding fd. Returns 0 or -1 with errno.
int clinux_syncfs(int fd);
/// sync_file_range(fd, offset, count, SYNC_FILE_RANGE_WRITE): starts writing those bytes out, without waiting
/// for them (no durability by itself: the later fsync is what makes them durable). Returns 0 or -1 with errno.
int clinux_start_writeback(int fd, long long offset, long long count);
/// mallopt(param, value) from <malloc.h>, which Swift's Glibc module does not import. Returns 1 on success.
int clinux_mallopt(int param, int value);
/// M_ARENA_MAX, for clinux_mallopt.
int clinux_m_arena_max(void);
/// M_MMAP_THRESHOLD, for clinux_mallopt.
int clinux_m_mmap_threshold(void);
/// malloc_trim(pad) from <malloc.h>: gives the free memory of the heaps back to the system. Returns 1 if any was.
int clinux_malloc_trim(unsigned long pad);
/// Drops this process's resident pages of code mapped from files (its own and its libraries' `r-xp` mappings) with
/// `madvise(MADV_DONTNEED)`: they stay in the page cache and come back by minor faults when run again. Only mappings
/// that are never written are touched (no data, RELRO or anonymous memory). Returns the bytes of mappings advised, or
/// -1 when /proc/self/maps cannot be read. For a service gone idle, whose RSS is mostly code it ran.
long clinux_release_code_pages(void);
int clinux_reflink(int dest, int src);
/// O_DIRECT from <fcntl.h> (it needs _GNU_SOURCE, and its value differs between architectures).
int clinux_o_direct(void);
// setxattr: to mark folders as not for backup (user.xdg.robots.backup).
#include <sys/xattr.h>
#endif
