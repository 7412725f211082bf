/*
 * kiln-executor-c: a Kiln executor written in C from docs/PROTOCOL.md alone, for targets
 * where Rust is not available (here: AArch64 and RISC-V 64 under qemu-user, built with
 * aarch64-linux-gnu-gcc and riscv64-linux-gnu-gcc). It serves the copy transport over TCP, plaintext, on a loopback
 * address:
 *
 *   kiln-executor-c --listen 127.0.0.1:PORT     (PORT 0: any; the address is printed)
 *
 * and each connection in a forked process of its own. It implements Reserve, Prepare,
 * Initialize (permissions, then the instruction cache made coherent: DC CVAU / IC IVAU with
 * the line sizes of CTR_EL0 on AArch64, __riscv_flush_icache on RISC-V), Deinitialize, Release, Write, Read, Lookup,
 * LookupMany, LoadLibrary, RegisterEhFrame, DeregisterEhFrame, RunInitializers,
 * RunFinalizers, RunMain (the program's output forwarded as Output messages, its input
 * taken from Input messages, exit() and fatal signals reported), Call, Input and
 * Shutdown, thread-local storage (every module's block in static TLS, and an
 * __tls_get_addr of its own that finds them), exports (ExportSymbols), and lazy functions:
 * an entry for call-through stubs on each architecture (__kiln_lazy_entry), ResolveStub
 * sent for any thread while a request's code runs, StoreCodePointer and OldestCodeGuard
 * (hot swap, with a guard per request's run of code). The code of RunMain, Call,
 * RunInitializers and RunFinalizers runs off the thread that reads the connection, which
 * goes on serving the controller meanwhile. Stdio adoption and debug outputs are answered
 * with an Error naming the request.
 *
 * Code memory is dual-mapped, as Kiln's own executor does it: a memfd mapped twice, the
 * target view with the final permission of each page (never writable and executable) and
 * a writable working view that Write requests go to.
 *
 * The message tags and the fields' encoding are in wire.h, shared with the Windows
 * executor (kiln_executor_win.c).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wire.h"

#define MAX_RESERVATIONS 1024
#define MAX_LIBRARIES 256

#if defined(__aarch64__)
#define TRIPLE "aarch64-unknown-linux-gnu"
#elif defined(__x86_64__)
#define TRIPLE "x86_64-unknown-linux-gnu"
#elif defined(__riscv) && __riscv_xlen == 64
#define TRIPLE "riscv64-unknown-linux-gnu"
#include <sys/cachectl.h>
#else
#error "kiln-executor-c knows the triples of AArch64, x86-64 and RISC-V 64"
#endif

/* ---- the connection ------------------------------------------------------------------ */

static int sock = -1;
static pthread_mutex_t send_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = 2; /* the executor's own stderr, kept when the program's is a pipe */

static void logf_(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    /* A log whose reader is gone must not end the executor: SIGPIPE is held back for
     * this write (and a pending one taken), the program's own disposition untouched. */
    sigset_t pipe_only, before;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &before);
    ssize_t written = write(log_fd, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    if (written < 0 && errno == EPIPE) {
        struct timespec now = {0, 0};
        sigtimedwait(&pipe_only, NULL, &now);
    }
    pthread_sigmask(SIG_SETMASK, &before, NULL);
}

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Non-zero while a frame is being written (a crash report waits for it). */
static atomic_int sending;

/* Sends one frame, in one write: `body` starts with the tag. */
static void send_frame(uint32_t id, const struct writer *body) {
    uint32_t len = (uint32_t)body->len + 4;
    uint8_t *frame = malloc(body->len + 8);
    if (!frame) _exit(70);
    for (int i = 0; i < 4; i++) frame[i] = (uint8_t)(len >> (8 * i));
    for (int i = 0; i < 4; i++) frame[4 + i] = (uint8_t)(id >> (8 * i));
    memcpy(frame + 8, body->p, body->len);
    pthread_mutex_lock(&send_lock);
    atomic_store(&sending, 1);
    int failed = write_all(sock, frame, body->len + 8) != 0;
    atomic_store(&sending, 0);
    pthread_mutex_unlock(&send_lock);
    free(frame);
    if (failed) _exit(0); /* the controller is gone */
}

static void reply_error(uint32_t id, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct writer w = {0};
    wr_u8(&w, A_ERROR);
    wr_string(&w, msg);
    send_frame(id, &w);
    free(w.p);
}

/* ---- memory -------------------------------------------------------------------------- */

struct reservation {
    int used;
    uint64_t target, len;
    uint8_t *working;
    int fd;
    /* Per page: 0 unprepared, else 1 + the permission it was prepared with (0 RX, 1 R,
     * 2 RW), so that nothing is run, read or flushed on a page that is not ready; with
     * GUARDED set on a page of code mapped PROT_BTI. */
    uint8_t *pages;
};

#define GUARDED 0x80
#ifndef PROT_BTI
#define PROT_BTI 0x10
#endif

static struct reservation reservations[MAX_RESERVATIONS];
static long page_size;
static int tracing; /* KILN_EXECUTOR_TRACE=1: requests logged to stderr */

#include "requests.h"

/* Whether every page of [addr, addr + len) is prepared, with `permission` (0 RX, 1 R,
 * 2 RW) or, for -1, with any readable one. */
static int prepared(uint64_t addr, uint64_t len, int permission) {
    struct reservation *r = holding(addr, len ? len : 1);
    if (!r) return 0;
    uint64_t first = (addr - r->target) / (uint64_t)page_size;
    uint64_t last = (addr + (len ? len : 1) - 1 - r->target) / (uint64_t)page_size;
    for (uint64_t p = first; p <= last; p++) {
        uint8_t state = r->pages[p] & ~GUARDED;
        if (state == 0) return 0;
        if (permission >= 0 && state != permission + 1) return 0;
    }
    return 1;
}

static int prot_of(uint8_t permission) {
    switch (permission) {
    case 0: return PROT_READ | PROT_EXEC;
    case 1: return PROT_READ;
    case 2: return PROT_READ | PROT_WRITE;
    default: return -1;
    }
}

/* Makes the instruction cache coherent with the data cache for [start, end). */
static void sync_icache(uintptr_t start, uintptr_t end) {
#if defined(__aarch64__)
    uint64_t ctr;
    __asm__ volatile("mrs %0, ctr_el0" : "=r"(ctr));
    uintptr_t dline = (uintptr_t)4 << ((ctr >> 16) & 0xf);
    uintptr_t iline = (uintptr_t)4 << (ctr & 0xf);
    for (uintptr_t a = start & ~(dline - 1); a < end; a += dline)
        __asm__ volatile("dc cvau, %0" ::"r"(a) : "memory");
    __asm__ volatile("dsb ish" ::: "memory");
    for (uintptr_t a = start & ~(iline - 1); a < end; a += iline)
        __asm__ volatile("ic ivau, %0" ::"r"(a) : "memory");
    __asm__ volatile("dsb ish\n\tisb" ::: "memory");
#elif defined(__riscv)
    /* glibc's wrapper of the riscv_flush_icache system call: every hart that runs a
       thread of this process fences its instruction fetches (flags 0: all threads). */
    __riscv_flush_icache((void *)start, (void *)end, 0);
#else
    __builtin___clear_cache((char *)start, (char *)end);
#endif
}

/* An address in the C library, which code placed "near the libraries" must reach. */
static uint64_t library_anchor(void) {
    return (uint64_t)(uintptr_t)dlsym(RTLD_DEFAULT, "printf");
}

