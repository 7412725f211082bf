/*
 * kiln-executor-c for Windows: the sibling of kiln_executor.c (Linux) for x86-64 Windows,
 * written from docs/PROTOCOL.md and built with x86_64-w64-mingw32-gcc (here it runs under
 * Wine). It serves the copy transport over TCP, plaintext, on a loopback address:
 *
 *   kiln-executor-c.exe --listen 127.0.0.1:PORT     (PORT 0: any; the address is printed)
 *
 * and each connection in a process of its own: the listener starts itself again for
 * every connection it accepts and hands the child the socket (WSADuplicateSocket: Wine's
 * ws2_32 does not know a socket inherited as a bare handle), so one program's crash,
 * exit() or stall ends its own process only.
 *
 * It implements Reserve, Prepare, Initialize (FlushInstructionCache over code),
 * Deinitialize, Release, Write, Read, Lookup, LookupMany, LoadLibrary, RunInitializers,
 * RunFinalizers, RunMain (the program's output forwarded as Output messages, its input
 * taken from Input messages, exit() and fatal exceptions reported), Call, Input and
 * Shutdown. The code of RunMain, Call, RunInitializers and RunFinalizers runs off the
 * thread that reads the connection, which goes on serving the controller meanwhile.
 * GuardBranchTargets is answered Ok (nothing to guard on x86-64), RegisterEhFrame and
 * DeregisterEhFrame Ok without effect (Windows unwinds with its own tables: a later step);
 * the rest — thread-local storage, exports, stdio adoption, the environment, debug
 * outputs, call-through stubs' hot swap, batches — with an Error naming the request.
 *
 * Code memory is dual-mapped, as on Linux: a section (CreateFileMapping of the paging
 * file) mapped twice, the target view with the final protection of each page (never
 * writable and executable) and a writable working view that Write requests go to.
 *
 * What code compiled for x86_64-w64-windows-gnu (mingw's headers) calls that is not in a
 * DLL — the stack probe, mingw's C99 printf and scanf, its C99 math — is this executor's
 * own statically linked copy, offered in the hello's runtime symbols, with exit, _exit and
 * abort (which report), setjmp (without SEH unwinding, which JIT code's frames do not
 * support) and printf to a stream (one write per call, not per line under Wine); the rest
 * comes from msvcrt.dll (this executor's C runtime too),
 * ucrtbase.dll, kernel32.dll and the DLLs LoadLibrary loads.
 */
#define _WIN32_WINNT 0x0602 /* Windows 8: GetCurrentThreadStackLimits */
#define WIN32_LEAN_AND_MEAN
/* The executor's own formatting is C99's (%llx, %zu), as on Linux. */
#define __USE_MINGW_ANSI_STDIO 1
#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>
#include <fcntl.h>
#include <io.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

#if !defined(__x86_64__)
#error "kiln_executor_win.c is for x86-64 Windows"
#endif

#define TRIPLE "x86_64-pc-windows-gnu"
#define MAX_RESERVATIONS 1024
#define MAX_LIBRARIES 256

/* ---- the connection ------------------------------------------------------------------ */

static SOCKET sock = INVALID_SOCKET;
static SRWLOCK send_lock = SRWLOCK_INIT;
static HANDLE log_handle; /* the executor's own stderr, kept when the program's is a pipe */
static int tracing;       /* KILN_EXECUTOR_TRACE=1: requests logged to stderr */

/* Ends the process at once, as _exit does on Linux: no atexit handlers, no DLL detach
 * (a thread stopped inside the loader or the C runtime cannot hold the end up). */
__attribute__((noreturn)) static void quit(unsigned status) {
    TerminateProcess(GetCurrentProcess(), status);
    ExitProcess(status);
}

static void logf_(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    /* A log whose reader is gone fails the write, and nothing else happens. */
    DWORD written;
    WriteFile(log_handle, buf, (DWORD)((size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1), &written, NULL);
}

/* The text of Windows error `e` (GetLastError, WSAGetLastError), without the line break. */
static const char *win_error(DWORD e, char *buf, size_t len) {
    DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL, e,
                             0, buf, (DWORD)len, NULL);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '.')) n--;
    if (n == 0) snprintf(buf, len, "error %lu", (unsigned long)e);
    else buf[n] = 0;
    return buf;
}

