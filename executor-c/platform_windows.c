/*
 * platform_windows.c: executor.c's platform (platform.h) on x86-64 Windows, built with
 * x86_64-w64-mingw32-gcc (here it runs under Wine).
 *
 * - Transport: TCP (TCP_NODELAY); a process per connection: the listener runs each
 *   connection's handshake on a thread of its own (HANDSHAKE_SECONDS at most, at most
 *   --max-unauthenticated at once, the oldest dropped to make room: a flood of silent or
 *   replayed connections costs threads, never processes), then starts itself again for
 *   the authenticated connection and hands the child the socket (WSADuplicateSocket:
 *   Wine's ws2_32 does not know a socket inherited as a bare handle) with the session's
 *   keys, so one program's crash, exit() or stall ends its own process only. The child
 *   says when it holds the socket; one that ended before (a process start under Wine can
 *   fail) is replaced, and the listener says so on stderr.
 * - Keys: Windows has no mode bits; the key file is read as it is (its ACL guards it), and
 *   a new one is created only where none exists.
 * - Memory: a section (CreateFileMapping of the paging file) mapped twice, the target view
 *   with the final protection of each page (never writable and executable) and a writable
 *   working view; FlushInstructionCache over code written.
 * - Symbols: the runtime JIT code compiled for x86_64-w64-windows-gnu (mingw's headers)
 *   calls that is not in a DLL — the stack probe, mingw's C99 printf and scanf, its C99
 *   math — is this executor's own statically linked copy, offered in the hello's runtime
 *   symbols, with exit, _exit and abort (which report), atexit, setjmp (without SEH
 *   unwinding, which JIT code's frames do not support) and printf to a stream (one write
 *   per call, not per line under Wine); the rest comes from msvcrt.dll (this executor's C
 *   runtime too), ucrtbase.dll, kernel32.dll and the DLLs LoadLibrary loads.
 * - Unwind tables: RUNTIME_FUNCTION entries registered with RtlAddFunctionTable.
 * - Exits and crashes: exit() kept for its report; a vectored exception handler, the
 *   top-level filter and SIGABRT report crashes from a reporting thread.
 * - Standard streams: pipes on CRT descriptors 0-2, polled by a forwarder thread; a feeder
 *   thread writes input.
 * Not here (plat_serves): thread-local storage, exports, the environment, call-through
 * stubs' hot swap.
 */
#define _WIN32_WINNT 0x0602 /* Windows 8: GetCurrentThreadStackLimits */
#define WIN32_LEAN_AND_MEAN
#include "platform.h"

#include <winsock2.h>
#include <ws2tcpip.h>
#include <windows.h>
#include <bcrypt.h>
#include <fcntl.h>
#include <io.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

#if !defined(__x86_64__)
#error "platform_windows.c is for x86-64 Windows"
#endif

const char plat_executor_name[] = "kiln-executor-c for Windows";
const char plat_triple[] = "x86_64-pc-windows-gnu";

/* Exports, stdio adoption, the environment (the controller's is another system's: its PATH
 * is no DLL search path), debug outputs, call-through stubs' hot swap and batches: not
 * yet. Thread-local storage: static blocks only (below). */
int plat_serves(int tag) {
    switch (tag) {
    case T_INSTALL_TLS:
    case T_EXPORT_SYMBOLS: case T_UNEXPORT_SYMBOLS: case T_SET_ENVIRONMENT:
    case T_STORE_CODE_POINTER: case T_OLDEST_CODE_GUARD:
        return 0;
    default:
        return 1;
    }
}

/* ---- the connection ------------------------------------------------------------------ */

static SOCKET sock = INVALID_SOCKET;
static SOCKET listener = INVALID_SOCKET;
static HANDLE log_handle; /* the executor's own stderr, kept when the program's is a pipe */

/* Ends the process at once, as _exit does on Linux: no atexit handlers, no DLL detach
 * (a thread stopped inside the loader or the C runtime cannot hold the end up). */
void plat_quit(int status) {
    TerminateProcess(GetCurrentProcess(), (UINT)status);
    ExitProcess((UINT)status);
}

void plat_log_write(const char *text, size_t n) {
    /* A log whose reader is gone fails the write, and nothing else happens. */
    DWORD written;
    WriteFile(log_handle, text, (DWORD)n, &written, NULL);
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

/* At most 1 GiB a call (Winsock counts in int). */
long plat_transfer(uint8_t *p, size_t n, int out) {
    int len = n > (1u << 30) ? (1 << 30) : (int)n;
    int k = out ? send(sock, (const char *)p, len, 0) : recv(sock, (char *)p, len, 0);
    if (k == SOCKET_ERROR && WSAGetLastError() == WSAEINTR) return 0;
    return k > 0 ? k : -1;
}

void plat_shutdown_send(void) { shutdown(sock, SD_SEND); }

/* Requests are read as they come: input has a thread of its own. */
int plat_wait_request(void) { return 0; }

uint32_t plat_process_id(void) { return (uint32_t)GetCurrentProcessId(); }

void plat_connect(uintptr_t connection) {
    sock = (SOCKET)connection;
    /* The program's children must not hold the connection. */
    SetHandleInformation((HANDLE)sock, HANDLE_FLAG_INHERIT, 0);
    /* Each frame goes out whole in one send: no waiting for the last one's
     * acknowledgement (an Output frame and an answer often follow each other). */
    BOOL one = TRUE;
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, (const char *)&one, sizeof one);
}

/* ---- locks and threads ----------------------------------------------------------------- */

static SRWLOCK locks[LOCK_COUNT] = {SRWLOCK_INIT, SRWLOCK_INIT, SRWLOCK_INIT, SRWLOCK_INIT};
static CONDITION_VARIABLE conds[COND_COUNT] = {CONDITION_VARIABLE_INIT, CONDITION_VARIABLE_INIT};

void plat_lock(int lock) { AcquireSRWLockExclusive(&locks[lock]); }
void plat_unlock(int lock) { ReleaseSRWLockExclusive(&locks[lock]); }
void plat_wait(int cond, int lock) { SleepConditionVariableSRW(&conds[cond], &locks[lock], INFINITE, 0); }
void plat_wake_one(int cond) { WakeConditionVariable(&conds[cond]); }
void plat_wake_all(int cond) { WakeAllConditionVariable(&conds[cond]); }