/* Maps `len` bytes of `fd` inaccessible, where `lo <= start` and `start + len <= hi`. */
static void *map_target(int fd, uint64_t len, uint64_t lo, uint64_t hi) {
    if (lo == 0 && hi == UINT64_MAX) {
        void *p = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    /* Hints spread over the window, nearest the window's middle first. */
    uint64_t mid = lo / 2 + hi / 2;
    for (int k = 0; k < 128; k++) {
        int64_t step = (int64_t)((k + 1) / 2) * (int64_t)(16 << 20) * (k % 2 ? 1 : -1);
        uint64_t hint = (mid + (uint64_t)step) & ~(uint64_t)(page_size - 1);
        if (hint < lo || hint + len > hi || hint < (uint64_t)page_size) continue;
        void *p = mmap((void *)(uintptr_t)hint, len, PROT_NONE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
        if (p == MAP_FAILED) {
            p = mmap((void *)(uintptr_t)hint, len, PROT_NONE, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) continue;
        }
        uint64_t at = (uint64_t)(uintptr_t)p;
        if (at >= lo && at + len <= hi) return p;
        munmap(p, len);
    }
    return NULL;
}

static void do_reserve(uint32_t id, struct reader *r) {
    uint64_t len = rd_u64(r, "len");
    uint8_t placement = rd_u8(r, "placement");
    uint64_t a = rd_u64(r, "a"), b = rd_u64(r, "b");
    uint8_t share = rd_u8(r, "share");
    if (r->bad || r->left) return reply_error(id, "malformed Reserve: %s", r->bad ? r->bad : "trailing bytes");
    if (share) return reply_error(id, "shared memory needs a Unix socket to pass its descriptor: use the copy transport");
    if (len == 0 || len % (uint64_t)page_size || len > ((uint64_t)1 << 40))
        return reply_error(id, "cannot reserve %#llx bytes", (unsigned long long)len);
    const uint64_t reach = ((uint64_t)1 << 31) - ((uint64_t)1 << 20);
    uint64_t lo = 0, hi = UINT64_MAX;
    switch (placement) {
    case 0: break;
    case 1: {
        uint64_t anchor = library_anchor();
        lo = anchor > reach ? anchor - reach : 0;
        hi = anchor + reach;
        break;
    }
    case 2:
        if (a > b) return reply_error(id, "placement near %#llx..%#llx: the range is reversed", (unsigned long long)a, (unsigned long long)b);
        lo = b > reach ? b - reach : 0;
        hi = a + reach;
        break;
    case 3: lo = 1 << 20; hi = (uint64_t)1 << 31; break;
    default: return reply_error(id, "unknown placement %u", placement);
    }
    int slot = -1;
    for (int i = 0; i < MAX_RESERVATIONS; i++)
        if (!reservations[i].used) { slot = i; break; }
    if (slot < 0) return reply_error(id, "too many reservations (%d)", MAX_RESERVATIONS);
    int fd = memfd_create("kiln-code", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return reply_error(id, "memfd of %#llx bytes: %s", (unsigned long long)len, strerror(e));
    }
    void *target = map_target(fd, len, lo, hi);
    if (!target) {
        close(fd);
        return reply_error(id, "no free address range of %#llx bytes satisfies placement %u", (unsigned long long)len, placement);
    }
    void *working = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (working == MAP_FAILED) {
        int e = errno;
        munmap(target, len);
        close(fd);
        return reply_error(id, "working view: %s", strerror(e));
    }
    uint8_t *page_map = calloc((size_t)(len / (uint64_t)page_size), 1);
    if (!page_map) {
        munmap(target, len);
        munmap(working, len);
        close(fd);
        return reply_error(id, "out of memory for the page map of %#llx bytes", (unsigned long long)len);
    }
    reservations[slot] = (struct reservation){1, (uint64_t)(uintptr_t)target, len, working, fd, page_map};
    if (tracing) logf_("kiln-executor-c: reserved %#llx bytes at %p (placement %u, window %#llx..%#llx)\n", (unsigned long long)len, target, placement, (unsigned long long)lo, (unsigned long long)hi);
    struct writer w = {0};
    wr_u8(&w, A_RESERVED);
    wr_u64(&w, (uint64_t)(uintptr_t)target);
    wr_u64(&w, (uint64_t)slot + 1);
    send_frame(id, &w);
    free(w.p);
}

/* Checks a page range of a reservation; NULL (after answering) if it is not one. */
static struct reservation *pages(uint32_t id, uint64_t handle, uint64_t start, uint64_t end) {
    struct reservation *res = reservation(handle);
    if (!res) return reply_error(id, "no reservation with handle %llu", (unsigned long long)handle), NULL;
    if (start % (uint64_t)page_size || end % (uint64_t)page_size || start >= end || !inside(res, start, end - start)) {
        reply_error(id, "%#llx..%#llx is not a page range of reservation %llu", (unsigned long long)start, (unsigned long long)end, (unsigned long long)handle);
        return NULL;
    }
    return res;
}

static void do_prepare(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle"), start = rd_u64(r, "start"), end = rd_u64(r, "end");
    uint8_t permission = rd_u8(r, "permission");
    if (r->bad || r->left) return reply_error(id, "malformed Prepare: %s", r->bad ? r->bad : "trailing bytes");
    int prot = prot_of(permission);
    if (prot < 0) return reply_error(id, "unknown permission %u", permission);
    struct reservation *res = pages(id, handle, start, end);
    if (!res) return;
    /* The target view gets its final permission now; writes go to the working view. */
    if (mprotect((void *)(uintptr_t)start, end - start, prot) != 0)
        return reply_error(id, "mprotect: %s", strerror(errno));
    memset(res->pages + (start - res->target) / (uint64_t)page_size, permission + 1, (end - start) / (uint64_t)page_size);
    reply_simple(id, A_OK);
}

/* Maps the pages of code [addr, addr + len) again, over themselves: the same memfd pages,
 * the same permission (PROT_BTI where guarded), in one atomic mmap that threads running
 * there do not notice. An emulator that translates code (qemu-user) sees no write through
 * the working view, and no instruction-cache maintenance: a new mapping is what makes it
 * drop the translations of code that was on these pages before (a module removed, a body
 * replaced by hot swap, and new code placed there since). */
static int remap_code(struct reservation *res, uint64_t addr, uint64_t len) {
    uint64_t ps = (uint64_t)page_size;
    uint64_t first = (addr - res->target) / ps, end = (addr + len - res->target + ps - 1) / ps;
    for (uint64_t p = first; p < end;) {
        uint8_t guarded = res->pages[p] & GUARDED;
        uint64_t q = p + 1;
        while (q < end && (res->pages[q] & GUARDED) == guarded) q++;
        int prot = PROT_READ | PROT_EXEC;
#if defined(__aarch64__)
        if (guarded) prot |= PROT_BTI;
#endif
        void *at = (void *)(uintptr_t)(res->target + p * ps);
        if (mmap(at, (q - p) * ps, prot, MAP_SHARED | MAP_FIXED, res->fd, (off_t)(p * ps)) == MAP_FAILED) return 0;
        p = q;
    }
    return 1;
}

static void do_initialize(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle");
    uint32_t n = rd_count(r, 17, "segments");
    struct reservation *res = reservation(handle);
    uint64_t (*segs)[3] = calloc(n ? n : 1, sizeof *segs);
    if (!segs) return reply_error(id, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        segs[i][0] = rd_u64(r, "target");
        segs[i][1] = rd_u64(r, "len");
        segs[i][2] = rd_u8(r, "permission");
    }
    if (r->bad || r->left) {
        free(segs);
        return reply_error(id, "malformed Initialize: %s", r->bad ? r->bad : "trailing bytes");
    }
    if (!res) {
        free(segs);
        return reply_error(id, "no reservation with handle %llu", (unsigned long long)handle);
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!inside(res, segs[i][0], segs[i][1]) || prot_of((uint8_t)segs[i][2]) < 0) {
            free(segs);
            return reply_error(id, "segment %#llx+%#llx is not in reservation %llu", (unsigned long long)segs[i][0], (unsigned long long)segs[i][1], (unsigned long long)handle);
        }
        if (segs[i][1] > 0 && !prepared(segs[i][0], segs[i][1], (int)segs[i][2])) {
            unsigned long long at = segs[i][0], n = segs[i][1];
            unsigned p = (unsigned)segs[i][2];
            free(segs);
            return reply_error(id, "segment %#llx+%#llx is not on pages prepared with permission %u", at, n, p);
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        if (segs[i][2] != 0 || segs[i][1] == 0) continue;
        if (!remap_code(res, segs[i][0], segs[i][1])) {
            unsigned long long at = segs[i][0], len = segs[i][1];
            free(segs);
            return reply_error(id, "mapping code %#llx+%#llx again: %s", at, len, strerror(errno));
        }
        sync_icache((uintptr_t)segs[i][0], (uintptr_t)(segs[i][0] + segs[i][1]));
    }
    free(segs);
    reply_simple(id, A_OK);
}

/* GuardBranchTargets: whole pages of read-execute code built for BTI are mapped guarded
 * (PROT_BTI): an indirect branch to anything but a landing pad traps with SIGILL. */
static void do_guard_branch_targets(uint32_t id, struct reader *r) {
    uint64_t addr = rd_u64(r, "address"), len = rd_u64(r, "length");
    if (r->bad || r->left) return reply_error(id, "malformed GuardBranchTargets: %s", r->bad ? r->bad : "trailing bytes");
    if (len == 0 || addr % (uint64_t)page_size || len % (uint64_t)page_size)
        return reply_error(id, "guard branch targets: %#llx+%#llx is not whole pages", (unsigned long long)addr, (unsigned long long)len);
    if (!prepared(addr, len, 0))
        return reply_error(id, "guard branch targets: %#llx+%#llx is not code this executor prepared", (unsigned long long)addr, (unsigned long long)len);
#if defined(__aarch64__)
    if (mprotect((void *)(uintptr_t)addr, len, PROT_READ | PROT_EXEC | PROT_BTI) != 0)
        return reply_error(id, "guard branch targets: mprotect: %s", strerror(errno));
    struct reservation *res = holding(addr, len);
    for (uint64_t p = (addr - res->target) / (uint64_t)page_size; p < (addr + len - res->target) / (uint64_t)page_size; p++)
        res->pages[p] |= GUARDED;
#endif
    reply_simple(id, A_OK);
}

static void do_deinitialize(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle"), start = rd_u64(r, "start"), end = rd_u64(r, "end");
    if (r->bad || r->left) return reply_error(id, "malformed Deinitialize: %s", r->bad ? r->bad : "trailing bytes");
    struct reservation *res = pages(id, handle, start, end);
    if (!res) return;
    mprotect((void *)(uintptr_t)start, end - start, PROT_NONE);
    memset(res->pages + (start - res->target) / (uint64_t)page_size, 0, (end - start) / (uint64_t)page_size);
    /* The pages' contents are discarded: they read as zeros when prepared again. */
    if (fallocate(res->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(start - res->target), (off_t)(end - start)) != 0)
        memset(res->working + (start - res->target), 0, end - start);
    reply_simple(id, A_OK);
}

static void do_release(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle");
    if (r->bad || r->left) return reply_error(id, "malformed Release: %s", r->bad ? r->bad : "trailing bytes");
    struct reservation *res = reservation(handle);
    if (!res) return reply_error(id, "no reservation with handle %llu", (unsigned long long)handle);
    munmap((void *)(uintptr_t)res->target, res->len);
    munmap(res->working, res->len);
    close(res->fd);
    free(res->pages);
    memset(res, 0, sizeof *res);
    reply_simple(id, A_OK);
}

/* ---- symbols ------------------------------------------------------------------------- */

static void *libraries[MAX_LIBRARIES];
static char *library_paths[MAX_LIBRARIES];
static int library_count;

static int library(uint64_t id, void **handle) {
    if (id == 0) { *handle = RTLD_DEFAULT; return 1; }
    if (id > (uint64_t)library_count) return 0;
    *handle = libraries[id - 1];
    return 1;
}

/* (address, kind: 0 unknown, 1 function, 2 data) of `name`. */
static void lookup(void *handle, const char *name, uint64_t *address, uint8_t *kind) {
    void *p = dlsym(handle, name);
    *address = (uint64_t)(uintptr_t)p;
    *kind = 0;
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (p && dladdr1(p, &info, (void **)&sym, RTLD_DL_SYMENT) && sym) {
        int type = ELF64_ST_TYPE(sym->st_info);
        *kind = (type == STT_FUNC || type == STT_GNU_IFUNC) ? 1 : (type == STT_OBJECT || type == STT_TLS) ? 2 : 0;
    }
}

static void do_lookup(uint32_t id, struct reader *r) {
    uint64_t lib = rd_u64(r, "library");
    char *name = rd_string(r, "name");
    void *handle;
    if (r->bad || r->left) {
        free(name);
        return reply_error(id, "malformed Lookup: %s", r->bad ? r->bad : "trailing bytes");
    }
    if (!library(lib, &handle)) {
        free(name);
        return reply_error(id, "no library with handle %llu", (unsigned long long)lib);
    }
    uint64_t address;
    uint8_t kind;
    lookup(handle, name, &address, &kind);
    free(name);
    struct writer w = {0};
    wr_u8(&w, A_SYMBOL);
    wr_u64(&w, address);
    wr_u8(&w, kind);
    send_frame(id, &w);
    free(w.p);
}

static void do_lookup_many(uint32_t id, struct reader *r) {
    uint64_t lib = rd_u64(r, "library");
    uint32_t n = rd_count(r, 4, "names");
    void *handle = RTLD_DEFAULT;
    if (!r->bad && !library(lib, &handle)) return reply_error(id, "no library with handle %llu", (unsigned long long)lib);
    struct writer w = {0};
    wr_u8(&w, A_SYMBOLS);
    wr_u32(&w, n);
    for (uint32_t i = 0; i < n && !r->bad; i++) {
        char *name = rd_string(r, "name");
        uint64_t address = 0;
        uint8_t kind = 0;
        if (name) lookup(handle, name, &address, &kind);
        free(name);
        wr_u64(&w, address);
        wr_u8(&w, kind);
    }
    if (r->bad || r->left) reply_error(id, "malformed LookupMany: %s", r->bad ? r->bad : "trailing bytes");
    else send_frame(id, &w);
    free(w.p);
}

static void do_load_library(uint32_t id, struct reader *r) {
    char *path = rd_string(r, "path");
    if (r->bad || r->left) {
        free(path);
        return reply_error(id, "malformed LoadLibrary: %s", r->bad ? r->bad : "trailing bytes");
    }
    for (int i = 0; i < library_count; i++)
        if (strcmp(library_paths[i], path) == 0) {
            free(path);
            return reply_value(id, (uint64_t)i + 1);
        }
    if (library_count == MAX_LIBRARIES) {
        free(path);
        return reply_error(id, "too many libraries");
    }
    void *handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
        reply_error(id, "dlopen %s: %s", path, dlerror());
        free(path);
        return;
    }
    libraries[library_count] = handle;
    library_paths[library_count] = path;
    reply_value(id, (uint64_t)++library_count);
}

/* ---- small shared objects: exports and static TLS -------------------------------------
 *
 * What the C runtime's loader does for libraries it loads, it does for JIT modules when
 * they come as a shared object it loads: an object made here in memory (a memfd) and
 * opened with dlopen, which holds
 * - exported definitions: absolute dynamic symbols (SHN_ABS, which glibc 2.28 and later
 *   does not relocate) at the module's addresses, opened RTLD_GLOBAL, so that libraries
 *   loaded later find them as they find a native executable's -Wl,-E exports;
 * - a static TLS block: a PT_TLS segment of the module's size, alignment and initial
 *   image, DF_STATIC_TLS, and one TPOFF dynamic relocation against it, whose relocated
 *   word is then the block's offset from the thread pointer. glibc places such a block in
 *   its static TLS surplus and copies the image into every thread, existing and future.
 * Only program headers (no sections): the loader reads nothing else. PT_GNU_STACK keeps
 * thread stacks non-executable (without it, glibc would make them executable). */

#if defined(__aarch64__)
#define SO_MACHINE EM_AARCH64
#define SO_TPOFF R_AARCH64_TLS_TPREL
#elif defined(__x86_64__)
#define SO_MACHINE EM_X86_64
#define SO_TPOFF R_X86_64_TPOFF64
#else
#define SO_MACHINE EM_RISCV
#define SO_TPOFF R_RISCV_TLS_TPREL64
#endif

struct so_symbol {
    char *name;
    uint64_t address, size;
    uint8_t function;
};

static uint64_t align_up(uint64_t v, uint64_t a) { return a > 1 ? (v + a - 1) / a * a : v; }

/* Builds the object in a memfd and opens it; NULL with the reason in `why`. With
 * `tls_size`, `*tp_offset` gets the block's offset from the thread pointer. The memfd
 * stays open as long as the object (`*fd_out`): the loader knows an object by its path,
 * and a later memfd given the same /proc/self/fd/N would be taken for this one. */
static void *open_shared_object(const struct so_symbol *symbols, uint32_t n, uint64_t tls_size,
                                uint64_t tls_align, const uint8_t *image, uint64_t image_len,
                                int64_t *tp_offset, int *fd_out, char *why, size_t why_len) {
    int tls = tls_size != 0;
    uint32_t nsyms = n + 1;
    uint64_t strsz = 1;
    for (uint32_t i = 0; i < n; i++) strsz += strlen(symbols[i].name) + 1;
    int phnum = tls ? 4 : 3;
    uint64_t off_hash = sizeof(Elf64_Ehdr) + (uint64_t)phnum * sizeof(Elf64_Phdr);
    uint64_t off_sym = align_up(off_hash + 4 * (2 + 1 + (uint64_t)nsyms), 8);
    uint64_t off_str = off_sym + (uint64_t)nsyms * sizeof(Elf64_Sym);
    uint64_t off_rela = align_up(off_str + strsz, 8);
    uint64_t off_dyn = off_rela + (tls ? sizeof(Elf64_Rela) : 0);
    int ndyn = tls ? 10 : 6;
    uint64_t off_word = off_dyn + (uint64_t)ndyn * sizeof(Elf64_Dyn);
    if (tls_align == 0) tls_align = 1;
    uint64_t off_tls = align_up(off_word + 8, tls_align);
    uint64_t file_size = off_tls + (tls ? image_len : 0);
    uint8_t *f = calloc(1, file_size);
    if (!f) { snprintf(why, why_len, "out of memory for a %llu-byte object", (unsigned long long)file_size); return NULL; }
    Elf64_Ehdr *eh = (Elf64_Ehdr *)f;
    memcpy(eh->e_ident, ELFMAG, SELFMAG);
    eh->e_ident[EI_CLASS] = ELFCLASS64;
    eh->e_ident[EI_DATA] = ELFDATA2LSB;
    eh->e_ident[EI_VERSION] = EV_CURRENT;
    eh->e_type = ET_DYN;
    eh->e_machine = SO_MACHINE;
    eh->e_version = EV_CURRENT;
    eh->e_phoff = sizeof(Elf64_Ehdr);
    eh->e_ehsize = sizeof(Elf64_Ehdr);
    eh->e_phentsize = sizeof(Elf64_Phdr);
    eh->e_phnum = (uint16_t)phnum;
#if defined(__riscv)
    eh->e_flags = EF_RISCV_FLOAT_ABI_DOUBLE | EF_RISCV_RVC;
#endif
    Elf64_Phdr *ph = (Elf64_Phdr *)(f + sizeof(Elf64_Ehdr));
    uint64_t memsz = tls ? off_tls + image_len : file_size;
    ph[0] = (Elf64_Phdr){.p_type = PT_LOAD, .p_flags = PF_R | PF_W, .p_offset = 0, .p_vaddr = 0,
                         .p_paddr = 0, .p_filesz = file_size, .p_memsz = memsz, .p_align = (uint64_t)page_size};
    ph[1] = (Elf64_Phdr){.p_type = PT_DYNAMIC, .p_flags = PF_R | PF_W, .p_offset = off_dyn, .p_vaddr = off_dyn,
                         .p_paddr = off_dyn, .p_filesz = (uint64_t)ndyn * sizeof(Elf64_Dyn),
                         .p_memsz = (uint64_t)ndyn * sizeof(Elf64_Dyn), .p_align = 8};
    ph[2] = (Elf64_Phdr){.p_type = PT_GNU_STACK, .p_flags = PF_R | PF_W, .p_align = 16};
    if (tls)
        ph[3] = (Elf64_Phdr){.p_type = PT_TLS, .p_flags = PF_R, .p_offset = off_tls, .p_vaddr = off_tls,
                             .p_paddr = off_tls, .p_filesz = image_len, .p_memsz = tls_size, .p_align = tls_align};
    /* SysV hash: one bucket, the symbols chained from the last to the first. */
    uint32_t *hash = (uint32_t *)(f + off_hash);
    hash[0] = 1;
    hash[1] = nsyms;
    hash[2] = nsyms - 1;
    for (uint32_t i = 1; i < nsyms; i++) hash[3 + i] = i - 1;
    Elf64_Sym *sym = (Elf64_Sym *)(f + off_sym);
    char *str = (char *)(f + off_str);
    uint64_t at = 1;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = strlen(symbols[i].name);
        memcpy(str + at, symbols[i].name, len + 1);
        sym[i + 1].st_name = (uint32_t)at;
        sym[i + 1].st_info = ELF64_ST_INFO(STB_GLOBAL, symbols[i].function ? STT_FUNC : STT_OBJECT);
        sym[i + 1].st_other = STV_DEFAULT;
        sym[i + 1].st_shndx = SHN_ABS;
        sym[i + 1].st_value = symbols[i].address;
        sym[i + 1].st_size = symbols[i].size;
        at += len + 1;
    }
    if (tls) {
        Elf64_Rela *rela = (Elf64_Rela *)(f + off_rela);
        rela->r_offset = off_word;
        rela->r_info = ELF64_R_INFO(0, SO_TPOFF);
        rela->r_addend = 0;
        memcpy(f + off_tls, image, image_len);
    }
    Elf64_Dyn *dyn = (Elf64_Dyn *)(f + off_dyn);
    int d = 0;
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_HASH, .d_un.d_ptr = off_hash};
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_STRTAB, .d_un.d_ptr = off_str};
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_SYMTAB, .d_un.d_ptr = off_sym};
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_STRSZ, .d_un.d_val = strsz};
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_SYMENT, .d_un.d_val = sizeof(Elf64_Sym)};
    if (tls) {
        dyn[d++] = (Elf64_Dyn){.d_tag = DT_RELA, .d_un.d_ptr = off_rela};
        dyn[d++] = (Elf64_Dyn){.d_tag = DT_RELASZ, .d_un.d_val = sizeof(Elf64_Rela)};
        dyn[d++] = (Elf64_Dyn){.d_tag = DT_RELAENT, .d_un.d_val = sizeof(Elf64_Rela)};
        dyn[d++] = (Elf64_Dyn){.d_tag = DT_FLAGS, .d_un.d_val = DF_STATIC_TLS};
    }
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_NULL};
    int fd = memfd_create("kiln-module.so", MFD_CLOEXEC);
    ssize_t written = fd < 0 ? -1 : pwrite(fd, f, file_size, 0);
    if (written != (ssize_t)file_size) {
        snprintf(why, why_len, "memfd: %s", strerror(errno));
        if (fd >= 0) close(fd);
        free(f);
        return NULL;
    }
    free(f);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    void *handle = dlopen(path, RTLD_NOW | (n ? RTLD_GLOBAL : RTLD_LOCAL));
    if (!handle) {
        snprintf(why, why_len, "dlopen of the object made for it: %s", dlerror());
        close(fd);
        return NULL;
    }
    if (tls) {
        struct link_map *map = NULL;
        if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map) {
            snprintf(why, why_len, "dlinfo: %s", dlerror());
            dlclose(handle);
            close(fd);
            return NULL;
        }
        memcpy(tp_offset, (const void *)(map->l_addr + off_word), 8);
    }
    *fd_out = fd;
    return handle;
}

