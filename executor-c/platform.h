/*
 * platform.h: what executor.c (the protocol and every request's handling, for every
 * system) asks of the system it runs on, and what it offers the platform's file in turn.
 * One implementation per system: platform_posix.c (Linux: x86-64, AArch64, RISC-V 64) and
 * platform_windows.c (x86-64 Windows, built with mingw-w64); build.sh compiles executor.c
 * with the one for its compiler. Every `why` buffer gets the whole text of an Error.
 */
#ifndef KILN_PLATFORM_H
#define KILN_PLATFORM_H

#ifdef _WIN32
/* The executor's own formatting is C99's (%llx, %zu) on Windows too. */
#define __USE_MINGW_ANSI_STDIO 1
#endif

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "noise.h"

#define MAX_RESERVATIONS 1024
#define MAX_LIBRARIES 256
/* The most --max-unauthenticated may be. */
#define MAX_UNAUTHENTICATED 1024
/* How long a connection has, from its acceptance, to complete the handshake (its first
 * transport message decrypted): until then it is not authenticated. */
#define HANDSHAKE_SECONDS 10

/* ---- what the platform's file offers ------------------------------------------------ */

/* The executor's name in Errors for requests it does not implement, and its triple. */
extern const char plat_executor_name[];
extern const char plat_triple[];
/* Whether this system's executor serves request `tag` (else an Error names it). */
int plat_serves(int tag);

/* Process start: -1 to go on to `--listen`, else main's status (Windows: a connection
 * handed over on the command line is served from here). */
int plat_startup(int argc, char **argv);
/* The listener on `host`:`port` (an IPv4 address; a loopback one when `plaintext`): 0 with
 * the port bound, else LISTEN_NOT_IPV4, LISTEN_NOT_LOOPBACK or LISTEN_FAILED (with `why`).
 * Then serving it for ever: each connection in a process of its own, which calls
 * serve_connection. Keyed, at most `max_unauthenticated` connections wait for their
 * handshake (the oldest is dropped to make room), each for HANDSHAKE_SECONDS at most;
 * serving returns only when accepting fails (-1 with `why`). */
enum { LISTEN_NOT_IPV4 = 1, LISTEN_NOT_LOOPBACK, LISTEN_FAILED };
int plat_listen(const char *host, uint16_t port, int plaintext, uint16_t *bound, char *why, size_t why_len);
int plat_serve(int keyed, int max_unauthenticated, char *why, size_t why_len);
/* This process's connection is authenticated (or needs no key): its deadline ends, and the
 * listener no longer counts it among those waiting. */
void plat_authenticated(void);
/* `n` random bytes from the system: 0, or -1. */
int plat_random(uint8_t *p, size_t n);
/* A file only its owner may read or write, read whole into `text` (NUL-terminated): 0,
 * PRIVATE_FILE_MISSING, or -1 with `why` (others may read or write it: its mode, as
 * kiln-executor checks it; unreadable; too long). A new such file written with `text`
 * (never over an existing one): 0, or -1 with `why`. */
enum { PRIVATE_FILE_MISSING = 1 };
int plat_read_private_file(const char *path, char *text, size_t size, char *why, size_t why_len);
int plat_write_private_file(const char *path, const char *text, char *why, size_t why_len);
/* How private a file plat_write_private_file made is (said beside its path). */
extern const char plat_private_file_note[];

/* The connection served by this process: taken; one send (`out`) or receive of at most
 * `n` bytes (the count moved, 0 if interrupted, -1 when it failed or ended); its sending
 * half closed; waiting for a request (0, or -1: the connection failed), which may move
 * queued input meanwhile. */
void plat_connect(uintptr_t connection);
long plat_transfer(uint8_t *p, size_t n, int out);
void plat_shutdown_send(void);
int plat_wait_request(void);
/* Ends the process at once: no exit handlers. */
__attribute__((noreturn)) void plat_quit(int status);
uint32_t plat_process_id(void);
/* Writes to the executor's own stderr (never the program's), failing quietly. */
void plat_log_write(const char *text, size_t n);

/* Locks and condition variables, by name. */
enum { LOCK_SEND, LOCK_JOBS, LOCK_GUARDS, LOCK_STUBS, LOCK_COUNT };
enum { COND_JOBS, COND_STUBS, COND_COUNT };
void plat_lock(int lock);
void plat_unlock(int lock);
void plat_wait(int cond, int lock);
void plat_wake_one(int cond);
void plat_wake_all(int cond);

