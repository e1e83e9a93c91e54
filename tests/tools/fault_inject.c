/* Fault injection for the checkpoint tests, loaded with LD_PRELOAD into the gputrain binary (never linked into it).
 *
 *   GT_FAULT_MATCH   substring of the paths to act on (e.g. "tmp/optimizer.safetensors")
 *   GT_FAULT_SKIP    how many matching opens to leave alone first (default 0)
 *   GT_FAULT_ACTION  enospc: that open fails with ENOSPC, as on a full disk
 *                    kill:   the first write to that file writes half its bytes, then the process gets SIGKILL
 *                    slow:   the first write to that file waits GT_FAULT_SLEEP_MS (default 3000) first
 *                    full:   the disk fills up after GT_FAULT_BYTES (default 0) more bytes of that file: the write
 *                            that crosses the limit is short, later ones fail with ENOSPC
 *
 *   GT_FAULT_RAISE_AT_LOAD=TERM  raises SIGTERM from this library's initialiser: after the program's
 *                                .preinit_array, before its main, while the other libraries initialise
 *
 * It wraps open/open64/openat and write through dlsym(RTLD_NEXT), so the program runs its real code paths. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_seen = 0;
static int g_doomed_fd = -1;

/* 1 when this open is the one to sabotage: only opens for writing count. */
static int targeted(const char* path, int flags) {
  const char* match = getenv("GT_FAULT_MATCH");
  if (!(flags & (O_WRONLY | O_RDWR | O_CREAT))) return 0;
  if (!match || !*match || !path || !strstr(path, match)) return 0;
  const char* skip = getenv("GT_FAULT_SKIP");
  return g_seen++ == (skip ? atoi(skip) : 0);
}

/* kill and slow act on the first write; anything else (enospc) fails the open. */
static int acts_on_write(void) {
  const char* a = getenv("GT_FAULT_ACTION");
  return a && (strcmp(a, "kill") == 0 || strcmp(a, "slow") == 0 || strcmp(a, "full") == 0);
}

static long g_full_left = 0; /* full: bytes the disk still takes */

static int after_open(const char* path, int fd, int hit) {
  (void)path;
  if (hit && fd >= 0) {
    g_doomed_fd = fd;
    const char* bytes = getenv("GT_FAULT_BYTES");
    g_full_left = bytes ? atol(bytes) : 0;
  }
  return fd;
}

#define OPEN_WRAPPER(NAME, REAL_T, CALL_REAL)          \
  int NAME(const char* path, int flags, ...) {         \
    mode_t mode = 0;                                   \
    if (flags & (O_CREAT | O_TMPFILE)) {               \
      va_list ap;                                      \
      va_start(ap, flags);                             \
      mode = (mode_t)va_arg(ap, int);                  \
      va_end(ap);                                      \
    }                                                  \
    static REAL_T real = 0;                            \
    if (!real) real = (REAL_T)dlsym(RTLD_NEXT, #NAME); \
    const int hit = targeted(path, flags);             \
    if (hit && !acts_on_write()) {                     \
      errno = ENOSPC;                                  \
      return -1;                                       \
    }                                                  \
    return after_open(path, CALL_REAL, hit);           \
  }

typedef int (*open_t)(const char*, int, ...);
typedef int (*openat_t)(int, const char*, int, ...);
OPEN_WRAPPER(open, open_t, real(path, flags, mode))
OPEN_WRAPPER(open64, open_t, real(path, flags, mode))

int openat(int dirfd, const char* path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = (mode_t)va_arg(ap, int);
    va_end(ap);
  }
  static openat_t real = 0;
  if (!real) real = (openat_t)dlsym(RTLD_NEXT, "openat");
  const int hit = targeted(path, flags);
  if (hit && !acts_on_write()) {
    errno = ENOSPC;
    return -1;
  }
  return after_open(path, real(dirfd, path, flags, mode), hit);
}

ssize_t write(int fd, const void* buf, size_t n) {
  typedef ssize_t (*write_t)(int, const void*, size_t);
  static write_t real = 0;
  if (!real) real = (write_t)dlsym(RTLD_NEXT, "write");
  const char* action = getenv("GT_FAULT_ACTION");
  if (fd >= 0 && fd == g_doomed_fd && action && strcmp(action, "full") == 0) {
    if (g_full_left <= 0) {
      errno = ENOSPC;
      return -1;
    }
    const size_t take = n < (size_t)g_full_left ? n : (size_t)g_full_left;
    const ssize_t w = real(fd, buf, take);
    if (w > 0) g_full_left -= w;
    return w;
  }
  if (fd >= 0 && fd == g_doomed_fd && n > 1) {
    g_doomed_fd = -1;
    const char* a = action;
    if (strcmp(a, "kill") == 0) {
      real(fd, buf, n / 2);
      raise(SIGKILL);
    }
    const char* ms = getenv("GT_FAULT_SLEEP_MS");
    struct timespec left = {0, 0};
    const long total = ms ? atol(ms) : 3000;
    left.tv_sec = total / 1000;
    left.tv_nsec = (total % 1000) * 1000000L;
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
  }
  return real(fd, buf, n);
}

/* A closed file's number is handed out again: the next file that gets it is not the doomed one. */
int close(int fd) {
  typedef int (*close_t)(int);
  static close_t real = 0;
  if (!real) real = (close_t)dlsym(RTLD_NEXT, "close");
  if (fd >= 0 && fd == g_doomed_fd) g_doomed_fd = -1;
  return real(fd);
}

__attribute__((constructor)) static void raise_at_load(void) {
  const char* sig = getenv("GT_FAULT_RAISE_AT_LOAD");
  if (sig && strcmp(sig, "TERM") == 0) raise(SIGTERM);
}