/* The loader places a block in static TLS only if its alignment is at most that of the
 * static TLS area, which is the largest of the TCB's and the executable's own PT_TLS's
 * (16 on AArch64): this thread-local, aligned like a cache line, raises it to 64 so that
 * over-aligned thread-locals of JIT code (aligned(64)) can be placed. */
static _Thread_local char static_tls_alignment[64] __attribute__((aligned(64), used));

/* TLS modules: ids from ReserveTlsModule, each block in static TLS once placed. */
#define TLS_MODULE_BASE 0x4b494c4e00000000ull
#define MAX_TLS_MODULES 4096
static struct tls_module {
    int placed, removed, fd;
    int64_t tp_offset;
    void *handle;
} tls_modules[MAX_TLS_MODULES];
static atomic_uint tls_module_count;

#if defined(__riscv)
/* glibc's TLS_DTV_OFFSET: what a GOT pair's offset is biased by on RISC-V. */
#define DTV_OFFSET 0x800
#else
#define DTV_OFFSET 0
#endif

/* JIT code's __tls_get_addr (the hello's runtime symbols): the address of the variable a
 * GOT pair (module id, offset) names in the calling thread. Every block is in static
 * TLS, at one offset from the thread pointer in every thread. */
static void *kiln_tls_get_addr(const uint64_t *pair) {
    uint64_t index = pair[0] - TLS_MODULE_BASE;
    if (index >= MAX_TLS_MODULES || index >= atomic_load(&tls_module_count) || !tls_modules[index].placed) {
        static const char message[] = "kiln-executor-c: __tls_get_addr of a module with no TLS block\n";
        (void)!write(log_fd, message, sizeof message - 1);
        abort();
    }
    return (char *)__builtin_thread_pointer() + tls_modules[index].tp_offset + pair[1] + DTV_OFFSET;
}