/* A thread of `stack` bytes (reserved; committed as it grows). `fn` is the thread's
 * entry itself: on x86-64 a thread routine's convention is C's, and its exit code (the
 * low half of what `fn` returns) is not looked at. */
int plat_start_thread(void *(*fn)(void *), void *arg, size_t stack, struct plat_thread **joinable) {
    LPTHREAD_START_ROUTINE entry = (LPTHREAD_START_ROUTINE)(void (*)(void))fn;
    HANDLE t = CreateThread(NULL, stack, entry, arg, STACK_SIZE_PARAM_IS_A_RESERVATION, NULL);
    if (!t) return -1;
    if (joinable) *joinable = (struct plat_thread *)t;
    else CloseHandle(t);
    return 0;
}

void plat_join(struct plat_thread *thread) {
    WaitForSingleObject((HANDLE)thread, INFINITE);
    CloseHandle((HANDLE)thread);
}

/* Room on the thread's stack for the exception handler after a stack overflow. */
static void guarantee_stack(void) {
    ULONG size = 64 * 1024;
    SetThreadStackGuarantee(&size);
}

void *plat_code_thread_enter(void) {
    guarantee_stack();
    return NULL;
}

void plat_code_thread_left(void *room) { (void)room; }

static DWORD reading_thread;

void plat_mark_reading_thread(void) { reading_thread = GetCurrentThreadId(); }
int plat_is_reading_thread(void) { return GetCurrentThreadId() == reading_thread; }
int plat_in_forked_child(void) { return 0; }

/* ---- memory -------------------------------------------------------------------------- */

static uint64_t page_size = 4096, granularity = 65536;

uint64_t plat_page_size(void) {
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    page_size = si.dwPageSize;
    granularity = si.dwAllocationGranularity;
    return page_size;
}

uint64_t plat_view_alignment(void) { return granularity; }