static int write_all(const uint8_t *p, size_t n) {
    while (n > 0) {
        int k = send(sock, (const char *)p, n > (1u << 30) ? (1 << 30) : (int)n, 0);
        if (k == SOCKET_ERROR && WSAGetLastError() == WSAEINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_all(uint8_t *p, size_t n) {
    while (n > 0) {
        int k = recv(sock, (char *)p, n > (1u << 30) ? (1 << 30) : (int)n, 0);
        if (k == SOCKET_ERROR && WSAGetLastError() == WSAEINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Non-zero while a frame is being written (a crash report waits for it). */
static atomic_int sending;

/* Sends one frame, in one write: `body` starts with the tag (the frame is allocated for
 * the body's length and the 8 bytes before it). */
static void send_frame(uint32_t id, const struct writer *body) {
    uint32_t len = (uint32_t)body->len + 4;
    uint8_t *frame = malloc(body->len + 8);
    if (!frame) quit(70);
    for (int i = 0; i < 4; i++) frame[i] = (uint8_t)(len >> (8 * i));
    for (int i = 0; i < 4; i++) frame[4 + i] = (uint8_t)(id >> (8 * i));
    memcpy(frame + 8, body->p, body->len);
    AcquireSRWLockExclusive(&send_lock);
    atomic_store(&sending, 1);
    int failed = write_all(frame, body->len + 8) != 0;
    atomic_store(&sending, 0);
    ReleaseSRWLockExclusive(&send_lock);
    free(frame);
    if (failed) quit(0); /* the controller is gone */
}

__attribute__((format(gnu_printf, 2, 3))) static void reply_error(uint32_t id, const char *fmt, ...) {
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
    HANDLE section;
    /* Per page: 0 unprepared, else 1 + the permission it was prepared with (0 RX, 1 R,
     * 2 RW), so that nothing is run, read or flushed on a page that is not ready. */
    uint8_t *pages;
};

static struct reservation reservations[MAX_RESERVATIONS];
static uint64_t page_size = 4096, granularity = 65536;

#include "requests.h"

/* Whether every page of [addr, addr + len) is prepared, with `permission` (0 RX, 1 R,
 * 2 RW) or, for -1, with any readable one. */
static int prepared(uint64_t addr, uint64_t len, int permission) {
    struct reservation *r = holding(addr, len ? len : 1);
    if (!r) return 0;
    uint64_t first = (addr - r->target) / page_size;
    uint64_t last = (addr + (len ? len : 1) - 1 - r->target) / page_size;
    for (uint64_t p = first; p <= last; p++) {
        uint8_t state = r->pages[p];
        if (state == 0) return 0;
        if (permission >= 0 && state != permission + 1) return 0;
    }
    return 1;
}

/* The page protection of a permission (0 RX, 1 R, 2 RW); 0 for none. */
static DWORD protection_of(uint8_t permission) {
    switch (permission) {
    case 0: return PAGE_EXECUTE_READ;
    case 1: return PAGE_READONLY;
    case 2: return PAGE_READWRITE;
    default: return 0;
    }
}

/* The C runtime JIT code calls (this executor's own), the other one, and kernel32. */
static HMODULE msvcrt, ucrt, kernel32;

/* The image of module `m`, [*lo, *hi). Safe: a loaded module's handle is its base address,
 * where the loader mapped its headers readable; the offsets read are checked against the
 * signatures first. */
static int module_range(HMODULE m, uint64_t *lo, uint64_t *hi) {
    if (!m) return 0;
    const IMAGE_DOS_HEADER *dos = (const IMAGE_DOS_HEADER *)m;
    if (dos->e_magic != IMAGE_DOS_SIGNATURE || dos->e_lfanew <= 0 || dos->e_lfanew > 4096) return 0;
    const IMAGE_NT_HEADERS64 *nt = (const IMAGE_NT_HEADERS64 *)((const uint8_t *)m + dos->e_lfanew);
    if (nt->Signature != IMAGE_NT_SIGNATURE) return 0;
    *lo = (uint64_t)(uintptr_t)m;
    *hi = *lo + nt->OptionalHeader.SizeOfImage;
    return 1;
}

/* Maps a view of the section at `at` (0: anywhere) that may later be made any protection.
 * Its pages are readable, writable and executable until the caller makes them
 * inaccessible, before anyone learns the address. */
static void *map_view_at(HANDLE section, uint64_t len, uint64_t at) {
    return MapViewOfFileEx(section, FILE_MAP_READ | FILE_MAP_WRITE | FILE_MAP_EXECUTE, 0, 0, (SIZE_T)len,
                           (void *)(uintptr_t)at);
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Maps `len` bytes of the section where `lo <= start` and `start + len <= hi`. A view
 * goes where it is asked (MapViewOfFileEx maps there or fails): first hints spread over
 * the window, nearest its middle, as the Linux executor does; then every free range of
 * the window, lowest first (VirtualQuery). */
static void *map_target(HANDLE section, uint64_t len, uint64_t lo, uint64_t hi) {
    if (lo == 0 && hi == UINT64_MAX) return map_view_at(section, len, 0);
    uint64_t mid = lo / 2 + hi / 2;
    for (int k = 0; k < 128; k++) {
        int64_t step = (int64_t)((k + 1) / 2) * (int64_t)(16 << 20) * (k % 2 ? 1 : -1);
        uint64_t hint = (mid + (uint64_t)step) & ~(granularity - 1);
        if (hint < lo || hint + len > hi || hint < granularity) continue;
        void *p = map_view_at(section, len, hint);
        if (p) return p;
    }
    uint64_t at = align_up(lo < granularity ? granularity : lo, granularity);
    while (at + len > at && at + len <= hi) {
        MEMORY_BASIC_INFORMATION m;
        if (VirtualQuery((void *)(uintptr_t)at, &m, sizeof m) == 0) break;
        uint64_t end = (uint64_t)(uintptr_t)m.BaseAddress + m.RegionSize;
        if (m.State == MEM_FREE && end >= at + len) {
            void *p = map_view_at(section, len, at);
            if (p) return p;
        }
        uint64_t next = align_up(end, granularity);
        at = next > at ? next : at + granularity;
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
    if (len == 0 || len % page_size || len > ((uint64_t)1 << 40))
        return reply_error(id, "cannot reserve %#llx bytes", (unsigned long long)len);
    const uint64_t reach = ((uint64_t)1 << 31) - ((uint64_t)1 << 20);
    /* The windows to try, in order: [lo, hi). */
    uint64_t window[2][2] = {{0, UINT64_MAX}, {0, 0}};
    int windows = 1;
    switch (placement) {
    case 0: break;
    case 1: {
        /* Near the C runtime's code: within reach of all of msvcrt.dll (whose functions
         * JIT code calls most), and of ucrtbase.dll too where one window reaches both. */
        uint64_t mlo, mhi, ulo, uhi;
        if (!module_range(msvcrt, &mlo, &mhi)) return reply_error(id, "placement near the libraries: msvcrt.dll is not loaded");
        uint64_t lo = mhi > reach ? mhi - reach : 0, hi = mlo + reach;
        windows = 0;
        if (module_range(ucrt, &ulo, &uhi)) {
            uint64_t both_lo = uhi > reach ? uhi - reach : 0, both_hi = ulo + reach;
            if (both_lo < lo) both_lo = lo;
            if (both_hi > hi) both_hi = hi;
            if (both_hi > both_lo && both_hi - both_lo >= len) {
                window[windows][0] = both_lo;
                window[windows++][1] = both_hi;
            }
        }
        window[windows][0] = lo;
        window[windows++][1] = hi;
        break;
    }
    case 2:
        if (a > b) return reply_error(id, "placement near %#llx..%#llx: the range is reversed", (unsigned long long)a, (unsigned long long)b);
        window[0][0] = b > reach ? b - reach : 0;
        window[0][1] = a + reach;
        break;
    case 3: window[0][0] = 1 << 20; window[0][1] = (uint64_t)1 << 31; break;
    default: return reply_error(id, "unknown placement %u", placement);
    }
    int slot = -1;
    for (int i = 0; i < MAX_RESERVATIONS; i++)
        if (!reservations[i].used) { slot = i; break; }
    if (slot < 0) return reply_error(id, "too many reservations (%d)", MAX_RESERVATIONS);
    char why[256];
    /* The paging file's pages, which both views share; they read as zeros. */
    HANDLE section = CreateFileMappingW(INVALID_HANDLE_VALUE, NULL, PAGE_EXECUTE_READWRITE | SEC_COMMIT,
                                        (DWORD)(len >> 32), (DWORD)len, NULL);
    if (!section) return reply_error(id, "a section of %#llx bytes: %s", (unsigned long long)len, win_error(GetLastError(), why, sizeof why));
    void *target = NULL;
    for (int i = 0; i < windows && !target; i++) target = map_target(section, len, window[i][0], window[i][1]);
    if (!target) {
        CloseHandle(section);
        return reply_error(id, "no free address range of %#llx bytes satisfies placement %u", (unsigned long long)len, placement);
    }
    /* Inaccessible until prepared: the view was mapped with every access allowed (so
     * that Prepare can give each page its protection), which no page keeps. */
    DWORD old;
    if (!VirtualProtect(target, (SIZE_T)len, PAGE_NOACCESS, &old)) {
        DWORD e = GetLastError();
        UnmapViewOfFile(target);
        CloseHandle(section);
        return reply_error(id, "target view at %p: VirtualProtect: %s", target, win_error(e, why, sizeof why));
    }
    void *working = MapViewOfFile(section, FILE_MAP_WRITE, 0, 0, (SIZE_T)len);
    if (!working) {
        DWORD e = GetLastError();
        UnmapViewOfFile(target);
        CloseHandle(section);
        return reply_error(id, "working view: %s", win_error(e, why, sizeof why));
    }
    uint8_t *page_map = calloc((size_t)(len / page_size), 1);
    if (!page_map) {
        UnmapViewOfFile(target);
        UnmapViewOfFile(working);
        CloseHandle(section);
        return reply_error(id, "out of memory for the page map of %#llx bytes", (unsigned long long)len);
    }
    reservations[slot] = (struct reservation){1, (uint64_t)(uintptr_t)target, len, working, section, page_map};
    if (tracing) logf_("kiln-executor-c: reserved %#llx bytes at %p (placement %u)\n", (unsigned long long)len, target, placement);
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
    if (start % page_size || end % page_size || start >= end || !inside(res, start, end - start)) {
        reply_error(id, "%#llx..%#llx is not a page range of reservation %llu", (unsigned long long)start, (unsigned long long)end, (unsigned long long)handle);
        return NULL;
    }
    return res;
}

/* Prepare: the target view's pages get their final protection now (checked to lie in
 * the reservation's view first); writes go to the working view. */
static void do_prepare(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle"), start = rd_u64(r, "start"), end = rd_u64(r, "end");
    uint8_t permission = rd_u8(r, "permission");
    if (r->bad || r->left) return reply_error(id, "malformed Prepare: %s", r->bad ? r->bad : "trailing bytes");
    DWORD protection = protection_of(permission);
    if (!protection) return reply_error(id, "unknown permission %u", permission);
    struct reservation *res = pages(id, handle, start, end);
    if (!res) return;
    DWORD old;
    char why[256];
    if (!VirtualProtect((void *)(uintptr_t)start, (SIZE_T)(end - start), protection, &old))
        return reply_error(id, "Prepare of %#llx..%#llx: VirtualProtect: %s", (unsigned long long)start, (unsigned long long)end, win_error(GetLastError(), why, sizeof why));
    memset(res->pages + (start - res->target) / page_size, permission + 1, (end - start) / page_size);
    reply_simple(id, A_OK);
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
        if (!inside(res, segs[i][0], segs[i][1]) || !protection_of((uint8_t)segs[i][2])) {
            unsigned long long at = segs[i][0], len = segs[i][1];
            free(segs);
            return reply_error(id, "segment %#llx+%#llx is not in reservation %llu", at, len, (unsigned long long)handle);
        }
        if (segs[i][1] > 0 && !prepared(segs[i][0], segs[i][1], (int)segs[i][2])) {
            unsigned long long at = segs[i][0], len = segs[i][1];
            unsigned p = (unsigned)segs[i][2];
            free(segs);
            return reply_error(id, "segment %#llx+%#llx is not on pages prepared with permission %u", at, len, p);
        }
    }
    /* Code written through the working view is fetched through the target view: the
     * instruction cache is made coherent for it (on x86-64 a serializing no-op in
     * effect, which the system still wants to be told of). */
    for (uint32_t i = 0; i < n; i++)
        if (segs[i][2] == 0 && segs[i][1] > 0)
            FlushInstructionCache(GetCurrentProcess(), (void *)(uintptr_t)segs[i][0], (SIZE_T)segs[i][1]);
    free(segs);
    reply_simple(id, A_OK);
}

/* GuardBranchTargets: on AArch64 Linux the pages are mapped PROT_BTI; x86-64 has nothing
 * of the kind here. The range is checked as there, and answered Ok. */
static void do_guard_branch_targets(uint32_t id, struct reader *r) {
    uint64_t addr = rd_u64(r, "address"), len = rd_u64(r, "length");
    if (r->bad || r->left) return reply_error(id, "malformed GuardBranchTargets: %s", r->bad ? r->bad : "trailing bytes");
    if (len == 0 || addr % page_size || len % page_size)
        return reply_error(id, "guard branch targets: %#llx+%#llx is not whole pages", (unsigned long long)addr, (unsigned long long)len);
    if (!prepared(addr, len, 0))
        return reply_error(id, "guard branch targets: %#llx+%#llx is not code this executor prepared", (unsigned long long)addr, (unsigned long long)len);
    reply_simple(id, A_OK);
}

/* Deinitialize: the pages become inaccessible, and their contents are discarded (zeroed
 * through the working view, inside the reservation as `pages` checked), so that they read
 * as zeros when prepared again. */
static void do_deinitialize(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle"), start = rd_u64(r, "start"), end = rd_u64(r, "end");
    if (r->bad || r->left) return reply_error(id, "malformed Deinitialize: %s", r->bad ? r->bad : "trailing bytes");
    struct reservation *res = pages(id, handle, start, end);
    if (!res) return;
    DWORD old;
    VirtualProtect((void *)(uintptr_t)start, (SIZE_T)(end - start), PAGE_NOACCESS, &old);
    memset(res->pages + (start - res->target) / page_size, 0, (end - start) / page_size);
    memset(res->working + (start - res->target), 0, end - start);
    reply_simple(id, A_OK);
}

/* Release: unmaps the reservation's own two views (their addresses kept since Reserve)
 * and closes its section; nothing else is touched. */
static void do_release(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle");
    if (r->bad || r->left) return reply_error(id, "malformed Release: %s", r->bad ? r->bad : "trailing bytes");
    struct reservation *res = reservation(handle);
    if (!res) return reply_error(id, "no reservation with handle %llu", (unsigned long long)handle);
    UnmapViewOfFile((void *)(uintptr_t)res->target);
    UnmapViewOfFile(res->working);
    CloseHandle(res->section);
    free(res->pages);
    memset(res, 0, sizeof *res);
    reply_simple(id, A_OK);
}

/* ---- the runtime JIT code gets from the executor ---------------------------------------- */

static atomic_int running_code; /* requests whose JIT code runs */

__attribute__((noreturn)) static void crash(uint32_t signal, uint32_t code, uint64_t fault, uint64_t pc);
static void drain_output(void);
static void report_exit(uint32_t status);

/* mingw's __main runs a program's constructors on its first call; Kiln runs a module's
 * constructors itself (RunInitializers), so JIT code's call does nothing. */
static void kiln_main_noop(void) {}

/* exit(status) from JIT code: the status is kept for the report, which goes out from the
 * executor's atexit handler — registered first, so it runs last: after the program's
 * own atexit handlers, whose output is sent before Exited (as on Linux). */
static atomic_int exit_requested;
static uint32_t exit_status;

/* The program's atexit handlers: kept here, not by msvcrt (whose exit() alone runs its
 * own), so that they also run when main returns — the controller then ends the executor
 * with Shutdown, not exit() — newest first, as exit() runs them. A handler in JIT code
 * that is no longer prepared to run (its module removed) is skipped. */
static SRWLOCK atexit_lock = SRWLOCK_INIT;
static void (**atexit_handlers)(void);
static size_t atexit_count, atexit_room;

static int kiln_atexit(void (*handler)(void)) {
    AcquireSRWLockExclusive(&atexit_lock);
    if (atexit_count == atexit_room) {
        size_t room = atexit_room ? 2 * atexit_room : 32;
        void (**grown)(void) = realloc(atexit_handlers, room * sizeof *grown);
        if (!grown) {
            ReleaseSRWLockExclusive(&atexit_lock);
            return -1;
        }
        atexit_handlers = grown;
        atexit_room = room;
    }
    atexit_handlers[atexit_count++] = handler;
    ReleaseSRWLockExclusive(&atexit_lock);
    return 0;
}

static _onexit_t kiln_onexit(_onexit_t handler) {
    return kiln_atexit((void (*)(void))handler) == 0 ? handler : NULL;
}

static int runnable(uint64_t addr);
static struct reservation *holding(uint64_t addr, uint64_t len);

static void run_atexit_handlers(void) {
    for (;;) {
        AcquireSRWLockExclusive(&atexit_lock);
        void (*handler)(void) = atexit_count ? atexit_handlers[--atexit_count] : NULL;
        ReleaseSRWLockExclusive(&atexit_lock);
        if (!handler) return;
        uint64_t at = (uint64_t)(uintptr_t)handler;
        if (!holding(at, 1) || runnable(at)) handler();
    }
}

__attribute__((noreturn)) static void kiln_exit(int status) {
    run_atexit_handlers();
    exit_status = (uint32_t)status;
    atomic_store(&exit_requested, 1);
    exit(status);
}

/* _exit(status): no atexit handlers; what the program wrote is sent before Exited, its
 * stdio buffers too (msvcrt writes them out as the process ends, _exit or not). */
__attribute__((noreturn)) static void kiln__exit(int status) {
    if (atomic_load(&running_code) > 0) {
        drain_output();
        report_exit((uint32_t)status);
    }
    _exit(status);
}

/* abort(): reported as a crash of signal 6 (SIGABRT), at the caller's address. */
__attribute__((noreturn)) static void kiln_abort(void) {
    crash(6, 0, 0, (uint64_t)(uintptr_t)__builtin_return_address(0));
}

/* setjmp in mingw's headers is msvcrt's _setjmp(buf, frame): with a frame, msvcrt's
 * longjmp unwinds to it through the functions between (RtlUnwind), which needs their
 * unwind tables, and JIT code has none. This entry calls _setjmp with no frame (longjmp
 * then restores the registers only, as mingw's non-SEH setjmp does). A jump, not a call:
 * _setjmp must see the caller's own stack frame. */
__attribute__((used)) void *kiln_msvcrt_setjmp;
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".globl kiln_setjmp_entry\n"
    "kiln_setjmp_entry:\n"
    "xor %edx, %edx\n"
    "jmp *kiln_msvcrt_setjmp(%rip)\n");
extern void kiln_setjmp_entry(void);

/* mingw's printf to a stream (__mingw_vfprintf, what printf and fprintf in its headers
 * call) writes each character with msvcrt's fputc, and Wine's fputc writes the buffer out
 * at every "\n": a system call per line, through a pipe that Wine serves in its server
 * (~50 us each: 200,000 lines took 12 s instead of 0.4 s). These format with mingw's own
 * vsnprintf (the same conversions) and write the text with one fwrite, under the stream's
 * lock as mingw's does: the same bytes, the same count, buffered as the stream says.
 * The text fits its buffer: vsnprintf writes at most `sizeof small` bytes, and a longer
 * one is formatted again into an allocation of the length the first pass measured. */
static int kiln_vfprintf(FILE *stream, const char *fmt, va_list ap) {
    char small[1024];
    va_list again;
    va_copy(again, ap);
    int n = __mingw_vsnprintf(small, sizeof small, fmt, ap);
    char *text = small;
    if (n >= (int)sizeof small) {
        text = malloc((size_t)n + 1);
        if (text) __mingw_vsnprintf(text, (size_t)n + 1, fmt, again);
        else n = -1;
    }
    va_end(again);
    if (n < 0) return n;
    _lock_file(stream);
    size_t put = fwrite(text, 1, (size_t)n, stream);
    _unlock_file(stream);
    if (text != small) free(text);
    return put == (size_t)n ? n : -1;
}

static int kiln_vprintf(const char *fmt, va_list ap) {
    return kiln_vfprintf(stdout, fmt, ap);
}

static int kiln_fprintf(FILE *stream, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = kiln_vfprintf(stream, fmt, ap);
    va_end(ap);
    return n;
}

static int kiln_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = kiln_vfprintf(stdout, fmt, ap);
    va_end(ap);
    return n;
}

/* The statically linked functions of the executor that mingw-compiled code calls
 * (libgcc's and libmingwex's, which a native link takes from the same archives), each
 * declared under a name of its own bound to the symbol (an asm label), so that the
 * headers' declarations of some of them, dllimport or not, do not get in the way. */
#define STATIC_RUNTIME(X)                                                                   \
    X(___chkstk_ms) X(___chkstk) X(__acrt_iob_func)                                          \
    X(__mingw_sprintf) X(__mingw_snprintf) X(__mingw_asprintf) X(__mingw_vsprintf)            \
    X(__mingw_vsnprintf) X(__mingw_vasprintf)                                                 \
    X(__mingw_scanf) X(__mingw_fscanf) X(__mingw_sscanf) X(__mingw_vscanf)                    \
    X(__mingw_vfscanf) X(__mingw_vsscanf)                                                     \
    X(__mingw_wprintf) X(__mingw_fwprintf) X(__mingw_swprintf) X(__mingw_snwprintf)           \
    X(__mingw_vwprintf) X(__mingw_vfwprintf) X(__mingw_vswprintf) X(__mingw_vsnwprintf)       \
    X(__mingw_wscanf) X(__mingw_fwscanf) X(__mingw_swscanf) X(__mingw_vwscanf)                \
    X(__mingw_vfwscanf) X(__mingw_vswscanf)                                                   \
    X(__mingw_strtod) X(__mingw_strtof) X(__mingw_strtold)                                    \
    X(__mingw_wcstod) X(__mingw_wcstof) X(__mingw_wcstold)                                    \
    X(strtoll) X(strtoull) X(atoll) X(llabs) X(lldiv)                                         \
    X(round) X(roundf) X(lround) X(llround) X(trunc) X(truncf) X(rint) X(lrint) X(llrint)      \
    X(nearbyint) X(fmin) X(fmax) X(fminf) X(fmaxf) X(fdim) X(fma) X(fmaf) X(remainder)        \
    X(remquo) X(cbrt) X(log2) X(log2f) X(exp2) X(expm1) X(log1p) X(asinh) X(acosh) X(atanh)   \
    X(erf) X(erfc) X(tgamma) X(lgamma) X(scalbn) X(ilogb) X(logb) X(hypotf) X(nan) X(nanf)    \
    X(__fpclassify) X(__isnan) X(__isnanf) X(__signbit)                                       \
    X(__divti3) X(__modti3) X(__udivti3) X(__umodti3) X(__udivmodti4) X(__multi3)             \
    X(__floattidf) X(__floatuntidf) X(__floattisf) X(__floatuntisf)                           \
    X(__fixdfti) X(__fixunsdfti) X(__fixsfti) X(__fixunssfti) X(__popcountdi2)

#define DECLARE_STATIC(name) extern void kiln_static_##name(void) __asm__(#name);
STATIC_RUNTIME(DECLARE_STATIC)

struct runtime_symbol {
    const char *name;
    void (*address)(void);
};

#define STATIC_ENTRY(name) {#name, kiln_static_##name},
static const struct runtime_symbol runtime_symbols[] = {
    {"__main", kiln_main_noop},
    {"__chkstk_ms", kiln_static____chkstk_ms}, /* the probe under its other spelling */
    {"exit", (void (*)(void))kiln_exit},
    {"atexit", (void (*)(void))kiln_atexit},
    {"_onexit", (void (*)(void))kiln_onexit},
    {"_exit", (void (*)(void))kiln__exit},
    {"abort", kiln_abort},
    {"_setjmp", kiln_setjmp_entry},
    {"_setjmpex", kiln_setjmp_entry},
    {"__mingw_vfprintf", (void (*)(void))kiln_vfprintf},
    {"__mingw_vprintf", (void (*)(void))kiln_vprintf},
    {"__mingw_fprintf", (void (*)(void))kiln_fprintf},
    {"__mingw_printf", (void (*)(void))kiln_printf},
    STATIC_RUNTIME(STATIC_ENTRY)
};
#define RUNTIME_SYMBOLS (sizeof runtime_symbols / sizeof *runtime_symbols)

/* ---- symbols ------------------------------------------------------------------------- */

/* Names a native mingw link takes from msvcrt.dll under another name: mingw-w64's import
 * library (libmsvcrt.a, mingw-w64 10) has a stub `open` that imports `_open`, and so on —
 * POSIX's old names, `time` as `_time64`, stat's 64-bit variants, MS's own printf. Every
 * stub of that library whose name differs from the export it imports. */
static const struct {
    const char *name, *export;
} msvcrt_aliases[] = {
    {"__ms_fprintf", "fprintf"}, {"__ms_fscanf", "fscanf"}, {"__ms_fwprintf", "fwprintf"},
    {"__ms_fwscanf", "fwscanf"}, {"__ms_printf", "printf"}, {"__ms_scanf", "scanf"},
    {"__ms_sprintf", "sprintf"}, {"__ms_sscanf", "sscanf"}, {"__ms_swprintf", "swprintf"},
    {"__ms_swscanf", "swscanf"}, {"__ms_vfprintf", "vfprintf"},
    {"__ms_vfwprintf", "vfwprintf"}, {"__ms_vprintf", "vprintf"},
    {"__ms_vsprintf", "vsprintf"}, {"__ms_vswprintf", "vswprintf"},
    {"__ms_vwprintf", "vwprintf"}, {"__ms_wprintf", "wprintf"}, {"__ms_wscanf", "wscanf"},
    {"_findfirst64i32", "_findfirst"}, {"_findnext64i32", "_findnext"},
    {"_fstat64i32", "_fstat"}, {"_ftime_s", "_ftime64_s"}, {"_stat64i32", "_stat"},
    {"_swprintf", "swprintf"}, {"_wfindfirst64i32", "_wfindfirst"},
    {"_wfindnext64i32", "_wfindnext"}, {"_wstat64i32", "_wstat"}, {"access", "_access"},
    {"chdir", "_chdir"}, {"chgsign", "_chgsign"}, {"chmod", "_chmod"},
    {"chsize", "_chsize"}, {"close", "_close"}, {"creat", "_creat"}, {"cwait", "_cwait"},
    {"daylight", "_daylight"}, {"dup", "_dup"}, {"dup2", "_dup2"}, {"ecvt", "_ecvt"},
    {"eof", "_eof"}, {"execl", "_execl"}, {"execle", "_execle"}, {"execlp", "_execlp"},
    {"execlpe", "_execlpe"}, {"execv", "_execv"}, {"execve", "_execve"},
    {"execvp", "_execvp"}, {"execvpe", "_execvpe"}, {"fcvt", "_fcvt"},
    {"fdopen", "_fdopen"}, {"fgetchar", "_fgetchar"}, {"fgetwchar", "_fgetwchar"},
    {"filelength", "_filelength"}, {"fileno", "_fileno"}, {"finite", "_finite"},
    {"fpclass", "_fpclass"}, {"fputchar", "_fputchar"}, {"fputwchar", "_fputwchar"},
    {"gcvt", "_gcvt"}, {"getch", "_getch"}, {"getche", "_getche"}, {"getcwd", "_getcwd"},
    {"getpid", "_getpid"}, {"getw", "_getw"}, {"heapwalk", "_heapwalk"},
    {"hypot", "_hypot"}, {"isascii", "__isascii"}, {"isatty", "_isatty"},
    {"iscsym", "__iscsym"}, {"iscsymf", "__iscsymf"}, {"itoa", "_itoa"}, {"j0", "_j0"},
    {"j1", "_j1"}, {"jn", "_jn"}, {"kbhit", "_kbhit"}, {"lfind", "_lfind"},
    {"lsearch", "_lsearch"}, {"lseek", "_lseek"}, {"ltoa", "_ltoa"},
    {"memccpy", "_memccpy"}, {"memicmp", "_memicmp"}, {"mkdir", "_mkdir"},
    {"mktemp", "_mktemp"}, {"nextafter", "_nextafter"}, {"open", "_open"},
    {"pclose", "_pclose"}, {"popen", "_popen"}, {"putch", "_putch"}, {"putenv", "_putenv"},
    {"putw", "_putw"}, {"read", "_read"}, {"rmdir", "_rmdir"}, {"rmtmp", "_rmtmp"},
    {"searchenv", "_searchenv"}, {"setmode", "_setmode"}, {"snwprintf", "_snwprintf"},
    {"sopen", "_sopen"}, {"spawnl", "_spawnl"}, {"spawnle", "_spawnle"},
    {"spawnlp", "_spawnlp"}, {"spawnlpe", "_spawnlpe"}, {"spawnv", "_spawnv"},
    {"spawnve", "_spawnve"}, {"spawnvp", "_spawnvp"}, {"spawnvpe", "_spawnvpe"},
    {"strcasecmp", "_stricmp"}, {"strcmpi", "_strcmpi"}, {"strdup", "_strdup"},
    {"stricmp", "_stricmp"}, {"stricoll", "_stricoll"}, {"strlwr", "_strlwr"},
    {"strncasecmp", "_strnicmp"}, {"strnicmp", "_strnicmp"}, {"strnset", "_strnset"},
    {"strrev", "_strrev"}, {"strset", "_strset"}, {"strupr", "_strupr"}, {"swab", "_swab"},
    {"tell", "_tell"}, {"tempnam", "_tempnam"}, {"time", "_time64"},
    {"timezone", "_timezone"}, {"toascii", "__toascii"}, {"tzname", "_tzname"},
    {"tzset", "_tzset"}, {"umask", "_umask"}, {"ungetch", "_ungetch"},
    {"unlink", "_unlink"}, {"utime", "_utime"}, {"vsnprintf_s", "_vsnprintf_s"},
    {"vsnwprintf", "_vsnwprintf"}, {"wcscmpi", "_wcsicmp"}, {"wcsdup", "_wcsdup"},
    {"wcsicmp", "_wcsicmp"}, {"wcsicoll", "_wcsicoll"}, {"wcslwr", "_wcslwr"},
    {"wcsnicmp", "_wcsnicmp"}, {"wcsnset", "_wcsnset"}, {"wcsrev", "_wcsrev"},
    {"wcsset", "_wcsset"}, {"wcsupr", "_wcsupr"}, {"wpopen", "_wpopen"},
    {"write", "_write"}, {"y0", "_y0"}, {"y1", "_y1"}, {"yn", "_yn"},
};
#define MSVCRT_ALIASES (sizeof msvcrt_aliases / sizeof *msvcrt_aliases)

static HMODULE libraries[MAX_LIBRARIES];
static char *library_paths[MAX_LIBRARIES];
static int library_count;

/* 1 (function) if `address` lies in executable pages — a module's code sections — else 2
 * (data). VirtualQuery only reads the system's record of the address space. */
static uint8_t kind_of(uint64_t address) {
    MEMORY_BASIC_INFORMATION m;
    if (VirtualQuery((void *)(uintptr_t)address, &m, sizeof m) == 0 || m.State != MEM_COMMIT) return 0;
    DWORD p = m.Protect & 0xff;
    return (p == PAGE_EXECUTE || p == PAGE_EXECUTE_READ || p == PAGE_EXECUTE_READWRITE || p == PAGE_EXECUTE_WRITECOPY) ? 1 : 2;
}

/* (address, kind: 0 unknown, 1 function, 2 data) of `name` in library `lib` (0: the
 * process: the runtime symbols, msvcrt.dll's exports under the names of its import
 * library, then msvcrt.dll, ucrtbase.dll, kernel32.dll, then each DLL LoadLibrary loaded,
 * in load order). */
static void lookup(uint64_t lib, const char *name, uint64_t *address, uint8_t *kind) {
    FARPROC p = NULL;
    *address = 0;
    *kind = 0;
    if (lib == 0) {
        for (size_t i = 0; i < RUNTIME_SYMBOLS; i++)
            if (strcmp(runtime_symbols[i].name, name) == 0) {
                *address = (uint64_t)(uintptr_t)runtime_symbols[i].address;
                *kind = 1;
                return;
            }
        for (size_t i = 0; i < MSVCRT_ALIASES && !p; i++)
            if (strcmp(msvcrt_aliases[i].name, name) == 0) p = GetProcAddress(msvcrt, msvcrt_aliases[i].export);
        HMODULE system[] = {msvcrt, ucrt, kernel32};
        for (size_t i = 0; i < 3 && !p; i++)
            if (system[i]) p = GetProcAddress(system[i], name);
        for (int i = 0; i < library_count && !p; i++) p = GetProcAddress(libraries[i], name);
    } else {
        p = GetProcAddress(libraries[lib - 1], name);
    }
    if (!p) return;
    *address = (uint64_t)(uintptr_t)p;
    *kind = kind_of(*address);
}

static int known_library(uint64_t lib) {
    return lib <= (uint64_t)library_count;
}

static void do_lookup(uint32_t id, struct reader *r) {
    uint64_t lib = rd_u64(r, "library");
    char *name = rd_string(r, "name");
    if (r->bad || r->left) {
        free(name);
        return reply_error(id, "malformed Lookup: %s", r->bad ? r->bad : "trailing bytes");
    }
    if (!known_library(lib)) {
        free(name);
        return reply_error(id, "no library with handle %llu", (unsigned long long)lib);
    }
    uint64_t address;
    uint8_t kind;
    lookup(lib, name, &address, &kind);
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
    if (!r->bad && !known_library(lib)) return reply_error(id, "no library with handle %llu", (unsigned long long)lib);
    struct writer w = {0};
    wr_u8(&w, A_SYMBOLS);
    wr_u32(&w, n);
    for (uint32_t i = 0; i < n && !r->bad; i++) {
        char *name = rd_string(r, "name");
        uint64_t address = 0;
        uint8_t kind = 0;
        if (name) lookup(lib, name, &address, &kind);
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
    HMODULE handle = LoadLibraryA(path);
    if (!handle) {
        char why[256];
        reply_error(id, "LoadLibrary %s: %s", path, win_error(GetLastError(), why, sizeof why));
        free(path);
        return;
    }
    libraries[library_count] = handle;
    library_paths[library_count] = path;
    reply_value(id, (uint64_t)++library_count);
}

/* ---- the program's standard streams -------------------------------------------------- */

/* Pipes: the program's stdout and stderr (CRT descriptors 1 and 2, and the process's
 * standard handles) are write ends whose read ends the forwarder polls; its stdin's read
 * end is descriptor 0, fed by Input messages through `in_write`. */
static HANDLE out_read[2], in_write;
static HANDLE output_wakeup; /* set by drain_output: the forwarder looks at once */
static atomic_int forwarding_busy;
static int (*ucrt_fflush)(FILE *); /* ucrtbase.dll's own streams, when it is loaded */

/* Flushes the program's stdio buffers: msvcrt's (the executor's and JIT code's C runtime)
 * and ucrtbase's. */
static void flush_all(void) {
    fflush(NULL);
    if (ucrt_fflush) ucrt_fflush(NULL);
}

static DWORD pending(HANDLE pipe) {
    DWORD n = 0;
    return PeekNamedPipe(pipe, NULL, 0, NULL, &n, NULL) ? n : 0;
}

/* The forwarder: anonymous pipes cannot be waited on, so it polls them with PeekNamedPipe,
 * and reads only what is there (a read that blocked would hide bytes taken from the pipe
 * from drain_output), at most its buffer's size. `forwarding_busy` is set before the read
 * takes bytes out, cleared after their Output frame went out: "pipes empty and not busy"
 * means all was sent. */
static DWORD WINAPI forward_output(void *unused) {
    (void)unused;
    static uint8_t buf[65536];
    unsigned idle = 0;
    for (;;) {
        int moved = 0;
        for (int i = 0; i < 2; i++) {
            DWORD n = pending(out_read[i]);
            if (n == 0) continue;
            atomic_store(&forwarding_busy, 1);
            DWORD k = 0;
            if (ReadFile(out_read[i], buf, n < sizeof buf ? n : sizeof buf, &k, NULL) && k > 0) {
                struct writer w = {0};
                wr_u8(&w, A_OUTPUT);
                wr_u8(&w, (uint8_t)(i + 1));
                wr_bytes(&w, buf, k);
                send_frame(0, &w);
                free(w.p);
            }
            atomic_store(&forwarding_busy, 0);
            moved = 1;
        }
        /* Quick while output flows; after a quiet while, a look every 10 ms (or at once
         * when drain_output asks). */
        idle = moved ? 0 : idle + 1;
        if (!moved) WaitForSingleObject(output_wakeup, idle < 200 ? 1 : 10);
    }
    return 0;
}

/* Whether everything that reached the pipes was sent. Reads the pipes first, then
 * `forwarding_busy` (see forward_output). */
static int output_sent(void) {
    return pending(out_read[0]) == 0 && pending(out_read[1]) == 0 && !atomic_load(&forwarding_busy);
}

/* Waits until everything the program wrote has been sent (a second at most). */
static void drain_output(void) {
    if (!out_read[0]) return;
    flush_all();
    SetEvent(output_wakeup);
    for (int i = 0; i < 1000 && !output_sent(); i++) Sleep(1);
}

/* Input the program has not taken yet, and whether its end has come: the feeder thread
 * writes it into the stdin pipe (which blocks while the program does not read), so the
 * thread reading the connection never blocks on it. */
static SRWLOCK input_lock = SRWLOCK_INIT;
static CONDITION_VARIABLE input_ready = CONDITION_VARIABLE_INIT;
static struct writer input_queue;
static int input_ended;

static DWORD WINAPI feed_input(void *unused) {
    (void)unused;
    AcquireSRWLockExclusive(&input_lock);
    for (;;) {
        while (input_queue.len == 0 && !input_ended) SleepConditionVariableSRW(&input_ready, &input_lock, INFINITE, 0);
        if (input_queue.len == 0) break; /* the end of input, all given */
        struct writer batch = input_queue;
        input_queue = (struct writer){0};
        ReleaseSRWLockExclusive(&input_lock);
        for (size_t at = 0; at < batch.len;) {
            DWORD k = 0;
            if (!WriteFile(in_write, batch.p + at, (DWORD)(batch.len - at), &k, NULL) || k == 0) break;
            at += k;
        }
        free(batch.p);
        AcquireSRWLockExclusive(&input_lock);
    }
    ReleaseSRWLockExclusive(&input_lock);
    /* The last write end: the program reads the end of its input. */
    CloseHandle(in_write);
    return 0;
}

static void give_input(struct reader *r) {
    uint32_t len;
    const uint8_t *bytes = rd_bytes(r, &len, "bytes");
    if (r->bad || !in_write) return;
    AcquireSRWLockExclusive(&input_lock);
    if (!input_ended) {
        if (len == 0) input_ended = 1;
        else wr_raw(&input_queue, bytes, len);
        WakeConditionVariable(&input_ready);
    }
    ReleaseSRWLockExclusive(&input_lock);
}

/* Makes `h` CRT descriptor `fd` (0-2) and the standard handle `which`, in text mode, as
 * a native program's standard streams are: the controller gets what the program would
 * write to a pipe on Windows ("\n" as "\r\n", wide characters in the code page, not
 * UTF-16), and input's "\r\n" reads as "\n". Inheritable: a program's children share its
 * standard streams, as natively. */
static int install_std(int fd, HANDLE h, DWORD which, int flags) {
    int tmp = _open_osfhandle((intptr_t)h, flags | _O_TEXT);
    if (tmp < 0) return 0;
    if (tmp != fd) {
        if (_dup2(tmp, fd) != 0) return 0;
        _close(tmp);
    }
    HANDLE now = (HANDLE)_get_osfhandle(fd);
    SetHandleInformation(now, HANDLE_FLAG_INHERIT, HANDLE_FLAG_INHERIT);
    SetStdHandle(which, now);
    return 1;
}

static void setup_stdio(void) {
    /* The executor's own log keeps the stderr it was started with. */
    HANDLE err = GetStdHandle(STD_ERROR_HANDLE);
    if (!DuplicateHandle(GetCurrentProcess(), err, GetCurrentProcess(), &log_handle, 0, FALSE, DUPLICATE_SAME_ACCESS))
        log_handle = err;
    HANDLE out_write[2], in_read;
    if (!CreatePipe(&out_read[0], &out_write[0], NULL, 1 << 16) || !CreatePipe(&out_read[1], &out_write[1], NULL, 1 << 16) ||
        !CreatePipe(&in_read, &in_write, NULL, 1 << 16)) {
        logf_("kiln-executor-c: pipes: error %lu\n", (unsigned long)GetLastError());
        quit(71);
    }
    fflush(NULL);
    if (!install_std(1, out_write[0], STD_OUTPUT_HANDLE, _O_WRONLY) || !install_std(2, out_write[1], STD_ERROR_HANDLE, _O_WRONLY) ||
        !install_std(0, in_read, STD_INPUT_HANDLE, _O_RDONLY)) {
        logf_("kiln-executor-c: the program's standard streams could not be made pipes\n");
        quit(71);
    }
    /* stderr unbuffered, as C wants it (Wine's msvcrt buffers it): what a program writes
     * there before it crashes — assert's message before its abort — is not left behind in
     * a buffer (natively, Wine's msvcrt flushes it as the process ends; a crash report
     * ends this one without). */
    setvbuf(stderr, NULL, _IONBF, 0);
    output_wakeup = CreateEventW(NULL, FALSE, FALSE, NULL);
    HANDLE t = CreateThread(NULL, 256 << 10, forward_output, NULL, STACK_SIZE_PARAM_IS_A_RESERVATION, NULL);
    HANDLE f = CreateThread(NULL, 256 << 10, feed_input, NULL, STACK_SIZE_PARAM_IS_A_RESERVATION, NULL);
    if (!t || !f || !output_wakeup) {
        logf_("kiln-executor-c: the forwarding threads could not start\n");
        quit(71);
    }
    CloseHandle(t);
    CloseHandle(f);
}

/* ---- exits and crashes ----------------------------------------------------------------- */

/* Takes the send lock for good (waiting a second at most for a frame in flight): the
 * frames after it would come after the executor's end. */
static void hold_send_lock(void) {
    for (int i = 0; i < 1000 && !TryAcquireSRWLockExclusive(&send_lock); i++) Sleep(1);
}

/* A frame `len, id 0, tag, fields`, built on the stack and sent as is: a crash report
 * must not allocate (the heap's lock may be held by the thread that died). The callers'
 * fields (4 or 20 bytes) fit the 64-byte frame. */
static void report(uint8_t tag, const uint8_t *fields, size_t n) {
    uint8_t frame[64] = {0};
    uint32_t len = (uint32_t)(5 + n);
    for (int i = 0; i < 4; i++) frame[i] = (uint8_t)(len >> (8 * i));
    frame[8] = tag;
    memcpy(frame + 9, fields, n);
    (void)write_all(frame, 9 + n);
}

/* Writes `v` little-endian into the `bytes` bytes at `at` (inside the caller's array). */
static void put_le(uint8_t *at, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) at[i] = (uint8_t)(v >> (8 * i));
}

static void report_exit(uint32_t status) {
    uint8_t fields[4];
    put_le(fields, status, 4);
    hold_send_lock();
    report(A_EXITED, fields, sizeof fields);
    shutdown(sock, SD_SEND);
}

/* The executor's atexit handler, registered before any of the program's: runs last. */
static void on_program_exit(void) {
    if (!atomic_load(&exit_requested) || atomic_load(&running_code) == 0) return;
    drain_output();
    report_exit(exit_status);
}

/* A crash is reported by a thread of its own, with a whole stack (the crashed thread may
 * have overflowed its own), while the crashed thread waits for the end. */
static HANDLE crash_event;
static volatile LONG crash_claimed;
static uint32_t crash_signal, crash_code;
static uint64_t crash_fault, crash_pc;

static void report_crash(void) {
    /* What the program wrote before it died goes out first: the forwarder runs on while
     * this waits (a second at most) for the pipes to empty. No flush of the program's
     * buffers (their locks may be held by the thread that died), as natively. */
    for (int i = 0; i < 1000 && out_read[0] && !output_sent(); i++) Sleep(1);
    uint8_t fields[24];
    put_le(fields, crash_signal, 4);
    put_le(fields + 4, crash_fault, 8);
    put_le(fields + 12, crash_pc, 8);
    put_le(fields + 20, crash_code, 4); /* the exception code the signal stands for */
    hold_send_lock();
    report(A_CRASHED, fields, sizeof fields);
    shutdown(sock, SD_SEND);
    quit(128 + crash_signal);
}

static DWORD WINAPI crash_reporter(void *unused) {
    (void)unused;
    WaitForSingleObject(crash_event, INFINITE);
    report_crash();
    return 0;
}

__attribute__((noreturn)) static void crash(uint32_t signal, uint32_t code, uint64_t fault, uint64_t pc) {
    if (InterlockedCompareExchange(&crash_claimed, 1, 0) == 0) {
        crash_signal = signal;
        crash_code = code;
        crash_fault = fault;
        crash_pc = pc;
        if (!crash_event || !SetEvent(crash_event)) report_crash();
    }
    /* The reporter ends the process; a second crash waits for it too. */
    for (;;) Sleep(INFINITE);
}

/* The signal a fatal hardware exception stands for, as Linux would have sent it; 0 for
 * the exceptions that are no crash (C++ and SEH exceptions a program raises and handles
 * itself: MSVC's 0xE06D7363, gcc's 0x20474343, debugger notices). */
static uint32_t fatal_signal(DWORD code) {
    switch (code) {
    case EXCEPTION_ACCESS_VIOLATION:
    case EXCEPTION_STACK_OVERFLOW:
    case EXCEPTION_ARRAY_BOUNDS_EXCEEDED:
        return 11; /* SIGSEGV */
    case EXCEPTION_IN_PAGE_ERROR:
    case EXCEPTION_DATATYPE_MISALIGNMENT:
        return 7; /* SIGBUS */
    case EXCEPTION_ILLEGAL_INSTRUCTION:
    case EXCEPTION_PRIV_INSTRUCTION:
        return 4; /* SIGILL */
    case EXCEPTION_INT_DIVIDE_BY_ZERO:
    case EXCEPTION_INT_OVERFLOW:
    case EXCEPTION_FLT_DIVIDE_BY_ZERO:
    case EXCEPTION_FLT_INVALID_OPERATION:
    case EXCEPTION_FLT_OVERFLOW:
    case EXCEPTION_FLT_UNDERFLOW:
    case EXCEPTION_FLT_INEXACT_RESULT:
    case EXCEPTION_FLT_DENORMAL_OPERAND:
    case EXCEPTION_FLT_STACK_CHECK:
        return 8; /* SIGFPE */
    case EXCEPTION_BREAKPOINT:
    case EXCEPTION_SINGLE_STEP:
        return 5; /* SIGTRAP */
    default:
        return 0;
    }
}

static uint64_t fault_address(const EXCEPTION_RECORD *rec) {
    if ((rec->ExceptionCode == EXCEPTION_ACCESS_VIOLATION || rec->ExceptionCode == EXCEPTION_IN_PAGE_ERROR) && rec->NumberParameters >= 2)
        return rec->ExceptionInformation[1];
    return 0;
}

/* Whether a frame-based handler (SEH: __try, a C++ catch's personality) stands between
 * the faulting instruction and the first frame of JIT code, so that the exception may be
 * handled and must go on to the system's dispatch. Walks the faulting thread's frames as
 * the dispatcher would, with the modules' unwind tables (RtlVirtualUnwind), on a copy of
 * the context. JIT code has no unwind tables: the dispatcher cannot walk through its
 * frames, so a handler beyond them is never reached properly, and the walk stops there.
 * Safe: every stack read (the unwinder's and the leaf return address) is at an aligned
 * stack pointer checked to lie in this thread's stack. */
static int handler_before_jit_code(const CONTEXT *fault) {
    CONTEXT c = *fault;
    ULONG_PTR low = 0, high = 0;
    GetCurrentThreadStackLimits(&low, &high);
    for (int depth = 0; depth < 256; depth++) {
        if (c.Rip == 0 || holding(c.Rip, 1)) return 0;
        if (c.Rsp < low || c.Rsp + 8 > high || c.Rsp % 8) return 0;
        DWORD64 base = 0;
        PRUNTIME_FUNCTION f = RtlLookupFunctionEntry(c.Rip, &base, NULL);
        if (!f) {
            void *module = NULL;
            /* Code of no module (JIT code outside reservations, a thunk): nothing to unwind. */
            if (!RtlPcToFileHeader((void *)(uintptr_t)c.Rip, &module) || !module) return 0;
            /* A leaf function of a module: its return address is on top of the stack. */
            c.Rip = *(const DWORD64 *)(uintptr_t)c.Rsp;
            c.Rsp += 8;
            continue;
        }
        void *data = NULL;
        DWORD64 frame = 0;
        if (RtlVirtualUnwind(UNW_FLAG_EHANDLER, base, c.Rip, f, &c, &data, &frame, NULL)) return 1;
    }
    return 0;
}

/* The crash being looked at on this thread (a thread-local slot; TlsGetValue allocates
 * nothing): a fault in the walk itself reports the crash it was looking at. */
static DWORD walk_slot = TLS_OUT_OF_INDEXES;
struct fault_info {
    uint32_t signal, code;
    uint64_t fault, pc;
};

/* The first handler of every exception, before any frame's (AddVectoredExceptionHandler
 * with first = 1): a fatal hardware exception is a crash, unless a frame handler ahead of
 * the JIT code may handle it. Frame-based dispatch could not be left to find out: it
 * cannot walk through frames of JIT code, which have no unwind tables. */
static LONG CALLBACK on_exception(EXCEPTION_POINTERS *ep) {
    const EXCEPTION_RECORD *rec = ep->ExceptionRecord;
    uint32_t signal = fatal_signal(rec->ExceptionCode);
    if (!signal) return EXCEPTION_CONTINUE_SEARCH;
    DWORD saved_error = GetLastError();
    struct fault_info *outer = walk_slot != TLS_OUT_OF_INDEXES ? TlsGetValue(walk_slot) : NULL;
    if (outer) crash(outer->signal, outer->code, outer->fault, outer->pc);
    uint64_t pc = (uint64_t)(uintptr_t)rec->ExceptionAddress;
    /* A stack overflow has no stack left to walk on: a crash at once (the thread's stack
     * guarantee keeps room for this handler). */
    if (rec->ExceptionCode != EXCEPTION_STACK_OVERFLOW && walk_slot != TLS_OUT_OF_INDEXES) {
        struct fault_info info = {signal, (uint32_t)rec->ExceptionCode, fault_address(rec), pc};
        TlsSetValue(walk_slot, &info);
        int handled_maybe = handler_before_jit_code(ep->ContextRecord);
        TlsSetValue(walk_slot, NULL);
        if (handled_maybe) {
            SetLastError(saved_error);
            return EXCEPTION_CONTINUE_SEARCH;
        }
    }
    crash(signal, (uint32_t)rec->ExceptionCode, fault_address(rec), pc);
}

/* What the frame handlers left unhandled (the dispatch reached a thread's first frame):
 * a crash, but for C++ exceptions, which go to the C runtime's own filter first (mingw's
 * continues gcc's, whose runtime then calls std::terminate: abort, a crash of signal 6). */
static LPTOP_LEVEL_EXCEPTION_FILTER previous_filter;

static LONG WINAPI on_unhandled(EXCEPTION_POINTERS *ep) {
    const EXCEPTION_RECORD *rec = ep->ExceptionRecord;
    uint32_t signal = fatal_signal(rec->ExceptionCode);
    if (!signal && previous_filter) {
        LONG action = previous_filter(ep);
        if (action == EXCEPTION_CONTINUE_EXECUTION) return action;
    }
    crash(signal ? signal : 6, (uint32_t)rec->ExceptionCode, fault_address(rec), (uint64_t)(uintptr_t)rec->ExceptionAddress);
}

/* msvcrt's own abort() (assert, a failed check of its own) raises SIGABRT. */
static void on_abort_signal(int unused) {
    (void)unused;
    crash(6, 0, 0, 0);
}

/* Room on the thread's stack for the exception handler after a stack overflow. */
static void guarantee_stack(void) {
    ULONG size = 64 * 1024;
    SetThreadStackGuarantee(&size);
}

static void setup_crash_reports(void) {
    walk_slot = TlsAlloc();
    crash_event = CreateEventW(NULL, TRUE, FALSE, NULL);
    HANDLE t = crash_event ? CreateThread(NULL, 256 << 10, crash_reporter, NULL, STACK_SIZE_PARAM_IS_A_RESERVATION, NULL) : NULL;
    if (t) CloseHandle(t);
    else if (crash_event) {
        CloseHandle(crash_event);
        crash_event = NULL; /* crash() reports on the crashed thread */
    }
    AddVectoredExceptionHandler(1, on_exception);
    previous_filter = SetUnhandledExceptionFilter(on_unhandled);
    signal(SIGABRT, on_abort_signal);
    guarantee_stack();
}

/* ---- running JIT code off the reading thread ------------------------------------------- */

static char *empty_argv[] = {"kiln", NULL};

/* RegisterEhFrame / DeregisterEhFrame: Windows unwinds with its own tables (RUNTIME_FUNCTION
 * entries, RtlAddFunctionTable), not with .eh_frame; making them from a module's unwind
 * data is a later step. The request is checked, answered Ok, and nothing is registered
 * (Kiln does not send it to Windows executors). */
static void do_eh_frame(uint32_t id, struct reader *r) {
    uint64_t address = rd_u64(r, "address");
    if (r->bad || r->left) return reply_error(id, "malformed eh_frame request: %s", r->bad ? r->bad : "trailing bytes");
    if (!prepared(address, 4, -1)) return reply_error(id, "eh_frame at %#llx is not in prepared memory", (unsigned long long)address);
    reply_simple(id, A_OK);
}

/* RegisterUnwindInfo / DeregisterUnwindInfo: a module's Windows unwind data (made by the
 * controller from its .eh_frame), copied into memory of the executor's own and registered
 * with RtlAddFunctionTable, so that the system's unwinder — crash reports, debuggers,
 * CaptureStackBackTrace, longjmp and exceptions — walks through JIT frames. The entries'
 * addresses are 32-bit offsets from one base below every function and below the copy, so
 * the copy goes within 4 GiB of the functions (tried above them, then below). */
#define MAX_UNWIND_TABLES 4096
static struct {
    PRUNTIME_FUNCTION table;
    void *block;
} unwind_tables[MAX_UNWIND_TABLES];

static int by_begin(const void *a, const void *b) {
    DWORD x = ((const RUNTIME_FUNCTION *)a)->BeginAddress, y = ((const RUNTIME_FUNCTION *)b)->BeginAddress;
    return (x > y) - (x < y);
}

/* Memory for `size` bytes whose span with [lo, hi) stays below 4 GiB. */
static void *unwind_block(uint64_t lo, uint64_t hi, uint64_t size) {
    const uint64_t step = 1 << 20, reach = (uint64_t)1 << 32;
    for (uint64_t at = align_up(hi, 1 << 16); at + size - lo < reach; at += step) {
        void *p = VirtualAlloc((void *)(uintptr_t)at, size, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
        if (p) return p;
    }
    for (uint64_t at = (lo & ~(uint64_t)0xffff) - align_up(size, 1 << 16); at > step && hi - at < reach; at -= step) {
        void *p = VirtualAlloc((void *)(uintptr_t)at, size, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
        if (p) return p;
    }
    return NULL;
}

static void do_register_unwind_info(uint32_t id, struct reader *r) {
    uint32_t n = rd_count(r, 20, "functions");
    uint64_t *begin = calloc(n ? n : 1, sizeof *begin), *end = calloc(n ? n : 1, sizeof *end);
    const uint8_t **info = calloc(n ? n : 1, sizeof *info);
    uint32_t *len = calloc(n ? n : 1, sizeof *len);
    int slot = -1;
    for (int i = 0; i < MAX_UNWIND_TABLES && slot < 0; i++)
        if (!unwind_tables[i].table) slot = i;
    const char *bad = NULL;
    uint64_t lo = UINT64_MAX, hi = 0, size = (uint64_t)n * sizeof(RUNTIME_FUNCTION);
    if (!begin || !end || !info || !len) bad = "out of memory";
    for (uint32_t i = 0; !bad && i < n; i++) {
        begin[i] = rd_u64(r, "begin");
        end[i] = rd_u64(r, "end");
        info[i] = rd_bytes(r, &len[i], "unwind_info");
        if (r->bad) break;
        /* Version 1, then the header and its codes: a multiple of 4 bytes. */
        if (begin[i] >= end[i] || !runnable(begin[i]) || !runnable(end[i] - 1))
            bad = "a function that is not code this executor prepared to run";
        else if (len[i] < 4 || len[i] % 4 || info[i][0] != 1 || len[i] < 4 + 2 * (uint32_t)info[i][2])
            bad = "an UNWIND_INFO that is not version 1, without handler or chain, with its codes";
        lo = begin[i] < lo ? begin[i] : lo;
        hi = end[i] > hi ? end[i] : hi;
        size += len[i];
    }
    if (!bad && (r->bad || r->left)) bad = r->bad ? r->bad : "trailing bytes";
    if (!bad && n == 0) bad = "no function";
    if (!bad && slot < 0) bad = "too many unwind tables";
    if (!bad && hi - lo >= ((uint64_t)1 << 32)) bad = "functions more than 4 GiB apart";
    void *block = bad ? NULL : unwind_block(lo, hi, size);
    if (!bad && !block) bad = "no memory within 4 GiB of the functions";
    if (!bad) {
        /* The copy: the entries (sorted, as the unwinder's search needs), then the infos. */
        uint64_t base = (uint64_t)(uintptr_t)block < lo ? (uint64_t)(uintptr_t)block : lo;
        RUNTIME_FUNCTION *table = block;
        uint8_t *at = (uint8_t *)block + (size_t)n * sizeof *table;
        for (uint32_t i = 0; i < n; i++) {
            memcpy(at, info[i], len[i]);
            table[i].BeginAddress = (DWORD)(begin[i] - base);
            table[i].EndAddress = (DWORD)(end[i] - base);
            table[i].UnwindData = (DWORD)((uint64_t)(uintptr_t)at - base);
            at += len[i];
        }
        qsort(table, n, sizeof *table, by_begin);
        DWORD old;
        VirtualProtect(block, size, PAGE_READONLY, &old);
        if (!RtlAddFunctionTable(table, n, base)) {
            VirtualFree(block, 0, MEM_RELEASE);
            bad = "RtlAddFunctionTable refused the table";
        } else {
            unwind_tables[slot].table = table;
            unwind_tables[slot].block = block;
        }
    }
    free(begin);
    free(end);
    free(info);
    free(len);
    if (bad) return reply_error(id, "RegisterUnwindInfo: %s", bad);
    reply_value(id, (uint64_t)slot + 1);
}

static void do_deregister_unwind_info(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle");
    if (r->bad || r->left) return reply_error(id, "malformed DeregisterUnwindInfo: %s", r->bad ? r->bad : "trailing bytes");
    if (handle == 0 || handle > MAX_UNWIND_TABLES || !unwind_tables[handle - 1].table)
        return reply_error(id, "no unwind table with handle %llu", (unsigned long long)handle);
    RtlDeleteFunctionTable(unwind_tables[handle - 1].table);
    VirtualFree(unwind_tables[handle - 1].block, 0, MEM_RELEASE);
    unwind_tables[handle - 1].table = NULL;
    unwind_tables[handle - 1].block = NULL;
    reply_simple(id, A_OK);
}

/* The code of RunMain, Call, RunInitializers and RunFinalizers runs on a thread other than
 * the one that reads the connection: the code thread when it is idle, else a thread of its
 * own (8 MiB of stack each). The reading thread goes on serving the controller, and each
 * request's code sends its own answer when it returns. */
struct code_job {
    uint32_t id;
    uint8_t tag;
    uint64_t address;   /* Call, RunMain */
    uint64_t args[6];   /* Call */
    uint64_t *list;     /* RunInitializers, RunFinalizers */
    uint32_t n;
    char **argv;        /* RunMain */
    int argc;
};

static SRWLOCK jobs_lock = SRWLOCK_INIT;
static CONDITION_VARIABLE jobs_ready = CONDITION_VARIABLE_INIT;
static struct code_job *code_thread_job;
static int code_thread_state; /* 0 not started, 1 idle, 2 busy */
static atomic_int main_running;

#include "code_requests.h"

typedef uint64_t (*call6)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

/* Runs the job's code; its value (the call's, main's status). Every address was checked
 * to be code prepared read-execute before the job was started. */
static uint64_t run_code(struct code_job *job) {
    uint64_t value = 0;
    switch (job->tag) {
    case T_CALL: {
        /* The Win64 convention: the first four in rcx, rdx, r8, r9, the others on the
         * stack above the 32-byte home area: what this C call does. */
        const uint64_t *a = job->args;
        value = ((call6)(uintptr_t)job->address)(a[0], a[1], a[2], a[3], a[4], a[5]);
        break;
    }
    case T_RUN_INITIALIZERS:
        for (uint32_t i = 0; i < job->n; i++)
            ((void (*)(int, char **, char **))(uintptr_t)job->list[i])(1, empty_argv, _environ);
        break;
    case T_RUN_FINALIZERS:
        /* No __cxa_finalize: mingw's C runtime runs atexit handlers at exit only. */
        for (uint32_t i = 0; i < job->n; i++) ((void (*)(void))(uintptr_t)job->list[i])();
        break;
    case T_RUN_MAIN:
        value = (uint32_t)((int (*)(int, char **, char **))(uintptr_t)job->address)(job->argc, job->argv, _environ);
        break;
    }
    /* What the code wrote is sent before its answer (stdout is a pipe: fully buffered). */
    flush_all();
    return value;
}

static DWORD WINAPI code_thread(void *unused) {
    (void)unused;
    guarantee_stack();
    AcquireSRWLockExclusive(&jobs_lock);
    for (;;) {
        while (!code_thread_job) SleepConditionVariableSRW(&jobs_ready, &jobs_lock, INFINITE, 0);
        struct code_job *job = code_thread_job;
        code_thread_job = NULL;
        ReleaseSRWLockExclusive(&jobs_lock);
        finish_job(job, run_code(job));
        AcquireSRWLockExclusive(&jobs_lock);
        code_thread_state = 1;
    }
    return 0;
}

static DWORD WINAPI job_thread(void *arg) {
    guarantee_stack();
    finish_job(arg, run_code(arg));
    return 0;
}

/* A thread of 8 MiB of stack (reserved; committed as it grows). */
static HANDLE start_thread(LPTHREAD_START_ROUTINE fn, void *arg) {
    return CreateThread(NULL, 8 << 20, fn, arg, STACK_SIZE_PARAM_IS_A_RESERVATION, NULL);
}

struct main_run {
    struct code_job *job;
    uint64_t status;
};

static DWORD WINAPI main_thread(void *arg) {
    struct main_run *m = arg;
    guarantee_stack();
    m->status = run_code(m->job);
    return 0;
}

/* Main runs on a thread of its own, which ends when main returns: the thread's exit runs
 * what the C runtime and the DLLs do at a thread's end (thread-locals' destructors)
 * before the answer. */
static DWORD WINAPI main_waiter(void *arg) {
    struct main_run m = {arg, 0};
    HANDLE thread = start_thread(main_thread, &m);
    if (!thread) {
        atomic_fetch_sub(&running_code, 1);
        atomic_store(&main_running, 0);
        reply_error(m.job->id, "cannot start main's thread");
        free_job(m.job);
        return 0;
    }
    WaitForSingleObject(thread, INFINITE);
    CloseHandle(thread);
    finish_job(m.job, m.status);
    return 0;
}

/* Runs `job` off the reading thread; its code answers. */
static void start_job(struct code_job *job) {
    atomic_fetch_add(&running_code, 1);
    if (job->tag == T_RUN_MAIN) {
        HANDLE waiter = CreateThread(NULL, 256 << 10, main_waiter, job, STACK_SIZE_PARAM_IS_A_RESERVATION, NULL);
        if (!waiter) {
            atomic_fetch_sub(&running_code, 1);
            atomic_store(&main_running, 0);
            reply_error(job->id, "cannot start main's thread");
            free_job(job);
        } else {
            CloseHandle(waiter);
        }
        return;
    }
    AcquireSRWLockExclusive(&jobs_lock);
    if (code_thread_state == 0) {
        HANDLE t = start_thread(code_thread, NULL);
        if (t) {
            CloseHandle(t);
            code_thread_state = 1;
        }
    }
    if (code_thread_state == 1) {
        code_thread_state = 2;
        code_thread_job = job;
        WakeConditionVariable(&jobs_ready);
        ReleaseSRWLockExclusive(&jobs_lock);
        return;
    }
    ReleaseSRWLockExclusive(&jobs_lock);
    HANDLE t = start_thread(job_thread, job);
    if (t) {
        CloseHandle(t);
        return;
    }
    atomic_fetch_sub(&running_code, 1);
    reply_error(job->id, "cannot start a thread for the request's code");
    free_job(job);
}

static struct code_job *new_job(uint32_t id, uint8_t tag) {
    struct code_job *job = calloc(1, sizeof *job);
    if (!job) quit(70);
    job->id = id;
    job->tag = tag;
    return job;
}

static void do_code_list(uint32_t id, uint8_t tag, struct reader *r) {
    struct code_job *job = new_job(id, tag);
    if (tag == T_RUN_FINALIZERS) (void)rd_u64(r, "dso_handle");
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

/* ---- serving ------------------------------------------------------------------------- */

/* Reads one frame's body (id, tag, fields); -1 when the connection ends or the frame is
 * beyond the limit (nothing is allocated for it). The body is read into an allocation of
 * exactly its length. */
static int read_frame(uint8_t **body, uint32_t *len) {
    uint8_t head[4];
    if (read_all(head, 4) != 0) return -1;
    *len = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24;
    if (*len < 5 || *len > MAX_FRAME) {
        logf_("kiln-executor-c: frame of %u bytes refused (limit %u): closing\n", *len, MAX_FRAME);
        return -1;
    }
    *body = malloc(*len);
    if (!*body || read_all(*body, *len) != 0) {
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
    wr_u64(&w, page_size);
    wr_string(&w, TRIPLE);
    wr_u32(&w, (uint32_t)GetCurrentProcessId());
    wr_u32(&w, MAX_FRAME);
    /* Runtime symbols: what mingw-compiled code takes from its static runtime, and the
     * executor's exit, _exit and abort, which report. */
    wr_u32(&w, (uint32_t)RUNTIME_SYMBOLS);
    for (size_t i = 0; i < RUNTIME_SYMBOLS; i++) {
        wr_string(&w, runtime_symbols[i].name);
        wr_u64(&w, (uint64_t)(uintptr_t)runtime_symbols[i].address);
    }
    send_frame(0, &w);
    free(w.p);
}

__attribute__((noreturn)) static void serve(SOCKET s) {
    sock = s;
    /* The program's children must not hold the connection. */
    SetHandleInformation((HANDLE)sock, HANDLE_FLAG_INHERIT, 0);
    /* Each frame goes out whole in one send: no waiting for the last one's
     * acknowledgement (an Output frame and an answer often follow each other). */
    BOOL one = TRUE;
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, (const char *)&one, sizeof one);
    tracing = getenv("KILN_EXECUTOR_TRACE") != NULL;
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    page_size = si.dwPageSize;
    granularity = si.dwAllocationGranularity;
    static const uint8_t preamble[8] = {'K', 'I', 'L', 'N', 0, 0, 0, 'P'};
    if (write_all(preamble, 8) != 0) quit(1);
    setup_crash_reports();
    atexit(on_program_exit);
    setup_stdio();
    msvcrt = GetModuleHandleA("msvcrt.dll");
    kernel32 = GetModuleHandleA("kernel32.dll");
    /* ucrtbase.dll, where the system has it, loaded after the standard handles became the
     * pipes: its own streams start on them too. */
    ucrt = LoadLibraryA("ucrtbase.dll");
    if (ucrt) ucrt_fflush = (int (*)(FILE *))(void (*)(void))GetProcAddress(ucrt, "fflush");
    kiln_msvcrt_setjmp = (void *)GetProcAddress(msvcrt, "_setjmp");
    send_hello();
    for (;;) {
        uint8_t *body;
        uint32_t len;
        if (read_frame(&body, &len) != 0) quit(0);
        struct reader r = {body, len, NULL};
        uint32_t id = rd_u32(&r, "id");
        uint8_t tag = rd_u8(&r, "tag");
        if (id & 0x80000000u) {
            /* Ids with the top bit set answer the executor's own requests, and this one
             * makes none (no call-through stubs here). */
            logf_("kiln-executor-c: a message with id %#x, which no request of this executor had: closing\n", id);
            quit(1);
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
        case T_REGISTER_EH_FRAME: do_eh_frame(id, &r); break;
        case T_DEREGISTER_EH_FRAME: do_eh_frame(id, &r); break;
        case T_RUN_INITIALIZERS: do_code_list(id, tag, &r); break;
        case T_RUN_FINALIZERS: do_code_list(id, tag, &r); break;
        case T_RUN_MAIN: do_run_main(id, &r); break;
        case T_CALL: do_call(id, &r); break;
        case T_INPUT: give_input(&r); break;
        case T_GUARD_BRANCH_TARGETS: do_guard_branch_targets(id, &r); break;
        case T_REGISTER_UNWIND_INFO: do_register_unwind_info(id, &r); break;
        case T_DEREGISTER_UNWIND_INFO: do_deregister_unwind_info(id, &r); break;
        case T_RESOLVE_STUB: reply_error(id, "ResolveStub goes from the executor to the controller"); break;
        case T_SHUTDOWN:
            if (atomic_load(&running_code) > 0) {
                reply_error(id, atomic_load(&main_running) ? "main is running" : "JIT code is running");
                break;
            }
            /* The program's end, after main returned: its atexit handlers, their output
             * sent before the answer. */
            run_atexit_handlers();
            flush_all();
            drain_output();
            reply_simple(id, A_OK);
            free(body);
            shutdown(sock, SD_SEND);
            quit(0);
        default: {
            /* Thread-local storage, exports, stdio adoption, the environment (the
             * controller's is another system's: its PATH is no DLL search path), debug
             * outputs, call-through stubs' hot swap and batches: not yet. */
            const char *name = request_name(tag);
            if (name) reply_error(id, "kiln-executor-c for Windows does not implement %s", name);
            else reply_error(id, "unknown request tag %u", tag);
        }
        }
        free(body);
    }
}

/* ---- the listener -------------------------------------------------------------------- */

/* Starts this executor again to serve `fd`: the child reads the socket's description
 * (WSADuplicateSocket, made for its process id) from a pipe whose read end it inherits,
 * named on its command line. Only that pipe end is inheritable while the child starts
 * (the listening socket never is, and the listener starts one child at a time). A socket
 * inherited as a handle is what Windows allows too, but Wine's ws2_32 answers WSAENOTSOCK
 * for one it did not create. The command line fits its array: the path is shorter than
 * 4096 characters, the option and a 64-bit number take fewer than 64. */
static void start_server(SOCKET fd) {
    char why[256];
    SECURITY_ATTRIBUTES inherit = {sizeof inherit, NULL, TRUE};
    HANDLE rd, wr;
    if (!CreatePipe(&rd, &wr, &inherit, sizeof(WSAPROTOCOL_INFOW) * 2)) {
        fprintf(stderr, "kiln-executor-c: pipe: %s\n", win_error(GetLastError(), why, sizeof why));
        return;
    }
    SetHandleInformation(wr, HANDLE_FLAG_INHERIT, 0);
    wchar_t self[4096];
    DWORD n = GetModuleFileNameW(NULL, self, sizeof self / sizeof *self);
    wchar_t command[4096 + 64];
    if (n == 0 || n >= sizeof self / sizeof *self) {
        fprintf(stderr, "kiln-executor-c: the executor's own path: %s\n", win_error(GetLastError(), why, sizeof why));
        CloseHandle(rd);
        CloseHandle(wr);
        return;
    }
    wchar_t number[32];
    unsigned long long h = (unsigned long long)(uintptr_t)rd;
    int digits = 0;
    do number[digits++] = (wchar_t)(L'0' + h % 10); while ((h /= 10) > 0);
    size_t at = 0;
    command[at++] = L'"';
    for (DWORD i = 0; i < n; i++) command[at++] = self[i];
    const wchar_t *option = L"\" --serve-duplicate ";
    for (size_t i = 0; option[i]; i++) command[at++] = option[i];
    while (digits > 0) command[at++] = number[--digits];
    command[at] = 0;
    STARTUPINFOW si = {.cb = sizeof si};
    PROCESS_INFORMATION pi;
    BOOL started = CreateProcessW(self, command, NULL, NULL, TRUE, 0, NULL, NULL, &si, &pi);
    DWORD e = GetLastError();
    CloseHandle(rd);
    if (!started) {
        fprintf(stderr, "kiln-executor-c: starting a process for the connection: %s\n", win_error(e, why, sizeof why));
        CloseHandle(wr);
        return;
    }
    WSAPROTOCOL_INFOW info;
    DWORD put = 0;
    if (WSADuplicateSocketW(fd, pi.dwProcessId, &info) != 0) {
        fprintf(stderr, "kiln-executor-c: WSADuplicateSocket: %s\n", win_error((DWORD)WSAGetLastError(), why, sizeof why));
        TerminateProcess(pi.hProcess, 1);
    } else if (!WriteFile(wr, &info, sizeof info, &put, NULL) || put != sizeof info) {
        fprintf(stderr, "kiln-executor-c: handing the connection over: %s\n", win_error(GetLastError(), why, sizeof why));
        TerminateProcess(pi.hProcess, 1);
    }
    CloseHandle(wr);
    CloseHandle(pi.hThread);
    CloseHandle(pi.hProcess);
}

/* The child's side: the socket described on the pipe `handle` (read into `info`, at most
 * its size, and used only if it came whole). */
static SOCKET take_duplicate(const char *handle) {
    HANDLE h = (HANDLE)(uintptr_t)_strtoui64(handle, NULL, 10);
    WSAPROTOCOL_INFOW info;
    DWORD got = 0, n;
    while (got < sizeof info && ReadFile(h, (uint8_t *)&info + got, sizeof info - got, &n, NULL) && n > 0) got += n;
    CloseHandle(h);
    if (got != sizeof info) return INVALID_SOCKET;
    return WSASocketW(FROM_PROTOCOL_INFO, FROM_PROTOCOL_INFO, FROM_PROTOCOL_INFO, &info, 0, WSA_FLAG_NO_HANDLE_INHERIT);
}

int main(int argc, char **argv) {
    log_handle = GetStdHandle(STD_ERROR_HANDLE);
    WSADATA wsa;
    if (WSAStartup(MAKEWORD(2, 2), &wsa) != 0) {
        fprintf(stderr, "kiln-executor-c: WSAStartup failed\n");
        return 1;
    }
    if (argc == 3 && strcmp(argv[1], "--serve-duplicate") == 0) {
        SOCKET s = take_duplicate(argv[2]);
        if (s == INVALID_SOCKET) {
            fprintf(stderr, "kiln-executor-c: no connection to serve (error %d)\n", WSAGetLastError());
            return 1;
        }
        serve(s);
    }
    if (argc == 3 && strcmp(argv[1], "--serve-socket") == 0) {
        /* A socket inherited as a handle (Windows; Wine's ws2_32 refuses those). */
        serve((SOCKET)_strtoui64(argv[2], NULL, 10));
    }
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
    char why[256];
    /* Not inheritable: the children started for connections must not hold it. */
    SOCKET listener = WSASocketW(AF_INET, SOCK_STREAM, IPPROTO_TCP, NULL, 0, WSA_FLAG_OVERLAPPED | WSA_FLAG_NO_HANDLE_INHERIT);
    if (listener == INVALID_SOCKET || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, SOMAXCONN) != 0) {
        fprintf(stderr, "kiln-executor-c: cannot listen on %s: %s\n", argv[2], win_error((DWORD)WSAGetLastError(), why, sizeof why));
        return 1;
    }
    int alen = sizeof addr;
    getsockname(listener, (struct sockaddr *)&addr, &alen);
    fprintf(stderr, "kiln-executor-c: listening on %s:%u (%s)\n", host, ntohs(addr.sin_port), TRIPLE);
    fflush(stderr);
    for (;;) {
        SOCKET fd = accept(listener, NULL, NULL);
        if (fd == INVALID_SOCKET) {
            int e = WSAGetLastError();
            if (e == WSAEINTR || e == WSAECONNRESET) continue;
            fprintf(stderr, "kiln-executor-c: accept: %s\n", win_error((DWORD)e, why, sizeof why));
            return 1;
        }
        start_server(fd);
        closesocket(fd);
    }
}