static void do_reserve_tls_module(uint32_t id, struct reader *r) {
    if (r->left) return reply_error(id, "malformed ReserveTlsModule: trailing bytes");
    /* Ids are given by the serving thread alone; the count never passes the table. */
    unsigned index = atomic_load(&tls_module_count);
    if (index >= MAX_TLS_MODULES) return reply_error(id, "ReserveTlsModule: more than %d TLS modules", MAX_TLS_MODULES);
    atomic_store(&tls_module_count, index + 1);
    reply_value(id, TLS_MODULE_BASE + index);
}

/* InstallTls and PlaceStaticTls: the block goes to static TLS either way (a dynamic block
 * is one this executor's __tls_get_addr also finds there). */
static void do_place_tls(uint32_t id, struct reader *r, int answer_offset) {
    const char *what = answer_offset ? "PlaceStaticTls" : "InstallTls";
    uint64_t module = rd_u64(r, "module_id"), size = rd_u64(r, "size"), align = rd_u64(r, "align");
    uint32_t image_len = 0;
    const uint8_t *image = rd_bytes(r, &image_len, "image");
    if (r->bad || r->left) return reply_error(id, "malformed %s: %s", what, r->bad ? r->bad : "trailing bytes");
    uint64_t index = module - TLS_MODULE_BASE;
    if (index >= atomic_load(&tls_module_count) || index >= MAX_TLS_MODULES)
        return reply_error(id, "%s: no TLS module %#llx (ReserveTlsModule gives them)", what, (unsigned long long)module);
    struct tls_module *m = &tls_modules[index];
    if (m->placed || m->removed)
        return reply_error(id, "%s: TLS module %#llx %s", what, (unsigned long long)module,
                           m->placed ? "already has its block" : "was removed (its id is not given again)");
    if (size == 0 || image_len > size || size > (1u << 28) || (align & (align - 1)) != 0)
        return reply_error(id, "%s: a block of %llu bytes (image %u, alignment %llu) is not one this executor places",
                           what, (unsigned long long)size, image_len, (unsigned long long)align);
    char why[256];
    m->handle = open_shared_object(NULL, 0, size, align, image, image_len, &m->tp_offset, &m->fd, why, sizeof why);
    if (!m->handle)
        return reply_error(id, "%s: a %llu-byte block in static TLS: %s (glibc's surplus is set by the tunable glibc.rtld.optional_static_tls)",
                           what, (unsigned long long)size, why);
    m->placed = 1;
    if (answer_offset) reply_value(id, (uint64_t)m->tp_offset);
    else reply_simple(id, A_OK);
}

static void do_remove_tls(uint32_t id, struct reader *r) {
    uint64_t module = rd_u64(r, "module_id");
    if (r->bad || r->left) return reply_error(id, "malformed RemoveTls: %s", r->bad ? r->bad : "trailing bytes");
    uint64_t index = module - TLS_MODULE_BASE;
    if (index >= atomic_load(&tls_module_count) || index >= MAX_TLS_MODULES)
        return reply_error(id, "RemoveTls: no TLS module %#llx", (unsigned long long)module);
    /* Static TLS is not given back by the loader: the block stays, unused. */
    tls_modules[index].placed = 0;
    tls_modules[index].removed = 1;
    reply_simple(id, A_OK);
}

#define MAX_EXPORTS 1024
static void *exports[MAX_EXPORTS];
static int export_fds[MAX_EXPORTS];
static int export_count;

static void do_export_symbols(uint32_t id, struct reader *r) {
    uint32_t n = rd_count(r, 4 + 8 + 8 + 1, "symbols");
    struct so_symbol *symbols = calloc(n ? n : 1, sizeof *symbols);
    if (!symbols) return reply_error(id, "ExportSymbols: out of memory for %u symbols", n);
    uint32_t got = 0;
    for (; got < n && !r->bad; got++) {
        symbols[got].name = rd_string(r, "name");
        symbols[got].address = rd_u64(r, "address");
        symbols[got].size = rd_u64(r, "size");
        symbols[got].function = rd_u8(r, "function");
        if (symbols[got].name && !symbols[got].name[0] && !r->bad) r->bad = "name (empty)";
    }
    char why[256];
    void *handle = NULL;
    if (r->bad || r->left)
        reply_error(id, "malformed ExportSymbols: %s", r->bad ? r->bad : "trailing bytes");
    else if (export_count == MAX_EXPORTS)
        reply_error(id, "ExportSymbols: more than %d exported sets", MAX_EXPORTS);
    else if (!(handle = open_shared_object(symbols, n, 0, 0, NULL, 0, NULL, &export_fds[export_count], why, sizeof why)))
        reply_error(id, "ExportSymbols: %s", why);
    else {
        exports[export_count] = handle;
        reply_value(id, (uint64_t)++export_count);
    }
    for (uint32_t i = 0; i < got; i++) free(symbols[i].name);
    free(symbols);
}