/* The page protection of a permission (0 RX, 1 R, 2 RW); PAGE_NOACCESS for none. */
static DWORD protection_of(int permission) {
    switch (permission) {
    case 0: return PAGE_EXECUTE_READ;
    case 1: return PAGE_READONLY;
    case 2: return PAGE_READWRITE;
    default: return PAGE_NOACCESS;
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

/* Near the C runtime's code: within reach of all of msvcrt.dll (whose functions JIT code
 * calls most), and of ucrtbase.dll too where one window reaches both. */
int plat_library_windows(uint64_t reach, uint64_t len, uint64_t window[2][2], char *why, size_t why_len) {
    uint64_t mlo, mhi, ulo, uhi;
    if (!module_range(msvcrt, &mlo, &mhi)) {
        snprintf(why, why_len, "placement near the libraries: msvcrt.dll is not loaded");
        return 0;
    }
    uint64_t lo = mhi > reach ? mhi - reach : 0, hi = mlo + reach;
    int windows = 0;
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
    return windows;
}

/* The paging file's pages, which both views share; they read as zeros. */
intptr_t plat_new_memory(uint64_t len, char *why, size_t why_len) {
    HANDLE section = CreateFileMappingW(INVALID_HANDLE_VALUE, NULL, PAGE_EXECUTE_READWRITE | SEC_COMMIT,
                                        (DWORD)(len >> 32), (DWORD)len, NULL);
    char reason[256];
    if (section) return (intptr_t)section;
    snprintf(why, why_len, "a section of %#llx bytes: %s", (unsigned long long)len, win_error(GetLastError(), reason, sizeof reason));
    return -1;
}

/* A view goes where it is asked (MapViewOfFileEx maps there or fails). */
void *plat_map_target(intptr_t memory, uint64_t len, uint64_t hint, uint64_t lo, uint64_t hi) {
    (void)lo, (void)hi;
    return map_view_at((HANDLE)memory, len, hint);
}

/* Every free range of the window, lowest first (VirtualQuery). */
void *plat_map_free_range(intptr_t memory, uint64_t len, uint64_t lo, uint64_t hi) {
    uint64_t at = align_up(lo < granularity ? granularity : lo, granularity);
    while (at + len > at && at + len <= hi) {
        MEMORY_BASIC_INFORMATION m;
        if (VirtualQuery((void *)(uintptr_t)at, &m, sizeof m) == 0) break;
        uint64_t end = (uint64_t)(uintptr_t)m.BaseAddress + m.RegionSize;
        if (m.State == MEM_FREE && end >= at + len) {
            void *p = map_view_at((HANDLE)memory, len, at);
            if (p) return p;
        }
        uint64_t next = align_up(end, granularity);
        at = next > at ? next : at + granularity;
    }
    return NULL;
}

int plat_working_view(intptr_t memory, void *target, uint64_t len, uint8_t **working, char *why, size_t why_len) {
    HANDLE section = (HANDLE)memory;
    char reason[256];
    /* Inaccessible until prepared: the view was mapped with every access allowed (so
     * that Prepare can give each page its protection), which no page keeps. */
    DWORD old;
    if (!VirtualProtect(target, (SIZE_T)len, PAGE_NOACCESS, &old)) {
        DWORD e = GetLastError();
        UnmapViewOfFile(target);
        CloseHandle(section);
        snprintf(why, why_len, "target view at %p: VirtualProtect: %s", target, win_error(e, reason, sizeof reason));
        return -1;
    }
    void *p = MapViewOfFile(section, FILE_MAP_WRITE, 0, 0, (SIZE_T)len);
    if (!p) {
        DWORD e = GetLastError();
        UnmapViewOfFile(target);
        CloseHandle(section);
        snprintf(why, why_len, "working view: %s", win_error(e, reason, sizeof reason));
        return -1;
    }
    *working = p;
    return 0;
}

/* Unmaps the reservation's own two views (their addresses kept since Reserve) and closes
 * its section; nothing else is touched. */
void plat_release(const struct reservation *r) {
    if (r->target) UnmapViewOfFile((void *)(uintptr_t)r->target);
    if (r->working) UnmapViewOfFile(r->working);
    CloseHandle((HANDLE)r->memory);
}

int plat_prepare(uint64_t start, uint64_t end, int permission, char *why, size_t why_len) {
    DWORD old;
    char reason[256];
    if (VirtualProtect((void *)(uintptr_t)start, (SIZE_T)(end - start), protection_of(permission), &old)) return 0;
    snprintf(why, why_len, "Prepare of %#llx..%#llx: VirtualProtect: %s", (unsigned long long)start, (unsigned long long)end, win_error(GetLastError(), reason, sizeof reason));
    return -1;
}

/* The instruction cache is made coherent for code fetched through the target view (on
 * x86-64 a serializing no-op in effect, which the system still wants to be told of). */
int plat_code_written(const struct reservation *r, uint64_t addr, uint64_t len, char *why, size_t why_len) {
    (void)r, (void)why, (void)why_len;
    FlushInstructionCache(GetCurrentProcess(), (void *)(uintptr_t)addr, (SIZE_T)len);
    return 0;
}

/* x86-64 has nothing of the kind here: the range was checked, and that is all. */
int plat_guard_branch_targets(struct reservation *r, uint64_t addr, uint64_t len, char *why, size_t why_len) {
    (void)r, (void)addr, (void)len, (void)why, (void)why_len;
    return 0;
}

/* Zeroed through the working view (inside the reservation, as executor.c checked). */
void plat_discard(const struct reservation *r, uint64_t start, uint64_t end) {
    DWORD old;
    VirtualProtect((void *)(uintptr_t)start, (SIZE_T)(end - start), PAGE_NOACCESS, &old);
    memset(r->working + (start - r->target), 0, end - start);
}

/* No call-through stubs here (plat_serves): a plain store. */
void plat_store_code_pointer(uint64_t slot, uint64_t target) {
    __atomic_store_n((uint64_t *)(uintptr_t)slot, target, __ATOMIC_SEQ_CST);
}

/* ---- the runtime JIT code gets from the executor ---------------------------------------- */

__attribute__((noreturn)) static void crash(uint32_t signal, uint32_t code, uint64_t fault, uint64_t pc);
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

static void run_atexit_handlers(void) {
    for (;;) {
        AcquireSRWLockExclusive(&atexit_lock);
        void (*handler)(void) = atexit_count ? atexit_handlers[--atexit_count] : NULL;
        ReleaseSRWLockExclusive(&atexit_lock);
        if (!handler) return;
        uint64_t at = (uint64_t)(uintptr_t)handler;
        if (!in_reserved_memory(at) || runnable(at)) handler();
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
    if (code_running() > 0) {
        plat_drain_output();
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
    X(__fixdfti) X(__fixunsdfti) X(__fixsfti) X(__fixunssfti) X(__popcountdi2)              \
    X(__divsc3) X(__divdc3) X(__divxc3) X(__mulsc3) X(__muldc3) X(__mulxc3)                   \
    X(__powisf2) X(__powidf2) X(__powixf2) X(__clzdi2) X(__ctzdi2) X(__ffsdi2) X(__paritydi2) \
    X(__bswapsi2) X(__bswapdi2) X(__clzti2)                                                   \
    X(__emutls_get_address) X(__mingwthr_key_dtor)                                          \
    X(__gthr_win32_once) X(__gthr_win32_key_create) X(__gthr_win32_key_delete)                \
    X(__gthr_win32_getspecific) X(__gthr_win32_setspecific)                                   \
    X(__gthr_win32_mutex_init_function) X(__gthr_win32_mutex_destroy)                         \
    X(__gthr_win32_mutex_lock) X(__gthr_win32_mutex_trylock) X(__gthr_win32_mutex_unlock)     \
    X(__gthr_win32_recursive_mutex_init_function) X(__gthr_win32_recursive_mutex_destroy)     \
    X(__gthr_win32_recursive_mutex_lock) X(__gthr_win32_recursive_mutex_trylock)              \
    X(__gthr_win32_recursive_mutex_unlock)

#define DECLARE_STATIC(name) extern void kiln_static_##name(void) __asm__(#name);
STATIC_RUNTIME(DECLARE_STATIC)

/* mingw's tlssup.c: this executable's TLS index (plat_static_tls). */
extern ULONG _tls_index;
/* mingw's C runtime: whether it is multithreaded (libstdc++'s locks ask). */
extern int _CRT_MT;

#define STATIC_ENTRY(name) {#name, kiln_static_##name},
static struct runtime_symbol runtime_symbols[] = {
    {"__main", kiln_main_noop},
    {"_CRT_MT", (void (*)(void))(void *)&_CRT_MT},
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
    /* Thread-locals: COFF code's `mov _tls_index(%rip)` reads this executor's TLS index
     * from a copy near the C runtime, where JIT code is placed (this executable's own
     * `_tls_index` is out of a 32-bit displacement's reach); set by plat_setup_runtime,
     * offered only if it could be placed. The last entry. */
    {"_tls_index", NULL},
};
#define RUNTIME_SYMBOLS (sizeof runtime_symbols / sizeof *runtime_symbols - (runtime_symbols[sizeof runtime_symbols / sizeof *runtime_symbols - 1].address == NULL))

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

/* 1 (function) if `address` lies in executable pages — a module's code sections — else 2
 * (data). VirtualQuery only reads the system's record of the address space. */
static uint8_t kind_of(uint64_t address) {
    MEMORY_BASIC_INFORMATION m;
    if (VirtualQuery((void *)(uintptr_t)address, &m, sizeof m) == 0 || m.State != MEM_COMMIT) return 0;
    DWORD p = m.Protect & 0xff;
    return (p == PAGE_EXECUTE || p == PAGE_EXECUTE_READ || p == PAGE_EXECUTE_READWRITE || p == PAGE_EXECUTE_WRITECOPY) ? 1 : 2;
}

/* (address, kind: 0 unknown, 1 function, 2 data) of `name` in `library` (NULL: the
 * process: the runtime symbols, msvcrt.dll's exports under the names of its import
 * library, then msvcrt.dll, ucrtbase.dll, kernel32.dll, then each DLL LoadLibrary loaded,
 * in load order). */
void plat_lookup(void *library, void *const *libraries, int count, const char *name, uint64_t *address, uint8_t *kind) {
    FARPROC p = NULL;
    *address = 0;
    *kind = 0;
    if (!library) {
        for (size_t i = 0; i < RUNTIME_SYMBOLS; i++)
            if (strcmp(runtime_symbols[i].name, name) == 0) {
                *address = (uint64_t)(uintptr_t)runtime_symbols[i].address;
                *kind = kind_of(*address);
                return;
            }
        for (size_t i = 0; i < MSVCRT_ALIASES && !p; i++)
            if (strcmp(msvcrt_aliases[i].name, name) == 0) p = GetProcAddress(msvcrt, msvcrt_aliases[i].export);
        HMODULE system[] = {msvcrt, ucrt, kernel32};
        for (size_t i = 0; i < 3 && !p; i++)
            if (system[i]) p = GetProcAddress(system[i], name);
        for (int i = 0; i < count && !p; i++) p = GetProcAddress((HMODULE)libraries[i], name);
    } else {
        p = GetProcAddress((HMODULE)library, name);
    }
    if (!p) return;
    *address = (uint64_t)(uintptr_t)p;
    *kind = kind_of(*address);
}

void *plat_load_library(const char *path, char *why, size_t why_len) {
    HMODULE handle = LoadLibraryA(path);
    if (!handle) {
        char reason[256];
        snprintf(why, why_len, "LoadLibrary %s: %s", path, win_error(GetLastError(), reason, sizeof reason));
    }
    return (void *)handle;
}

const struct runtime_symbol *plat_runtime_symbols(size_t *n) {
    *n = RUNTIME_SYMBOLS;
    return runtime_symbols;
}

char **plat_environ(void) { return _environ; }

/* No __cxa_finalize: mingw's C runtime runs atexit handlers at exit only. */
void plat_finalize(uint64_t dso) { (void)dso; }

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
void plat_flush_stdio(void) {
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
                send_output(i + 1, buf, k);
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
void plat_drain_output(void) {
    if (!out_read[0]) return;
    plat_flush_stdio();
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

void plat_give_input(const uint8_t *bytes, uint32_t len) {
    if (!in_write) return;
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

void plat_setup_stdio(void) {
    /* The executor's own log keeps the stderr it was started with. */
    HANDLE err = GetStdHandle(STD_ERROR_HANDLE);
    if (!DuplicateHandle(GetCurrentProcess(), err, GetCurrentProcess(), &log_handle, 0, FALSE, DUPLICATE_SAME_ACCESS))
        log_handle = err;
    HANDLE out_write[2], in_read;
    if (!CreatePipe(&out_read[0], &out_write[0], NULL, 1 << 16) || !CreatePipe(&out_read[1], &out_write[1], NULL, 1 << 16) ||
        !CreatePipe(&in_read, &in_write, NULL, 1 << 16)) {
        logf_("kiln-executor-c: pipes: error %lu\n", (unsigned long)GetLastError());
        plat_quit(71);
    }
    fflush(NULL);
    if (!install_std(1, out_write[0], STD_OUTPUT_HANDLE, _O_WRONLY) || !install_std(2, out_write[1], STD_ERROR_HANDLE, _O_WRONLY) ||
        !install_std(0, in_read, STD_INPUT_HANDLE, _O_RDONLY)) {
        logf_("kiln-executor-c: the program's standard streams could not be made pipes\n");
        plat_quit(71);
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
        plat_quit(71);
    }
    CloseHandle(t);
    CloseHandle(f);
}

/* ---- exits and crashes ----------------------------------------------------------------- */

/* Takes the send lock for good (waiting a second at most for a frame in flight): the
 * frames after it would come after the executor's end. */
static void hold_send_lock(void) {
    for (int i = 0; i < 1000 && !TryAcquireSRWLockExclusive(&locks[LOCK_SEND]); i++) Sleep(1);
}

static void report_exit(uint32_t status) {
    uint8_t fields[4];
    put_le(fields, status, 4);
    hold_send_lock();
    send_report(A_EXITED, fields, sizeof fields);
    shutdown(sock, SD_SEND);
}

/* The executor's atexit handler, registered before any of the program's: runs last. */
static void on_program_exit(void) {
    if (!atomic_load(&exit_requested) || code_running() == 0) return;
    plat_drain_output();
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
    send_report(A_CRASHED, fields, sizeof fields);
    shutdown(sock, SD_SEND);
    plat_quit(128 + (int)crash_signal);
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
        if (c.Rip == 0 || in_reserved_memory(c.Rip)) return 0;
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

void plat_setup_crash_reports(void) {
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
    atexit(on_program_exit);
}

/* ---- thread-local storage ------------------------------------------------------------ */

/* JIT modules' thread-locals, as COFF code reaches them (`_tls_index`, then the offset of a
 * variable in its module's `.tls`, `IMAGE_REL_AMD64_SECREL`): a module's block is placed in
 * a reserve of this executor's own TLS block — an array in `.tls$KILN`, between mingw's
 * `.tls` and `.tls$ZZZ`, so inside the template the loader copies for every new thread —
 * and its code is given this executor's `_tls_index` and the block's offset in the
 * executor's block as its "thread-pointer offset". Placing a block writes the module's
 * image into the template (threads started later copy it); a thread that existed before
 * copies the images placed since, before its next request's code runs (plat_before_code).
 * Blocks are not given back (RemoveTls leaves the space, as static TLS on Linux). */
#define TLS_RESERVE (64 * 1024)
__attribute__((section(".tls$KILN"), aligned(64))) unsigned char kiln_tls_reserve[TLS_RESERVE];
extern const IMAGE_TLS_DIRECTORY _tls_used;
static uint64_t tls_used_bytes;
#define MAX_TLS_BLOCKS 1024
static struct { uint64_t at, size; } tls_blocks[MAX_TLS_BLOCKS];
static volatile LONG tls_block_count;
static __thread LONG tls_blocks_copied;

/* This thread's copy of the reserve. */
static unsigned char *thread_tls_reserve(void) {
    unsigned char **blocks; /* the TEB's ThreadLocalStoragePointer */
    __asm__("movq %%gs:0x58, %0" : "=r"(blocks));
    uint64_t offset = (uint64_t)(kiln_tls_reserve - (unsigned char *)(uintptr_t)_tls_used.StartAddressOfRawData);
    return blocks[_tls_index] + offset;
}

int plat_static_tls(uint64_t size, uint64_t align, const uint8_t *image, uint32_t image_len, int64_t *tp_offset,
                    char *why, size_t why_len) {
    uint64_t at = align > 1 ? (tls_used_bytes + align - 1) & ~(align - 1) : tls_used_bytes;
    /* Each thread's copy of the executable's TLS block is only 16-byte aligned (the
     * loader's heap), whatever the template's alignment. */
    if (align > 16) {
        snprintf(why, why_len, "a block aligned to %llu bytes: a thread's copy of this executor's TLS block is aligned to 16",
                 (unsigned long long)align);
        return -1;
    }
    if (at + size > TLS_RESERVE || tls_block_count == MAX_TLS_BLOCKS) {
        snprintf(why, why_len, "the executor's reserve of %u bytes has %llu left", TLS_RESERVE,
                 (unsigned long long)(TLS_RESERVE - tls_used_bytes));
        return -1;
    }
    memcpy(kiln_tls_reserve + at, image, image_len);
    memset(kiln_tls_reserve + at + image_len, 0, size - image_len);
    tls_used_bytes = at + size;
    tls_blocks[tls_block_count].at = at;
    tls_blocks[tls_block_count].size = size;
    InterlockedIncrement(&tls_block_count);
    *tp_offset = (int64_t)(kiln_tls_reserve - (unsigned char *)(uintptr_t)_tls_used.StartAddressOfRawData) + (int64_t)at;
    return 0;
}

void plat_before_code(void) {
    LONG placed = tls_block_count;
    if (tls_blocks_copied == placed) return;
    unsigned char *mine = thread_tls_reserve();
    for (LONG i = tls_blocks_copied; i < placed; i++)
        memcpy(mine + tls_blocks[i].at, kiln_tls_reserve + tls_blocks[i].at, tls_blocks[i].size);
    tls_blocks_copied = placed;
}

/* ---- unwind tables ------------------------------------------------------------------ */

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

void *plat_add_unwind_table(const uint64_t *begin, const uint64_t *end, const uint8_t *const *info,
                            const uint32_t *len, uint32_t n, uint64_t lo, uint64_t hi, const char **bad) {
    uint64_t size = (uint64_t)n * sizeof(RUNTIME_FUNCTION);
    for (uint32_t i = 0; i < n; i++) size += len[i];
    void *block = unwind_block(lo, hi, size);
    if (!block) {
        *bad = "no memory within 4 GiB of the functions";
        return NULL;
    }
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
        *bad = "RtlAddFunctionTable refused the table";
        return NULL;
    }
    return table;
}

void *plat_add_function_table(const uint32_t *entries, uint32_t n, uint64_t base, const char **bad) {
    size_t size = (size_t)n * sizeof(RUNTIME_FUNCTION);
    RUNTIME_FUNCTION *table = VirtualAlloc(NULL, size, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
    if (!table) {
        *bad = "out of memory";
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        table[i].BeginAddress = entries[3 * i];
        table[i].EndAddress = entries[3 * i + 1];
        table[i].UnwindData = entries[3 * i + 2];
    }
    DWORD old;
    VirtualProtect(table, size, PAGE_READONLY, &old);
    if (!RtlAddFunctionTable(table, n, base)) {
        VirtualFree(table, 0, MEM_RELEASE);
        *bad = "RtlAddFunctionTable refused the table";
        return NULL;
    }
    return table;
}

/* The table is the start of its block. */
void plat_delete_unwind_table(void *table) {
    RtlDeleteFunctionTable(table);
    VirtualFree(table, 0, MEM_RELEASE);
}

/* Windows unwinds with its own tables (RegisterUnwindInfo), not with .eh_frame: nothing
 * is registered (Kiln does not send it to Windows executors). */
int plat_eh_frame(uint64_t address, int reg, char *why, size_t why_len) {
    (void)address, (void)reg, (void)why, (void)why_len;
    return 0;
}

/* Exports and the environment: never asked for (plat_serves). */
void *plat_export(const struct export_symbol *symbols, uint32_t n, char *why, size_t why_len) {
    (void)symbols, (void)n;
    snprintf(why, why_len, "not on Windows");
    return NULL;
}

void plat_unexport(void *set) { (void)set; }

int plat_enter_directory(const char *dir, char *why, size_t why_len) {
    (void)dir;
    snprintf(why, why_len, "not on Windows");
    return -1;
}

int plat_replace_environment(char **vars, uint32_t n, char *why, size_t why_len) {
    (void)vars, (void)n;
    snprintf(why, why_len, "not on Windows");
    return -1;
}

/* The copy of `_tls_index` JIT code reads (see runtime_symbols): one page within 512 KiB
 * of msvcrt.dll's image, so that it is within a 32-bit displacement of every byte placed
 * near the C runtime (plat_library_windows leaves 1 MiB of slack), read-only. */
static void place_tls_index_copy(void) {
    uint64_t lo, hi;
    if (!module_range(msvcrt, &lo, &hi)) return;
    const uint64_t granule = 1 << 16;
    for (uint64_t step = 0; step < 8; step++) {
        uint64_t tries[2] = {((hi + granule - 1) & ~(granule - 1)) + step * granule,
                             (lo & ~(granule - 1)) - (step + 1) * granule};
        for (int i = 0; i < 2; i++) {
            ULONG *copy = VirtualAlloc((void *)(uintptr_t)tries[i], 4096, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
            if (!copy) continue;
            *copy = _tls_index;
            DWORD old;
            VirtualProtect(copy, 4096, PAGE_READONLY, &old);
            runtime_symbols[sizeof runtime_symbols / sizeof *runtime_symbols - 1].address = (void (*)(void))(void *)copy;
            return;
        }
    }
}

void plat_setup_runtime(void) {
    msvcrt = GetModuleHandleA("msvcrt.dll");
    kernel32 = GetModuleHandleA("kernel32.dll");
    /* ucrtbase.dll, where the system has it, loaded after the standard handles became the
     * pipes: its own streams start on them too. */
    ucrt = LoadLibraryA("ucrtbase.dll");
    if (ucrt) ucrt_fflush = (int (*)(FILE *))(void (*)(void))GetProcAddress(ucrt, "fflush");
    kiln_msvcrt_setjmp = (void *)GetProcAddress(msvcrt, "_setjmp");
    place_tls_index_copy();
}

/* The program's end, after main returned: its atexit handlers, their output flushed. */
void plat_program_end(void) {
    run_atexit_handlers();
    plat_flush_stdio();
}

/* ---- the listener -------------------------------------------------------------------- */

/* Children are started one at a time: only the pipe end of the child being started is
 * inheritable meanwhile. */
static SRWLOCK starting = SRWLOCK_INIT;

/* What the listener hands a connection's process on the pipe: the socket's description,
 * whether it is keyed, and then the session the listener's handshake established. */
struct handover {
    WSAPROTOCOL_INFOW info;
    uint32_t keyed;
    struct noise_session session;
};

/* Appends `h` in decimal to `command` at `*at`. */
static void append_number(wchar_t *command, size_t *at, unsigned long long h) {
    wchar_t number[32];
    int digits = 0;
    do number[digits++] = (wchar_t)(L'0' + h % 10); while ((h /= 10) > 0);
    while (digits > 0) command[(*at)++] = number[--digits];
}

/* What became of a process started for a connection. */
enum started { STARTED_SERVING, STARTED_ENDED, STARTED_FAILED };

/* Starts this executor again to serve `fd`: the child reads the handover (the socket's
 * description, WSADuplicateSocket, made for its process id; the session) from a pipe whose
 * read end it inherits, named on its command line, and writes one byte on a second pipe
 * once it holds the socket. A socket inherited as a handle is what Windows allows too, but
 * Wine's ws2_32 answers WSAENOTSOCK for one it did not create. The command line fits its
 * array: the path is shorter than 4096 characters, the option and two 64-bit numbers take
 * fewer than 96.
 *
 * STARTED_ENDED: the child ended before it held the socket (this process still does: the
 * caller may start another); STARTED_FAILED: no child could be started or handed the
 * socket. Each says why on stderr. */
static enum started start_child(SOCKET fd, const struct noise_session *session) {
    char why[256];
    SECURITY_ATTRIBUTES inherit = {sizeof inherit, NULL, TRUE};
    HANDLE rd, wr, ack_rd, ack_wr;
    AcquireSRWLockExclusive(&starting);
    if (!CreatePipe(&rd, &wr, &inherit, sizeof(struct handover) * 2)) {
        ReleaseSRWLockExclusive(&starting);
        logf_("kiln-executor-c: pipe: %s\n", win_error(GetLastError(), why, sizeof why));
        return STARTED_FAILED;
    }
    if (!CreatePipe(&ack_rd, &ack_wr, &inherit, 16)) {
        ReleaseSRWLockExclusive(&starting);
        logf_("kiln-executor-c: pipe: %s\n", win_error(GetLastError(), why, sizeof why));
        CloseHandle(rd);
        CloseHandle(wr);
        return STARTED_FAILED;
    }
    SetHandleInformation(wr, HANDLE_FLAG_INHERIT, 0);
    SetHandleInformation(ack_rd, HANDLE_FLAG_INHERIT, 0);
    wchar_t self[4096];
    DWORD n = GetModuleFileNameW(NULL, self, sizeof self / sizeof *self);
    wchar_t command[4096 + 96];
    if (n == 0 || n >= sizeof self / sizeof *self) {
        ReleaseSRWLockExclusive(&starting);
        logf_("kiln-executor-c: the executor's own path: %s\n", win_error(GetLastError(), why, sizeof why));
        CloseHandle(rd);
        CloseHandle(wr);
        CloseHandle(ack_rd);
        CloseHandle(ack_wr);
        return STARTED_FAILED;
    }
    size_t at = 0;
    command[at++] = L'"';
    for (DWORD i = 0; i < n; i++) command[at++] = self[i];
    const wchar_t *option = L"\" --serve-duplicate ";
    for (size_t i = 0; option[i]; i++) command[at++] = option[i];
    append_number(command, &at, (unsigned long long)(uintptr_t)rd);
    command[at++] = L' ';
    append_number(command, &at, (unsigned long long)(uintptr_t)ack_wr);
    command[at] = 0;
    STARTUPINFOW si = {.cb = sizeof si};
    PROCESS_INFORMATION pi;
    BOOL started = CreateProcessW(self, command, NULL, NULL, TRUE, 0, NULL, NULL, &si, &pi);
    DWORD e = GetLastError();
    /* The child's ends are the child's alone: a child that ends closes the last writer of
     * the acknowledgement's pipe, which ends the wait for it below. */
    CloseHandle(rd);
    CloseHandle(ack_wr);
    ReleaseSRWLockExclusive(&starting);
    if (!started) {
        logf_("kiln-executor-c: starting a process for the connection: %s\n", win_error(e, why, sizeof why));
        CloseHandle(wr);
        CloseHandle(ack_rd);
        return STARTED_FAILED;
    }
    enum started result = STARTED_FAILED;
    struct handover handover;
    memset(&handover, 0, sizeof handover);
    DWORD put = 0;
    if (WSADuplicateSocketW(fd, pi.dwProcessId, &handover.info) != 0) {
        logf_("kiln-executor-c: WSADuplicateSocket: %s\n", win_error((DWORD)WSAGetLastError(), why, sizeof why));
        TerminateProcess(pi.hProcess, 1);
    } else {
        if (session) {
            handover.keyed = 1;
            handover.session = *session;
        }
        if (!WriteFile(wr, &handover, sizeof handover, &put, NULL) || put != sizeof handover) {
            logf_("kiln-executor-c: handing the connection over: %s\n", win_error(GetLastError(), why, sizeof why));
            TerminateProcess(pi.hProcess, 1);
        } else {
            /* One byte once the child holds the socket; none if it ended first. */
            uint8_t ack = 0;
            DWORD got = 0;
            if (ReadFile(ack_rd, &ack, 1, &got, NULL) && got == 1) {
                result = STARTED_SERVING;
            } else {
                WaitForSingleObject(pi.hProcess, 5000);
                DWORD code = 0;
                GetExitCodeProcess(pi.hProcess, &code);
                logf_("kiln-executor-c: the process started for a connection ended (exit code %#lx) before it took the connection\n",
                      (unsigned long)code);
                result = STARTED_ENDED;
            }
        }
    }
    noise_wipe(&handover, sizeof handover);
    CloseHandle(wr);
    CloseHandle(ack_rd);
    CloseHandle(pi.hThread);
    CloseHandle(pi.hProcess);
    return result;
}

/* Serves `fd` in a process of its own (start_child). A process start under Wine can fail
 * before the program's first instruction (its preloader's address space taken, say): a
 * child that ended before it took the connection is replaced, twice at most, so the
 * client sees its hello rather than a closed connection. */
static void start_server(SOCKET fd, const struct noise_session *session) {
    for (int attempt = 0; attempt < 3; attempt++)
        if (start_child(fd, session) != STARTED_ENDED) return;
    logf_("kiln-executor-c: no process could be started for a connection: closing it\n");
}

/* The child's side: the handover read from the pipe `handle` (used only if it came whole);
 * the socket, and the session when keyed; one byte on the pipe `ack` once the socket is
 * this process's. */
static SOCKET take_duplicate(const char *handle, const char *ack, struct noise_session *session, int *keyed) {
    HANDLE h = (HANDLE)(uintptr_t)_strtoui64(handle, NULL, 10);
    HANDLE a = (HANDLE)(uintptr_t)_strtoui64(ack, NULL, 10);
    struct handover handover;
    DWORD got = 0, n;
    while (got < sizeof handover && ReadFile(h, (uint8_t *)&handover + got, sizeof handover - got, &n, NULL) && n > 0)
        got += n;
    CloseHandle(h);
    if (got != sizeof handover) {
        CloseHandle(a);
        return INVALID_SOCKET;
    }
    *keyed = handover.keyed != 0;
    *session = handover.session;
    noise_wipe(&handover.session, sizeof handover.session);
    SOCKET s = WSASocketW(FROM_PROTOCOL_INFO, FROM_PROTOCOL_INFO, FROM_PROTOCOL_INFO, &handover.info, 0,
                          WSA_FLAG_NO_HANDLE_INHERIT);
    if (s != INVALID_SOCKET) {
        uint8_t one = 1;
        DWORD put = 0;
        WriteFile(a, &one, 1, &put, NULL);
    }
    CloseHandle(a);
    return s;
}

/* WSAStartup; a connection handed over on the command line served. */
int plat_startup(int argc, char **argv) {
    log_handle = GetStdHandle(STD_ERROR_HANDLE);
    WSADATA wsa;
    if (WSAStartup(MAKEWORD(2, 2), &wsa) != 0) {
        fprintf(stderr, "kiln-executor-c: WSAStartup failed\n");
        return 1;
    }
    if (argc == 4 && strcmp(argv[1], "--serve-duplicate") == 0) {
        static struct noise_session session;
        int keyed = 0;
        SOCKET s = take_duplicate(argv[2], argv[3], &session, &keyed);
        if (s == INVALID_SOCKET) {
            fprintf(stderr, "kiln-executor-c: no connection to serve (error %d)\n", WSAGetLastError());
            return 1;
        }
        serve_connection((uintptr_t)s, keyed ? &session : NULL);
    }
    return -1;
}

int plat_listen(const char *host, uint16_t port, int plaintext, uint16_t *bound, char *why, size_t why_len) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) return LISTEN_NOT_IPV4;
    if (plaintext && (ntohl(addr.sin_addr.s_addr) >> 24) != 127) return LISTEN_NOT_LOOPBACK;
    /* Not inheritable: the children started for connections must not hold it. */
    listener = WSASocketW(AF_INET, SOCK_STREAM, IPPROTO_TCP, NULL, 0, WSA_FLAG_OVERLAPPED | WSA_FLAG_NO_HANDLE_INHERIT);
    if (listener == INVALID_SOCKET || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        listen(listener, SOMAXCONN) != 0) {
        win_error((DWORD)WSAGetLastError(), why, why_len);
        return LISTEN_FAILED;
    }
    int alen = sizeof addr;
    getsockname(listener, (struct sockaddr *)&addr, &alen);
    *bound = ntohs(addr.sin_port);
    return 0;
}

/* Connections in their handshake, each on a thread of its own, oldest first. The listener
 * drops the oldest to make room by taking it off the list and marking it; its thread sees
 * the mark within WAIT_STEP_MS (a receive waits in steps: Wine wakes no receive blocked in
 * another thread when the socket is shut down), and alone closes the socket and frees the
 * entry, after taking it off the list under the lock. */
#define WAIT_STEP_MS 100
struct waiting {
    SOCKET fd;
    ULONGLONG deadline; /* GetTickCount64 */
    volatile LONG dropped;
};
static struct waiting *waiting[MAX_UNAUTHENTICATED];
static int waiting_count;
static SRWLOCK waiting_lock = SRWLOCK_INIT;

/* The handshake's transfers on a waiting connection: a receive waits at most for what is
 * left of the connection's deadline, and ends when the listener drops the connection. */
static int waiting_io(void *ctx, uint8_t *p, size_t n, int out) {
    struct waiting *w = ctx;
    while (n > 0) {
        if (!out) {
            for (;;) {
                if (w->dropped || GetTickCount64() >= w->deadline) return -1;
                fd_set readable;
                FD_ZERO(&readable);
                FD_SET(w->fd, &readable);
                TIMEVAL step = {0, WAIT_STEP_MS * 1000};
                int ready = select(0, &readable, NULL, NULL, &step);
                if (ready < 0) return -1;
                if (ready > 0) break;
            }
        }
        int len = n > (1u << 30) ? (1 << 30) : (int)n;
        int k = out ? send(w->fd, (const char *)p, len, 0) : recv(w->fd, (char *)p, len, 0);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* `w` taken off the list, if the listener has not dropped it already. */
static void forget_waiting(struct waiting *w) {
    AcquireSRWLockExclusive(&waiting_lock);
    for (int i = 0; i < waiting_count; i++)
        if (waiting[i] == w) {
            memmove(waiting + i, waiting + i + 1, (size_t)(waiting_count - i - 1) * sizeof *waiting);
            waiting_count--;
            break;
        }
    ReleaseSRWLockExclusive(&waiting_lock);
}

static DWORD WINAPI handshake_thread(void *arg) {
    struct waiting *w = arg;
    struct noise_session session;
    char why[256];
    /* Sends wait at most the handshake's time too (a peer that never reads). */
    DWORD limit = HANDSHAKE_SECONDS * 1000;
    setsockopt(w->fd, SOL_SOCKET, SO_SNDTIMEO, (const char *)&limit, sizeof limit);
    int ok = secure_accept(waiting_io, w, &session, why, sizeof why) == 0;
    if (!ok && !w->dropped) logf_("kiln-executor-c: refused a connection: %s\n", why);
    forget_waiting(w);
    if (ok) {
        DWORD none = 0;
        setsockopt(w->fd, SOL_SOCKET, SO_SNDTIMEO, (const char *)&none, sizeof none);
        start_server(w->fd, &session);
    }
    noise_wipe(&session, sizeof session);
    closesocket(w->fd);
    free(w);
    return 0;
}

/* A plaintext (--no-auth) connection handed to a process of its own. */
static DWORD WINAPI plaintext_thread(void *arg) {
    SOCKET fd = (SOCKET)(uintptr_t)arg;
    start_server(fd, NULL);
    closesocket(fd);
    return 0;
}

int plat_serve(int keyed, int max_unauthenticated, char *why, size_t why_len) {
    for (;;) {
        SOCKET fd = accept(listener, NULL, NULL);
        if (fd == INVALID_SOCKET) {
            int e = WSAGetLastError();
            if (e == WSAEINTR || e == WSAECONNRESET) continue;
            if (e == WSAEMFILE || e == WSAENOBUFS) {
                Sleep(10);
                continue;
            }
            win_error((DWORD)e, why, why_len);
            return -1;
        }
        if (!keyed) {
            /* Its process's start is waited for on a thread: accepting goes on meanwhile. */
            HANDLE t = CreateThread(NULL, 64 << 10, plaintext_thread, (void *)(uintptr_t)fd,
                                    STACK_SIZE_PARAM_IS_A_RESERVATION, NULL);
            if (t) {
                CloseHandle(t);
            } else {
                start_server(fd, NULL);
                closesocket(fd);
            }
            continue;
        }
        struct waiting *w = malloc(sizeof *w);
        if (!w) {
            closesocket(fd);
            continue;
        }
        *w = (struct waiting){fd, GetTickCount64() + HANDSHAKE_SECONDS * 1000, 0};
        AcquireSRWLockExclusive(&waiting_lock);
        while (waiting_count >= max_unauthenticated) {
            InterlockedExchange(&waiting[0]->dropped, 1);
            memmove(waiting, waiting + 1, (size_t)(waiting_count - 1) * sizeof *waiting);
            waiting_count--;
        }
        waiting[waiting_count++] = w;
        ReleaseSRWLockExclusive(&waiting_lock);
        HANDLE t = CreateThread(NULL, 64 << 10, handshake_thread, w, STACK_SIZE_PARAM_IS_A_RESERVATION, NULL);
        if (t) {
            CloseHandle(t);
        } else {
            forget_waiting(w);
            closesocket(fd);
            free(w);
        }
    }
}

/* The connection's process is started only once its handshake is done. */
void plat_authenticated(void) {}

int plat_random(uint8_t *p, size_t n) {
    return BCryptGenRandom(NULL, p, (ULONG)n, BCRYPT_USE_SYSTEM_PREFERRED_RNG) == 0 ? 0 : -1;
}

int plat_read_private_file(const char *path, char *text, size_t size, char *why, size_t why_len) {
    HANDLE f = CreateFileA(path, GENERIC_READ, FILE_SHARE_READ, NULL, OPEN_EXISTING, 0, NULL);
    if (f == INVALID_HANDLE_VALUE) {
        DWORD e = GetLastError();
        if (e == ERROR_FILE_NOT_FOUND || e == ERROR_PATH_NOT_FOUND) return PRIVATE_FILE_MISSING;
        win_error(e, why, why_len);
        return -1;
    }
    DWORD n = 0;
    BOOL ok = ReadFile(f, text, (DWORD)size - 1, &n, NULL);
    CloseHandle(f);
    if (!ok || n == size - 1) {
        snprintf(why, why_len, "%s", ok ? "longer than a key" : "unreadable");
        return -1;
    }
    text[n] = 0;
    return 0;
}

const char plat_private_file_note[] =
    "Windows has no mode bits: let only its owner read it (its ACL; under Wine, chmod 600 it)";

int plat_write_private_file(const char *path, const char *text, char *why, size_t why_len) {
    HANDLE f = CreateFileA(path, GENERIC_WRITE, 0, NULL, CREATE_NEW, FILE_ATTRIBUTE_NORMAL, NULL);
    if (f == INVALID_HANDLE_VALUE) {
        win_error(GetLastError(), why, why_len);
        return -1;
    }
    DWORD n = (DWORD)strlen(text), put = 0;
    BOOL ok = WriteFile(f, text, n, &put, NULL) && put == n;
    CloseHandle(f);
    if (!ok) {
        snprintf(why, why_len, "could not write it");
        DeleteFileA(path);
        return -1;
    }
    return 0;
}