/* Threads: `fn` on a thread of `stack` bytes, detached, or joinable (`*joinable`); 0 or
 * -1. A thread that runs JIT code enters with room for a crash report (what it returns
 * is given back to code_thread_left once the thread has ended). The reading thread. */
struct plat_thread;
int plat_start_thread(void *(*fn)(void *), void *arg, size_t stack, struct plat_thread **joinable);
void plat_join(struct plat_thread *thread);
void *plat_code_thread_enter(void);
/* Before a request's code runs on the calling thread: whatever the thread needs of what was
 * installed since its code last ran (Windows: modules' thread-local images). */
void plat_before_code(void);
void plat_code_thread_left(void *room);
void plat_mark_reading_thread(void);
int plat_is_reading_thread(void);
/* In a child the program forked (never on Windows). */
int plat_in_forked_child(void);

/* Exits and crashes reported (signals, exceptions, exit()), set up once per connection;
 * the program's end after main returned (its exit handlers, on Windows). */
void plat_setup_crash_reports(void);
void plat_program_end(void);

/* The program's standard streams: pipes made once, their output forwarded with
 * send_output; input given; stdio buffers flushed; drained: everything the program
 * wrote has been sent. */
void plat_setup_stdio(void);
void plat_give_input(const uint8_t *bytes, uint32_t len);
void plat_flush_stdio(void);
void plat_drain_output(void);

/* The runtime JIT code finds: set up once per connection; the hello's runtime symbols;
 * a symbol (address, kind: 0 unknown, 1 function, 2 data) in `library` (NULL: the
 * process, `libraries` the ones loaded); a library loaded (NULL, `why`); the environment
 * main gets; __cxa_finalize of a module's dso handle (where there is one). */
struct runtime_symbol {
    const char *name;
    void (*address)(void);
};
void plat_setup_runtime(void);
const struct runtime_symbol *plat_runtime_symbols(size_t *n);
void plat_lookup(void *library, void *const *libraries, int count, const char *name, uint64_t *address, uint8_t *kind);
void *plat_load_library(const char *path, char *why, size_t why_len);
char **plat_environ(void);
void plat_finalize(uint64_t dso);

/* Code memory: a memory object mapped twice per reservation. */
struct reservation {
    int used;
    uint64_t target, len;
    uint8_t *working;
    intptr_t memory; /* the memfd, the section */
    /* Per page: 0 unprepared, else 1 + the permission it was prepared with (0 RX, 1 R,
     * 2 RW), so that nothing is run, read or flushed on a page that is not ready; with
     * GUARDED set on a page of code mapped PROT_BTI. */
    uint8_t *pages;
};
#define GUARDED 0x80

uint64_t plat_page_size(void);
/* The alignment of a target view's address. */
uint64_t plat_view_alignment(void);
/* The windows ([lo, hi), at most 2, best first) within `reach` of the C library; 0 with
 * `why` if there is none. */
int plat_library_windows(uint64_t reach, uint64_t len, uint64_t window[2][2], char *why, size_t why_len);
/* A memory object of `len` bytes (reading as zeros); -1 with `why`. */
intptr_t plat_new_memory(uint64_t len, char *why, size_t why_len);
/* A target view at `hint` (0: anywhere), inaccessible, within [lo, hi); NULL if not
 * there. Then, once hints failed, one in any free range of the window (or NULL). */
void *plat_map_target(intptr_t memory, uint64_t len, uint64_t hint, uint64_t lo, uint64_t hi);
void *plat_map_free_range(intptr_t memory, uint64_t len, uint64_t lo, uint64_t hi);
/* The target view made inaccessible and the working view mapped, or everything undone
 * (the target view unmapped, the object freed) and -1 with `why`. */