static void do_unexport_symbols(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle");
    if (r->bad || r->left) return reply_error(id, "malformed UnexportSymbols: %s", r->bad ? r->bad : "trailing bytes");
    if (handle == 0 || handle > (uint64_t)export_count || !exports[handle - 1])
        return reply_error(id, "UnexportSymbols: no exported set %llu", (unsigned long long)handle);
    /* The memfd stays open: the loader may keep the object (a library loaded later can
     * hold it), and its path must not name another object. */
    dlclose(exports[handle - 1]);
    exports[handle - 1] = NULL;
    reply_simple(id, A_OK);
}

/* SetEnvironment: the controller's environment (NAME=VALUE entries) replaces ours, and its
 * working directory (unless empty) becomes ours. Checked whole before anything changes. */
static void do_set_environment(uint32_t id, struct reader *r) {
    uint32_t n = rd_count(r, 4, "variables");
    char **vars = calloc(n + 1, sizeof *vars);
    if (!vars) return reply_error(id, "SetEnvironment: out of memory");
    uint32_t got = 0;
    for (; got < n; got++) {
        vars[got] = rd_string(r, "variable");
        if (!vars[got]) break;
        char *eq = strchr(vars[got], '=');
        if (!eq || eq == vars[got]) {
            reply_error(id, "environment entry '%s' is not NAME=VALUE", vars[got]);
            goto done;
        }
    }
    char *dir = r->bad ? NULL : rd_string(r, "directory");
    if (r->bad || r->left) {
        reply_error(id, "malformed SetEnvironment: %s", r->bad ? r->bad : "trailing bytes");
        free(dir);
        goto done;
    }
    if (dir[0] && chdir(dir) != 0) {
        reply_error(id, "cannot enter the working directory %s: %s", dir, strerror(errno));
        free(dir);
        goto done;
    }
    free(dir);
    clearenv();
    for (uint32_t i = 0; i < n; i++) {
        char *eq = strchr(vars[i], '=');
        *eq = 0;
        if (setenv(vars[i], eq + 1, 1) != 0) {
            reply_error(id, "cannot set %s: %s", vars[i], strerror(errno));
            goto done;
        }
    }
    reply_simple(id, A_OK);
done:
    for (uint32_t i = 0; i < n; i++) free(vars[i]);
    free(vars);
}

/* ---- running code -------------------------------------------------------------------- */

static char *empty_argv[] = {"kiln", NULL};
extern char **environ;

static void do_eh_frame(uint32_t id, struct reader *r, int reg) {
    uint64_t address = rd_u64(r, "address");
    if (r->bad || r->left) return reply_error(id, "malformed eh_frame request: %s", r->bad ? r->bad : "trailing bytes");
    if (!prepared(address, 4, -1)) return reply_error(id, "eh_frame at %#llx is not in prepared memory", (unsigned long long)address);
    const char *name = reg ? "__register_frame" : "__deregister_frame";
    void (*fn)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, name);
    if (!fn) {
        /* The unwinder of C++ and of -fexceptions code: libgcc_s, loaded on first use. */
        void *libgcc = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (libgcc) fn = (void (*)(void *))dlsym(libgcc, name);
    }
    if (!fn) return reply_error(id, "this process has no unwinder to register with (libgcc_s)");
    fn((void *)(uintptr_t)address);
    reply_simple(id, A_OK);
}

/* The program's standard streams: pipes whose other ends the forwarder reads. */
static int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, in_pipe[2] = {-1, -1};
/* Requests whose JIT code runs (a program's exit() is reported while one does). */
static atomic_int running_code;
static atomic_int forwarding_busy;
static pid_t executor_pid;

static void *forward_output(void *unused) {
    (void)unused;
    uint8_t buf[65536];
    for (;;) {
        struct pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return NULL;
        }
        for (int i = 0; i < 2; i++) {
            if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
            atomic_store(&forwarding_busy, 1);
            ssize_t k = read(fds[i].fd, buf, sizeof buf);
            if (k > 0) {
                struct writer w = {0};
                wr_u8(&w, A_OUTPUT);
                wr_u8(&w, (uint8_t)(i + 1));
                wr_bytes(&w, buf, (uint32_t)k);
                send_frame(0, &w);
                free(w.p);
            }
            atomic_store(&forwarding_busy, 0);
        }
    }
}

static int pending(int fd) {
    int n = 0;
    return ioctl(fd, FIONREAD, &n) == 0 ? n : 0;
}

/* Waits until everything the program wrote has been sent. */
static void drain_output(void) {
    fflush(NULL);
    for (int spins = 0; spins < 5000; spins++) {
        if (!pending(out_pipe[0]) && !pending(err_pipe[0]) && !atomic_load(&forwarding_busy)) return;
        usleep(200);
    }
}

static void setup_stdio(void) {
    if (out_pipe[0] >= 0) return;
    log_fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
    /* Close-on-exec: a program's children must not hold the other ends (a child holding
     * stdin's write end would never see end of input). dup2 onto 0-2 clears the flag. */
    if (pipe2(out_pipe, O_CLOEXEC) || pipe2(err_pipe, O_CLOEXEC) || pipe2(in_pipe, O_CLOEXEC)) {
        logf_("kiln-executor-c: pipes: %s\n", strerror(errno));
        _exit(71);
    }
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    dup2(in_pipe[0], 0);
    /* Input is queued when the program does not read it: the serving thread never blocks. */
    fcntl(in_pipe[1], F_SETFL, fcntl(in_pipe[1], F_GETFL) | O_NONBLOCK);
    pthread_t t;
    pthread_create(&t, NULL, forward_output, NULL);
    pthread_detach(t);
}

/* A frame `len, id 0, tag, u32 value`, built and sent without allocating. */
static void report(uint8_t tag, uint32_t value) {
    uint8_t frame[13] = {9, 0, 0, 0, 0, 0, 0, 0, tag};
    for (int i = 0; i < 4; i++) frame[9 + i] = (uint8_t)(value >> (8 * i));
    (void)write_all(sock, frame, sizeof frame);
}

static void on_fatal_signal(int signal) {
    /* What the program wrote before it died goes out first: the forwarder thread runs on
     * while this handler waits (a second at most) for the pipes to empty. Only
     * async-signal-safe calls here: ioctl, nanosleep, write. */
    struct timespec tick = {0, 1000000};
    for (int i = 0; i < 1000 && out_pipe[0] >= 0; i++) {
        if (!pending(out_pipe[0]) && !pending(err_pipe[0]) && !atomic_load(&forwarding_busy)) break;
        nanosleep(&tick, NULL);
    }
    if (getpid() == executor_pid) {
        /* Frames are sent whole under send_lock; a frame half sent by another thread
         * would be cut by this one, so wait (bounded) for it to finish. */
        for (int i = 0; i < 1000 && atomic_load(&sending); i++) nanosleep(&tick, NULL);
        report(A_CRASHED, (uint32_t)signal);
        shutdown(sock, SHUT_WR);
    }
    raise(signal); /* SA_RESETHAND restored the default action */
}

static void on_program_exit(int status, void *unused) {
    (void)unused;
    if (getpid() != executor_pid || atomic_load(&running_code) == 0) return;
    drain_output();
    pthread_mutex_lock(&send_lock);
    report(A_EXITED, (uint32_t)status);
    shutdown(sock, SHUT_WR);
}

/* Input the program has not taken yet, and whether its end has come. */
static struct writer input_queue;
static size_t input_sent;
static int input_ended;

/* Moves queued input into the stdin pipe as far as it takes it without blocking; closes
 * the pipe after the end of input. */
static void flush_input(void) {
    while (in_pipe[1] >= 0 && input_sent < input_queue.len) {
        ssize_t k = write(in_pipe[1], input_queue.p + input_sent, input_queue.len - input_sent);
        if (k <= 0) break;
        input_sent += (size_t)k;
    }
    if (input_sent == input_queue.len) input_queue.len = input_sent = 0;
    if (input_ended && input_queue.len == 0 && in_pipe[1] >= 0) {
        close(in_pipe[1]);
        in_pipe[1] = -1;
    }
}

static void give_input(struct reader *r) {
    uint32_t len;
    const uint8_t *bytes = rd_bytes(r, &len, "bytes");
    if (r->bad || in_pipe[1] < 0 || input_ended) return;
    if (len == 0) input_ended = 1;
    else wr_raw(&input_queue, bytes, len);
    flush_input();
}

static int read_frame(uint8_t **body, uint32_t *len);

/* ---- code guards ---------------------------------------------------------------------- */

/* Each request's run of JIT code holds a guard of the epoch current when it started; a
 * store of a stub's slot (StoreCodePointer) advances the epoch and answers the epoch the
 * replaced body was retired at; the controller frees a body once the oldest guard held
 * (OldestCodeGuard) is later. As Kiln's own executor does (kiln_executor::code_guards). */
static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t guard_epoch = 1;
static uint64_t *guards_held;
static size_t guards_n, guards_cap;

static uint64_t guard_pin(void) {
    pthread_mutex_lock(&guard_lock);
    if (guards_n == guards_cap) {
        size_t cap = guards_cap ? 2 * guards_cap : 64;
        uint64_t *held = realloc(guards_held, cap * sizeof *held);
        if (!held) _exit(70); /* a guard not kept could let a running body be freed */
        guards_held = held;
        guards_cap = cap;
    }
    uint64_t epoch = guard_epoch;
    guards_held[guards_n++] = epoch;
    pthread_mutex_unlock(&guard_lock);
    return epoch;
}

static void guard_unpin(uint64_t epoch) {
    pthread_mutex_lock(&guard_lock);
    for (size_t i = 0; i < guards_n; i++)
        if (guards_held[i] == epoch) {
            guards_held[i] = guards_held[--guards_n];
            break;
        }
    pthread_mutex_unlock(&guard_lock);
}

static uint64_t guard_advance(void) {
    pthread_mutex_lock(&guard_lock);
    uint64_t retired = guard_epoch++;
    pthread_mutex_unlock(&guard_lock);
    return retired;
}

static uint64_t guard_oldest(void) {
    pthread_mutex_lock(&guard_lock);
    uint64_t oldest = guard_epoch;
    for (size_t i = 0; i < guards_n; i++)
        if (guards_held[i] < oldest) oldest = guards_held[i];
    pthread_mutex_unlock(&guard_lock);
    return oldest;
}

/* ---- running JIT code off the reading thread ------------------------------------------- */

/* The code of RunMain, Call, RunInitializers and RunFinalizers runs on a thread other than
 * the one that reads the connection: the code thread when it is idle, else a thread of its
 * own (8 MiB of stack each). The reading thread goes on serving the controller (the links
 * of lazy functions' bodies among its requests), and each request's code sends its own
 * answer when it returns. */
struct code_job {
    uint32_t id;
    uint8_t tag;
    uint64_t address;   /* Call, RunMain */
    uint64_t args[6];   /* Call */
    uint64_t *list;     /* RunInitializers, RunFinalizers */
    uint32_t n;
    uint64_t dso;       /* RunFinalizers */
    char **argv;        /* RunMain */
    int argc;
};

static pthread_mutex_t jobs_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jobs_ready = PTHREAD_COND_INITIALIZER;
static struct code_job *code_thread_job;
static int code_thread_state; /* 0 not started, 1 idle, 2 busy */
static atomic_int main_running;

#include "code_requests.h"
static pthread_t reading_thread;

typedef uint64_t (*call6)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

/* Runs the job's code; its value (the call's, main's status). */
static uint64_t run_code(struct code_job *job) {
    uint64_t value = 0;
    switch (job->tag) {
    case T_CALL: {
        const uint64_t *a = job->args;
        value = ((call6)(uintptr_t)job->address)(a[0], a[1], a[2], a[3], a[4], a[5]);
        break;
    }
    case T_RUN_INITIALIZERS:
        for (uint32_t i = 0; i < job->n; i++)
            ((void (*)(int, char **, char **))(uintptr_t)job->list[i])(1, empty_argv, environ);
        break;
    case T_RUN_FINALIZERS: {
        void (*finalize)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "__cxa_finalize");
        if (finalize && job->dso) finalize((void *)(uintptr_t)job->dso);
        for (uint32_t i = 0; i < job->n; i++) ((void (*)(void))(uintptr_t)job->list[i])();
        break;
    }
    case T_RUN_MAIN:
        value = (uint32_t)((int (*)(int, char **, char **))(uintptr_t)job->address)(job->argc, job->argv, environ);
        break;
    }
    /* What the code wrote is sent before its answer (stdout is a pipe: fully buffered). */
    fflush(NULL);
    return value;
}

static void run_job(struct code_job *job) {
    uint64_t guard = guard_pin();
    uint64_t value = run_code(job);
    guard_unpin(guard);
    finish_job(job, value);
}

/* Crash reports run on a stack of their own in code threads too (sigaltstack is per
 * thread), so a stack overflow reports. */
static void *own_alt_stack(void) {
    void *stack = malloc(64 * 1024);
    if (stack) {
        stack_t ss = {.ss_sp = stack, .ss_size = 64 * 1024};
        sigaltstack(&ss, NULL);
    }
    return stack;
}

static void *code_thread(void *unused) {
    (void)unused;
    own_alt_stack();
    pthread_mutex_lock(&jobs_lock);
    for (;;) {
        while (!code_thread_job) pthread_cond_wait(&jobs_ready, &jobs_lock);
        struct code_job *job = code_thread_job;
        code_thread_job = NULL;
        pthread_mutex_unlock(&jobs_lock);
        run_job(job);
        pthread_mutex_lock(&jobs_lock);
        code_thread_state = 1;
    }
    return NULL;
}

static int start_thread(void *(*fn)(void *), void *arg, int joinable, pthread_t *thread) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 8 << 20);
    pthread_attr_setdetachstate(&attr, joinable ? PTHREAD_CREATE_JOINABLE : PTHREAD_CREATE_DETACHED);
    pthread_t detached;
    int rc = pthread_create(thread ? thread : &detached, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    return rc;
}

struct own_run {
    struct code_job *job;
    uint64_t value;
    void *alt_stack;
};

static void *own_thread(void *arg) {
    struct own_run *m = arg;
    m->alt_stack = own_alt_stack();
    m->value = run_code(m->job);
    /* The thread's end runs its thread_local destructors (main's, as exit() would run them
     * natively); the waiter answers after them. */
    return NULL;
}

/* Main, and a request's code when the code thread is busy, run on a thread of their own,
 * which ends when the code returns: its thread_local destructors run then, before the
 * answer, under the request's guard (the module cannot be gone under them). */
static void *own_waiter(void *arg) {
    struct own_run m = {arg, 0, NULL};
    uint64_t guard = guard_pin();
    pthread_t thread;
    if (start_thread(own_thread, &m, 1, &thread) != 0) {
        guard_unpin(guard);
        atomic_fetch_sub(&running_code, 1);
        if (m.job->tag == T_RUN_MAIN) atomic_store(&main_running, 0);
        reply_error(m.job->id, "cannot start a thread for the request's code");
        free_job(m.job);
        return NULL;
    }
    pthread_join(thread, NULL);
    /* The thread is gone: nothing can be running on its alternate stack. */
    free(m.alt_stack);
    guard_unpin(guard);
    finish_job(m.job, m.value);
    return NULL;
}

/* Runs `job` off the reading thread; its code answers. */
static void start_job(struct code_job *job) {
    atomic_fetch_add(&running_code, 1);
    if (job->tag == T_RUN_MAIN) {
        if (start_thread(own_waiter, job, 0, NULL) != 0) {
            atomic_fetch_sub(&running_code, 1);
            atomic_store(&main_running, 0);
            reply_error(job->id, "cannot start main's thread");
            free_job(job);
        }
        return;
    }
    pthread_mutex_lock(&jobs_lock);
    if (code_thread_state == 0 && start_thread(code_thread, NULL, 0, NULL) == 0) code_thread_state = 1;
    if (code_thread_state == 1) {
        code_thread_state = 2;
        code_thread_job = job;
        pthread_cond_signal(&jobs_ready);
        pthread_mutex_unlock(&jobs_lock);
        return;
    }
    pthread_mutex_unlock(&jobs_lock);
    if (start_thread(own_waiter, job, 0, NULL) != 0) {
        atomic_fetch_sub(&running_code, 1);
        reply_error(job->id, "cannot start a thread for the request's code");
        free_job(job);
    }
}

static struct code_job *new_job(uint32_t id, uint8_t tag) {
    struct code_job *job = calloc(1, sizeof *job);
    if (!job) _exit(70);
    job->id = id;
    job->tag = tag;
    return job;
}

static void do_code_list(uint32_t id, uint8_t tag, struct reader *r) {
    struct code_job *job = new_job(id, tag);
    if (tag == T_RUN_FINALIZERS) job->dso = rd_u64(r, "dso_handle");
    job->list = rd_addresses(r, &job->n);
    if (r->bad || r->left) {
        reply_error(id, "malformed %s: %s", tag == T_RUN_FINALIZERS ? "RunFinalizers" : "RunInitializers", r->bad ? r->bad : "trailing bytes");
        free_job(job);
    } else if (!all_code(id, job->list, job->n)) {
        free_job(job);
    } else {
        start_job(job);
    }
}

/* ---- call-through stubs ------------------------------------------------------------------ */

/* A stub with no body yet jumps to kiln_lazy_entry_asm (below, per architecture) with its
 * id where the stub put it; the entry saves the caller's argument registers, calls
 * kiln_lazy_resolve, restores them and jumps where it answered. The calling thread sends
 * ResolveStub (id 0x8000_0000 | n) and waits; the reading thread, which goes on serving
 * the controller's requests (the body's link), takes the answer, stores the slot and
 * wakes it. */
struct stub_wait {
    uint32_t n;
    int done;
    uint64_t target;
    struct stub_wait *next;
};

static pthread_mutex_t stub_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stub_answered = PTHREAD_COND_INITIALIZER;
static struct stub_wait *stub_waits;
static uint32_t stub_requests;

/* Where a call goes whose body could not be made: returns 0, whatever the signature. */
__attribute__((visibility("hidden"), used)) uint64_t kiln_lazy_call_failed(void) {
    return 0;
}

#if defined(__aarch64__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
/* Whether membarrier(SYNC_CORE) was registered: after a slot's store, every thread of the
 * process runs a context synchronization event before it can reach the new body. */
static int sync_core;
#endif

/* One atomic store of a stub's slot. */
static void store_slot(uint64_t slot, uint64_t target) {
    __atomic_store_n((uint64_t *)(uintptr_t)slot, target, __ATOMIC_SEQ_CST);
#if defined(__aarch64__)
    if (sync_core) syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0);
#endif
}