int plat_working_view(intptr_t memory, void *target, uint64_t len, uint8_t **working, char *why, size_t why_len);
/* A reservation's views unmapped and its object freed. */
void plat_release(const struct reservation *r);
/* Pages [start, end) given a permission (0 RX, 1 R, 2 RW); -1 with `why`. */
int plat_prepare(uint64_t start, uint64_t end, int permission, char *why, size_t why_len);
/* Code written through the working view made what its target runs; -1 with `why`. */
int plat_code_written(const struct reservation *r, uint64_t addr, uint64_t len, char *why, size_t why_len);
/* Whole pages of code guarded (BTI) where the system has it; -1 with `why`. */
int plat_guard_branch_targets(struct reservation *r, uint64_t addr, uint64_t len, char *why, size_t why_len);
/* Pages [start, end) made inaccessible and their contents discarded (zeros). */
void plat_discard(const struct reservation *r, uint64_t start, uint64_t end);
/* One atomic store of a stub's slot, seen by every thread. */
void plat_store_code_pointer(uint64_t slot, uint64_t target);

/* Unwind tables: `.eh_frame` registered with the process's unwinder (reg 1) or not (0);
 * Windows' tables (RUNTIME_FUNCTION entries for [begin, end) with their UNWIND_INFO)
 * copied within 4 GiB of [lo, hi) and registered: the table, or NULL with the reason. */
int plat_eh_frame(uint64_t address, int reg, char *why, size_t why_len);
void *plat_add_unwind_table(const uint64_t *begin, const uint64_t *end, const uint8_t *const *info,
                            const uint32_t *len, uint32_t n, uint64_t lo, uint64_t hi, const char **bad);
/* Windows' tables as COFF objects carry them: `n` RUNTIME_FUNCTION entries (begin, end,
 * unwind info: three words each, relative to `base`, sorted), their UNWIND_INFO in JIT
 * memory; the entries copied and registered with that base: the table, or NULL with the
 * reason. plat_delete_unwind_table withdraws either kind. */
void *plat_add_function_table(const uint32_t *entries, uint32_t n, uint64_t base, const char **bad);
void plat_delete_unwind_table(void *table);
/* The size of one RUNTIME_FUNCTION entry. */
#define UNWIND_ENTRY_SIZE 12

/* Static TLS: a block placed (its offset from the thread pointer), or -1 with `why`. */
int plat_static_tls(uint64_t size, uint64_t align, const uint8_t *image, uint32_t image_len, int64_t *tp_offset,
                    char *why, size_t why_len);
/* Exported definitions: a set opened (NULL with `why`), a set closed. */
struct export_symbol {
    char *name;
    uint64_t address, size;
    uint8_t function;
};
void *plat_export(const struct export_symbol *symbols, uint32_t n, char *why, size_t why_len);
void plat_unexport(void *set);
/* SetEnvironment: the working directory entered, the environment replaced (NAME=VALUE
 * entries, checked); -1 with `why`. */
int plat_enter_directory(const char *dir, char *why, size_t why_len);
int plat_replace_environment(char **vars, uint32_t n, char *why, size_t why_len);

/* ---- what executor.c offers the platform's file -------------------------------------- */

/* Serves `connection` in this process: keyed, its handshake first (unless `established`,
 * a session whose handshake another process ran: Windows' listener), then the protocol. */
__attribute__((noreturn)) void serve_connection(uintptr_t connection, const struct noise_session *established);
/* The preamble `N` sent through `io` and the handshake run as responder with this
 * executor's key, up to the initiator's first transport message: 0 with the session, or
 * -1 with `why`. */
int secure_accept(noise_io io, void *ctx, struct noise_session *s, char *why, size_t why_len);
__attribute__((format(gnu_printf, 1, 2))) void logf_(const char *fmt, ...);
/* An Output frame of stream 1 (stdout) or 2 (stderr). */
void send_output(int stream, const uint8_t *bytes, uint32_t n);
/* A frame `len, id 0, tag, fields` built on the stack and sent as is (no allocation, no
 * lock: for exit and crash reports); `v` little-endian in `bytes` bytes. */
void send_report(uint8_t tag, const uint8_t *fields, size_t n);
void put_le(uint8_t *at, uint64_t v, int bytes);
/* Non-zero while a frame is being written. */
int frame_in_flight(void);
/* Requests whose JIT code runs. */
int code_running(void);
/* Whether `addr` lies in reserved memory; whether code there may run. */
int in_reserved_memory(uint64_t addr);
int runnable(uint64_t addr);
/* The offset from the thread pointer of TLS module `module`'s block (0 if it has none). */
int tls_block_offset(uint64_t module, int64_t *offset);
/* Call-through stubs: where their entry asks for a body, and where a failed one goes. */
uint64_t kiln_lazy_resolve(uint64_t stub);
uint64_t kiln_lazy_call_failed(void);

#endif