__attribute__((visibility("hidden"), used)) uint64_t kiln_lazy_resolve(uint64_t stub) {
    if (getpid() != executor_pid) {
        /* A child the program forked: the connection is its parent's, whose requests and
         * answers it must not mix with. */
        logf_("kiln-executor-c: call-through stub %llu called in a forked child: the call returns 0\n", (unsigned long long)stub);
        return (uint64_t)(uintptr_t)kiln_lazy_call_failed;
    }
    if (atomic_load(&running_code) == 0 || pthread_equal(pthread_self(), reading_thread)) {
        logf_("kiln-executor-c: call-through stub %llu called when no request's code runs: the call returns 0\n", (unsigned long long)stub);
        return (uint64_t)(uintptr_t)kiln_lazy_call_failed;
    }
    int saved_errno = errno;
    struct stub_wait w = {0};
    pthread_mutex_lock(&stub_lock);
    do w.n = ++stub_requests & 0x7fffffffu; while (w.n == 0);
    w.next = stub_waits;
    stub_waits = &w;
    pthread_mutex_unlock(&stub_lock);
    struct writer m = {0};
    wr_u8(&m, T_RESOLVE_STUB);
    wr_u64(&m, stub);
    send_frame(0x80000000u | w.n, &m);
    free(m.p);
    pthread_mutex_lock(&stub_lock);
    while (!w.done) pthread_cond_wait(&stub_answered, &stub_lock);
    pthread_mutex_unlock(&stub_lock);
    errno = saved_errno;
    return w.target;
}

/* On the reading thread: the controller's answer to a ResolveStub. */
static void stub_answer(uint32_t fid, uint8_t tag, struct reader *r) {
    uint64_t target = (uint64_t)(uintptr_t)kiln_lazy_call_failed;
    if (tag == A_STUB_RESOLVED) {
        uint64_t to = rd_u64(r, "target"), slot = rd_u64(r, "slot");
        if (r->bad || r->left) {
            logf_("kiln-executor-c: malformed StubResolved (%s): the call returns 0\n", r->bad ? r->bad : "trailing bytes");
        } else {
            target = to;
            if (slot && (slot % 8 || !prepared(slot, 8, 2)))
                logf_("kiln-executor-c: StubResolved names a slot at %#llx, not in prepared writable memory: not stored\n", (unsigned long long)slot);
            else if (slot)
                store_slot(slot, to);
        }
    } else if (tag != A_ERROR) {
        logf_("kiln-executor-c: an answer of tag %u to ResolveStub: closing\n", tag);
        _exit(1);
    }
    pthread_mutex_lock(&stub_lock);
    struct stub_wait **at = &stub_waits;
    while (*at && (*at)->n != (fid & 0x7fffffffu)) at = &(*at)->next;
    struct stub_wait *w = *at;
    if (w) {
        *at = w->next;
        w->target = target;
        w->done = 1;
        pthread_cond_broadcast(&stub_answered);
    }
    pthread_mutex_unlock(&stub_lock);
    if (!w) {
        logf_("kiln-executor-c: an answer with id %#x, which no ResolveStub had: closing\n", fid);
        _exit(1);
    }
}

/* StoreCodePointer: hot swap of a lazy function's body. */
static void do_store_code_pointer(uint32_t id, struct reader *r) {
    uint64_t slot = rd_u64(r, "slot"), target = rd_u64(r, "target");
    if (r->bad || r->left) return reply_error(id, "malformed StoreCodePointer: %s", r->bad ? r->bad : "trailing bytes");
    if (slot % 8 || !prepared(slot, 8, 2))
        return reply_error(id, "slot %#llx is not 8-byte aligned in prepared writable memory", (unsigned long long)slot);
    if (!runnable(target))
        return reply_error(id, "%#llx is not code this executor prepared to run", (unsigned long long)target);
    store_slot(slot, target);
    reply_value(id, guard_advance());
}

/* The saved registers are the calling convention's arguments, whole: the integer ones,
 * the static chain and the vector/floating-point ones (x86-64: every vector component the
 * OS enabled, with xsave; AArch64: q0-q7; RISC-V: fa0-fa7). */
#if defined(__x86_64__)
#include <cpuid.h>
/* The bytes xsave needs for every state component the OS enabled, or 0 (fxsave). */
__attribute__((visibility("hidden"), used)) uint64_t kiln_xsave_size;
static void measure_vector_state(void) {
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE) && __get_cpuid_count(0xd, 0, &a, &b, &c, &d))
        kiln_xsave_size = b;
}
__asm__(
    ".pushsection .text.kiln_lazy_entry,\"ax\",@progbits\n"
    ".p2align 4\n"
    ".globl kiln_lazy_entry_asm\n"
    ".hidden kiln_lazy_entry_asm\n"
    ".type kiln_lazy_entry_asm, @function\n"
    "kiln_lazy_entry_asm:\n"
    "endbr64\n"
    /* 0(%rsp): the id the stub pushed; 8(%rsp): the caller's return address. */
    "push %rbp\n"
    "mov %rsp, %rbp\n"
    "push %rdi\n push %rsi\n push %rdx\n push %rcx\n push %r8\n push %r9\n push %rax\n push %r10\n"
    "mov kiln_xsave_size(%rip), %r11\n"
    "test %r11, %r11\n"
    "jz 2f\n"
    "sub %r11, %rsp\n"
    "and $-64, %rsp\n"
    "xor %eax, %eax\n"
    "mov %rax, 512(%rsp)\n mov %rax, 520(%rsp)\n mov %rax, 528(%rsp)\n mov %rax, 536(%rsp)\n"
    "mov %rax, 544(%rsp)\n mov %rax, 552(%rsp)\n mov %rax, 560(%rsp)\n mov %rax, 568(%rsp)\n"
    "mov $-1, %eax\n mov $-1, %edx\n"
    "xsave64 (%rsp)\n"
    "mov 8(%rbp), %rdi\n"
    "call kiln_lazy_resolve\n"
    "mov %rax, %r11\n"
    "mov $-1, %eax\n mov $-1, %edx\n"
    "xrstor64 (%rsp)\n"
    "jmp 3f\n"
    "2:\n"
    "sub $512, %rsp\n"
    "and $-16, %rsp\n"
    "fxsave64 (%rsp)\n"
    "mov 8(%rbp), %rdi\n"
    "call kiln_lazy_resolve\n"
    "mov %rax, %r11\n"
    "fxrstor64 (%rsp)\n"
    "3:\n"
    "lea -64(%rbp), %rsp\n"
    "pop %r10\n pop %rax\n pop %r9\n pop %r8\n pop %rcx\n pop %rdx\n pop %rsi\n pop %rdi\n"
    "pop %rbp\n"
    "add $8, %rsp\n" /* the id: the caller's return address is on top again */
    "jmp *%r11\n"
    ".size kiln_lazy_entry_asm, . - kiln_lazy_entry_asm\n"
    ".popsection\n");
#elif defined(__aarch64__)
static void measure_vector_state(void) {
    sync_core = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0) == 0;
}
/* The id in x17 (the stub's `movz/movk x17`); x16 holds where to go. */
__asm__(
    ".pushsection .text.kiln_lazy_entry,\"ax\",%progbits\n"
    ".p2align 4\n"
    ".globl kiln_lazy_entry_asm\n"
    ".hidden kiln_lazy_entry_asm\n"
    ".type kiln_lazy_entry_asm, %function\n"
    "kiln_lazy_entry_asm:\n"
    "hint #34\n" /* bti c: reached by the common tail's br x16 */
    "stp x29, x30, [sp, #-224]!\n"
    "mov x29, sp\n"
    "stp x0, x1, [sp, #16]\n stp x2, x3, [sp, #32]\n stp x4, x5, [sp, #48]\n stp x6, x7, [sp, #64]\n"
    "stp x8, x18, [sp, #80]\n" /* x8: the indirect result; x18: gcc's static chain */
    "stp q0, q1, [sp, #96]\n stp q2, q3, [sp, #128]\n stp q4, q5, [sp, #160]\n stp q6, q7, [sp, #192]\n"
    "mov x0, x17\n"
    "bl kiln_lazy_resolve\n"
    "mov x16, x0\n"
    "ldp q0, q1, [sp, #96]\n ldp q2, q3, [sp, #128]\n ldp q4, q5, [sp, #160]\n ldp q6, q7, [sp, #192]\n"
    "ldp x8, x18, [sp, #80]\n"
    "ldp x0, x1, [sp, #16]\n ldp x2, x3, [sp, #32]\n ldp x4, x5, [sp, #48]\n ldp x6, x7, [sp, #64]\n"
    "ldp x29, x30, [sp], #224\n"
    "br x16\n"
    ".size kiln_lazy_entry_asm, . - kiln_lazy_entry_asm\n"
    ".popsection\n");
#elif defined(__riscv)
static void measure_vector_state(void) {}
/* The id in t5 (the stub's `lui/addiw t5`); t3 holds where to go. */
__asm__(
    ".pushsection .text.kiln_lazy_entry,\"ax\",@progbits\n"
    ".p2align 2\n"
    ".globl kiln_lazy_entry_asm\n"
    ".hidden kiln_lazy_entry_asm\n"
    ".type kiln_lazy_entry_asm, @function\n"
    "kiln_lazy_entry_asm:\n"
    "addi sp, sp, -144\n"
    "sd ra, 0(sp)\n sd t2, 8(sp)\n" /* t2: gcc's static chain */
    "sd a0, 16(sp)\n sd a1, 24(sp)\n sd a2, 32(sp)\n sd a3, 40(sp)\n"
    "sd a4, 48(sp)\n sd a5, 56(sp)\n sd a6, 64(sp)\n sd a7, 72(sp)\n"
    "fsd fa0, 80(sp)\n fsd fa1, 88(sp)\n fsd fa2, 96(sp)\n fsd fa3, 104(sp)\n"
    "fsd fa4, 112(sp)\n fsd fa5, 120(sp)\n fsd fa6, 128(sp)\n fsd fa7, 136(sp)\n"
    "mv a0, t5\n"
    "call kiln_lazy_resolve\n"
    "mv t3, a0\n"
    "fld fa0, 80(sp)\n fld fa1, 88(sp)\n fld fa2, 96(sp)\n fld fa3, 104(sp)\n"
    "fld fa4, 112(sp)\n fld fa5, 120(sp)\n fld fa6, 128(sp)\n fld fa7, 136(sp)\n"
    "ld a0, 16(sp)\n ld a1, 24(sp)\n ld a2, 32(sp)\n ld a3, 40(sp)\n"
    "ld a4, 48(sp)\n ld a5, 56(sp)\n ld a6, 64(sp)\n ld a7, 72(sp)\n"
    "ld ra, 0(sp)\n ld t2, 8(sp)\n"
    "addi sp, sp, 144\n"
    "jr t3\n"
    ".size kiln_lazy_entry_asm, . - kiln_lazy_entry_asm\n"
    ".popsection\n");
#endif
extern void kiln_lazy_entry_asm(void);

/* ---- serving ------------------------------------------------------------------------- */

/* Reads one frame's body (id, tag, fields); -1 when the connection ends or the frame is
 * beyond the limit (nothing is allocated for it). */
static int read_frame(uint8_t **body, uint32_t *len) {
    uint8_t head[4];
    if (read_all(sock, head, 4) != 0) return -1;
    *len = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24;
    if (*len < 5 || *len > MAX_FRAME) {
        logf_("kiln-executor-c: frame of %u bytes refused (limit %u): closing\n", *len, MAX_FRAME);
        return -1;
    }
    *body = malloc(*len);
    if (!*body || read_all(sock, *body, *len) != 0) {
        free(*body);
        return -1;
    }
    return 0;
}

static void send_hello(void) {
    struct writer w = {0};
    wr_u8(&w, T_HELLO);
    wr_raw(&w, "KILN", 4);
    wr_u32(&w, PROTOCOL_VERSION);
    wr_u64(&w, (uint64_t)page_size);
    wr_string(&w, TRIPLE);
    wr_u32(&w, (uint32_t)getpid());
    wr_u32(&w, MAX_FRAME);
    /* Runtime symbols: JIT code's __tls_get_addr is this executor's, and call-through
     * stubs enter it here. */
    wr_u32(&w, 3);
    wr_string(&w, "__tls_get_addr");
    wr_u64(&w, (uint64_t)(uintptr_t)kiln_tls_get_addr);
    wr_string(&w, "__kiln_lazy_entry");
    wr_u64(&w, (uint64_t)(uintptr_t)kiln_lazy_entry_asm);
    wr_string(&w, "__kiln_lazy_call_failed");
    wr_u64(&w, (uint64_t)(uintptr_t)kiln_lazy_call_failed);
    send_frame(0, &w);
    free(w.p);
}

static int serve(int fd) {
    sock = fd;
    executor_pid = getpid();
    tracing = getenv("KILN_EXECUTOR_TRACE") != NULL;
    page_size = sysconf(_SC_PAGESIZE);
    static const uint8_t preamble[8] = {'K', 'I', 'L', 'N', 0, 0, 0, 'P'};
    if (write_all(sock, preamble, 8) != 0) return 1;
    /* Reports go out on a stack of their own, so a stack overflow reports too. */
    static uint8_t alt_stack[64 * 1024];
    stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack};
    sigaltstack(&ss, NULL);
    int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGABRT, SIGSYS};
    for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++) {
        struct sigaction sa = {0};
        sa.sa_handler = on_fatal_signal;
        sa.sa_flags = SA_RESETHAND | SA_ONSTACK | SA_NODEFER;
        sigaction(fatal[i], &sa, NULL);
    }
    on_exit(on_program_exit, NULL);
    /* The compiler's runtime is part of the process's symbols, as for a native program:
     * the unwinder, and on AArch64 the 128-bit long double helpers (__addtf3, …). */
    dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_GLOBAL);
    setup_stdio();
    measure_vector_state();
    reading_thread = pthread_self();
    send_hello();
    for (;;) {
        /* Input the program has not taken goes into its pipe as the pipe takes it. */
        int queued = in_pipe[1] >= 0 && input_queue.len > input_sent;
        struct pollfd fds[2] = {{sock, POLLIN, 0}, {queued ? in_pipe[1] : -1, POLLOUT, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        if (fds[1].revents) flush_input();
        if (!fds[0].revents) continue;
        uint8_t *body;
        uint32_t len;
        if (read_frame(&body, &len) != 0) return 0;
        struct reader r = {body, len, NULL};
        uint32_t id = rd_u32(&r, "id");
        uint8_t tag = rd_u8(&r, "tag");
        if (id & 0x80000000u) {
            /* Only an answer to a ResolveStub of ours has the top bit set. */
            stub_answer(id, tag, &r);
            free(body);
            continue;
        }
        if (tracing) logf_("kiln-executor-c: request %u (tag %u, %u bytes)\n", id, tag, len);
        switch (tag) {
        case T_RESERVE: do_reserve(id, &r); break;
        case T_PREPARE: do_prepare(id, &r); break;
        case T_INITIALIZE: do_initialize(id, &r); break;
        case T_DEINITIALIZE: do_deinitialize(id, &r); break;
        case T_RELEASE: do_release(id, &r); break;
        case T_WRITE: do_write(id, &r); break;
        case T_READ: do_read(id, &r); break;
        case T_LOOKUP: do_lookup(id, &r); break;
        case T_LOOKUP_MANY: do_lookup_many(id, &r); break;
        case T_LOAD_LIBRARY: do_load_library(id, &r); break;
        case T_REGISTER_EH_FRAME: do_eh_frame(id, &r, 1); break;
        case T_DEREGISTER_EH_FRAME: do_eh_frame(id, &r, 0); break;
        case T_RUN_INITIALIZERS: do_code_list(id, tag, &r); break;
        case T_RUN_FINALIZERS: do_code_list(id, tag, &r); break;
        case T_RUN_MAIN: do_run_main(id, &r); break;
        case T_CALL: do_call(id, &r); break;
        case T_INPUT: give_input(&r); break;
        case T_SET_ENVIRONMENT: do_set_environment(id, &r); break;
        case T_GUARD_BRANCH_TARGETS: do_guard_branch_targets(id, &r); break;
        case T_RESERVE_TLS_MODULE: do_reserve_tls_module(id, &r); break;
        case T_INSTALL_TLS: do_place_tls(id, &r, 0); break;
        case T_PLACE_STATIC_TLS: do_place_tls(id, &r, 1); break;
        case T_REMOVE_TLS: do_remove_tls(id, &r); break;
        case T_EXPORT_SYMBOLS: do_export_symbols(id, &r); break;
        case T_UNEXPORT_SYMBOLS: do_unexport_symbols(id, &r); break;
        case T_STORE_CODE_POINTER: do_store_code_pointer(id, &r); break;
        case T_OLDEST_CODE_GUARD:
            if (r.left) reply_error(id, "malformed OldestCodeGuard: trailing bytes");
            else reply_value(id, guard_oldest());
            break;
        case T_RESOLVE_STUB: reply_error(id, "ResolveStub goes from the executor to the controller"); break;
        case T_SHUTDOWN:
            if (atomic_load(&running_code) > 0) {
                reply_error(id, atomic_load(&main_running) ? "main is running" : "JIT code is running");
                break;
            }
            drain_output();
            reply_simple(id, A_OK);
            free(body);
            shutdown(sock, SHUT_WR);
            _exit(0);
        default: {
            const char *name = request_name(tag);
            if (name) reply_error(id, "kiln-executor-c does not implement %s", name);
            else reply_error(id, "unknown request tag %u", tag);
        }
        }
        free(body);
    }
}

int main(int argc, char **argv) {
    if (argc != 3 || strcmp(argv[1], "--listen") != 0) {
        fprintf(stderr, "usage: kiln-executor-c --listen 127.0.0.1:PORT\n");
        return 2;
    }
    char host[64];
    const char *colon = strrchr(argv[2], ':');
    if (!colon || (size_t)(colon - argv[2]) >= sizeof host) {
        fprintf(stderr, "kiln-executor-c: expected ADDRESS:PORT, not %s\n", argv[2]);
        return 2;
    }
    memcpy(host, argv[2], (size_t)(colon - argv[2]));
    host[colon - argv[2]] = 0;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "kiln-executor-c: %s is not an IPv4 address\n", host);
        return 2;
    }
    if ((ntohl(addr.sin_addr.s_addr) >> 24) != 127) {
        fprintf(stderr, "kiln-executor-c: refusing to serve %s: it speaks plaintext, so it listens on loopback addresses only\n", host);
        return 2;
    }
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, SOMAXCONN) != 0) {
        fprintf(stderr, "kiln-executor-c: cannot listen on %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    socklen_t alen = sizeof addr;
    getsockname(listener, (struct sockaddr *)&addr, &alen);
    fprintf(stderr, "kiln-executor-c: listening on %s:%u (%s)\n", host, ntohs(addr.sin_port), TRIPLE);
    fflush(stderr);
    signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel */
    for (;;) {
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "kiln-executor-c: accept: %s\n", strerror(errno));
            return 1;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(listener);
            signal(SIGCHLD, SIG_DFL); /* the program's system() and waitpid() need it */
            _exit(serve(fd));
        }
        if (pid < 0) fprintf(stderr, "kiln-executor-c: fork: %s\n", strerror(errno));
        close(fd);
    }
}
