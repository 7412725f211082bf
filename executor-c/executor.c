/*
 * kiln-executor-c: a Kiln executor written in C from docs/PROTOCOL.md alone, for targets
 * where Rust is not available (here: AArch64 and RISC-V 64 under qemu-user, x86-64 Linux,
 * and x86-64 Windows under Wine). It serves the copy transport over TCP, keyed as
 * kiln-executor is (docs/PROTOCOL.md, "Keyed TCP"):
 *
 *   kiln-executor-c --listen ADDRESS:PORT [--key-file FILE] [--max-unauthenticated N]
 *   kiln-executor-c --listen 127.0.0.1:PORT --no-auth     (plaintext, loopback only)
 *
 * (PORT 0: any; the address is printed once it listens.) Each connection runs the Noise
 * handshake with the pre-shared key (noise.c, Monocypher's primitives) and is served in a
 * process of its own. This file is the protocol and every request's handling, for every
 * system; what differs between systems — sockets and processes, memory views and their
 * protection, threads and locks, crash and exit reports, the program's standard streams,
 * symbols and libraries, unwind tables, static TLS and exports — is asked of the platform
 * (platform.h): platform_posix.c for Linux, platform_windows.c for Windows. The message
 * tags and the fields' encoding are in wire.h.
 *
 * Code memory is dual-mapped, as Kiln's own executor does it: a memory object mapped
 * twice, the target view with the final permission of each page (never writable and
 * executable) and a writable working view that Write requests go to. The code of RunMain,
 * Call, RunInitializers and RunFinalizers runs off the thread that reads the connection,
 * which goes on serving the controller meanwhile (the links of lazy functions' bodies
 * among its requests). Requests a system's executor does not implement are answered with
 * an Error naming them (plat_serves).
 */
#include "platform.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

/* ---- the connection ------------------------------------------------------------------ */

static int tracing; /* KILN_EXECUTOR_TRACE=1: requests logged to stderr */

/* Moves all `n` bytes to (`out`) or from the connection, as they are on the wire: 0, or
 * -1 when it failed or ended. No allocation, no lock (crash reports send with it). */
static int transfer_all(uint8_t *p, size_t n, int out) {
    while (n > 0) {
        long k = plat_transfer(p, n, out);
        if (k < 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* The keyed transport: once the handshake is done, the frame stream travels in Noise
 * transport messages (a big-endian u16 length, the ciphertext and its tag), as many as a
 * frame needs. What one message brought and the frames have not taken yet waits in
 * `plain` (the reading thread's alone). */
static int secure;
static struct noise_session session;
static uint8_t plain[NOISE_MAX_MESSAGE], record[NOISE_MAX_MESSAGE];
static size_t plain_len, plain_at;

/* Wire bytes for `n` bytes of frames. */
static size_t wire_size(size_t n) {
    if (!secure) return n;
    size_t messages = (n + NOISE_MAX_PLAIN - 1) / NOISE_MAX_PLAIN;
    return n + messages * (2 + NOISE_TAG);
}

/* `n` bytes of frames as they go on the wire into `wire` (wire_size(n) bytes; the same
 * bytes when the connection is not keyed). Under the send lock, or where nothing else
 * sends (crash reports). */
static void seal_frames(const uint8_t *p, size_t n, uint8_t *wire) {
    if (!secure) {
        memmove(wire, p, n);
        return;
    }
    while (n > 0) {
        size_t chunk = n < NOISE_MAX_PLAIN ? n : NOISE_MAX_PLAIN;
        size_t len = chunk + NOISE_TAG;
        wire[0] = (uint8_t)(len >> 8);
        wire[1] = (uint8_t)len;
        noise_seal(&session.send, p, chunk, wire + 2);
        wire += 2 + len;
        p += chunk;
        n -= chunk;
    }
}

/* Reads `n` bytes of frames: 0, or -1 when the connection ended or a message failed its
 * tag (tampered, replayed, reordered, another session's: the connection is closed). */
static int read_frames(uint8_t *p, size_t n) {
    if (!secure) return transfer_all(p, n, 0);
    while (n > 0) {
        if (plain_at == plain_len) {
            uint8_t len[2];
            if (transfer_all(len, 2, 0) != 0) return -1;
            size_t k = (size_t)len[0] << 8 | len[1];
            if (k < NOISE_TAG || transfer_all(record, k, 0) != 0) return -1;
            if (noise_open(&session.recv, record, k, plain) != 0) {
                logf_("kiln-executor-c: a message failed its integrity check (tampered, replayed or out of order): closing\n");
                return -1;
            }
            plain_len = k - NOISE_TAG;
            plain_at = 0;
            continue;
        }
        size_t take = plain_len - plain_at < n ? plain_len - plain_at : n;
        memcpy(p, plain + plain_at, take);
        plain_at += take;
        p += take;
        n -= take;
    }
    return 0;
}

/* The handshake's transfers on the process's connection. */
static int connection_io(void *ctx, uint8_t *p, size_t n, int out) {
    (void)ctx;
    return transfer_all(p, n, out);
}

/* The key this executor was started with (NULL: --no-auth). */
static uint8_t psk[NOISE_KEY];
static int keyed;

static const uint8_t preamble_keyed[8] = {'K', 'I', 'L', 'N', 0, 0, 0, 'N'};
static const uint8_t preamble_plain[8] = {'K', 'I', 'L', 'N', 0, 0, 0, 'P'};

int secure_accept(noise_io io, void *ctx, struct noise_session *s, char *why, size_t why_len) {
    uint8_t ephemeral[NOISE_KEY];
    if (plat_random(ephemeral, sizeof ephemeral) != 0) {
        snprintf(why, why_len, "no random bytes for the handshake");
        return -1;
    }
    uint8_t preamble[8];
    memcpy(preamble, preamble_keyed, 8);
    const char *reason = "the connection ended before the handshake";
    int r = io(ctx, preamble, 8, 1) == 0 ? noise_respond(psk, ephemeral, io, ctx, s, &reason) : -1;
    noise_wipe(ephemeral, sizeof ephemeral);
    if (r != 0) snprintf(why, why_len, "%s", reason);
    return r;
}

void logf_(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    plat_log_write(buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* Non-zero while a frame is being written (a crash report waits for it). */
static atomic_int sending;

int frame_in_flight(void) { return atomic_load(&sending); }

/* Sends one frame, in one write: `body` starts with the tag (the frame is allocated for
 * the body's length and the 8 bytes before it). */
static void send_frame(uint32_t id, const struct writer *body) {
    uint32_t len = (uint32_t)body->len + 4;
    size_t n = body->len + 8;
    uint8_t *frame = malloc(n);
    if (!frame) plat_quit(70);
    for (int i = 0; i < 4; i++) frame[i] = (uint8_t)(len >> (8 * i));
    for (int i = 0; i < 4; i++) frame[4 + i] = (uint8_t)(id >> (8 * i));
    memcpy(frame + 8, body->p, body->len);
    uint8_t *wire = secure ? malloc(wire_size(n)) : frame;
    if (!wire) plat_quit(70);
    plat_lock(LOCK_SEND);
    atomic_store(&sending, 1);
    seal_frames(frame, n, wire);
    int failed = transfer_all(wire, wire_size(n), 1) != 0;
    atomic_store(&sending, 0);
    plat_unlock(LOCK_SEND);
    if (wire != frame) free(wire);
    free(frame);
    if (failed) plat_quit(0); /* the controller is gone */
}

void put_le(uint8_t *at, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) at[i] = (uint8_t)(v >> (8 * i));
}

/* The callers' fields (4 or 24 bytes) fit the 64-byte frame. */
void send_report(uint8_t tag, const uint8_t *fields, size_t n) {
    uint8_t frame[64] = {0}, wire[2 + 64 + NOISE_TAG];
    put_le(frame, 5 + n, 4);
    frame[8] = tag;
    memcpy(frame + 9, fields, n);
    seal_frames(frame, 9 + n, wire);
    (void)transfer_all(wire, wire_size(9 + n), 1);
}

void send_output(int stream, const uint8_t *bytes, uint32_t n) {
    struct writer w = {0};
    wr_u8(&w, A_OUTPUT);
    wr_u8(&w, (uint8_t)stream);
    wr_bytes(&w, bytes, n);
    send_frame(0, &w);
    free(w.p);
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

static void reply_simple(uint32_t id, uint8_t tag) {
    struct writer w = {0};
    wr_u8(&w, tag);
    send_frame(id, &w);
    free(w.p);
}

static void reply_value(uint32_t id, uint64_t v) {
    struct writer w = {0};
    wr_u8(&w, A_VALUE);
    wr_u64(&w, v);
    send_frame(id, &w);
    free(w.p);
}

/* ---- memory -------------------------------------------------------------------------- */

static struct reservation reservations[MAX_RESERVATIONS];
static uint64_t page_size = 4096;

static struct reservation *reservation(uint64_t handle) {
    if (handle == 0 || handle > MAX_RESERVATIONS || !reservations[handle - 1].used) return NULL;
    return &reservations[handle - 1];
}

/* Whether [addr, addr + len) lies inside reservation `r`. */
static int inside(const struct reservation *r, uint64_t addr, uint64_t len) {
    return addr >= r->target && len <= r->len && addr - r->target <= r->len - len;
}

/* The reservation holding [addr, addr + len), if any. */
static struct reservation *holding(uint64_t addr, uint64_t len) {
    for (int i = 0; i < MAX_RESERVATIONS; i++)
        if (reservations[i].used && inside(&reservations[i], addr, len)) return &reservations[i];
    return NULL;
}

int in_reserved_memory(uint64_t addr) { return holding(addr, 1) != NULL; }

/* Whether every page of [addr, addr + len) is prepared, with `permission` (0 RX, 1 R,
 * 2 RW) or, for -1, with any readable one. */
static int prepared(uint64_t addr, uint64_t len, int permission) {
    struct reservation *r = holding(addr, len ? len : 1);
    if (!r) return 0;
    uint64_t first = (addr - r->target) / page_size;
    uint64_t last = (addr + (len ? len : 1) - 1 - r->target) / page_size;
    for (uint64_t p = first; p <= last; p++) {
        uint8_t state = r->pages[p] & ~GUARDED;
        if (state == 0) return 0;
        if (permission >= 0 && state != permission + 1) return 0;
    }
    return 1;
}

/* Whether code at `addr` may run: its page is prepared read-execute. */
int runnable(uint64_t addr) {
    return prepared(addr, 1, 0);
}

/* Maps a target view of `len` bytes where `lo <= start` and `start + len <= hi`: hints
 * spread over the window, nearest the window's middle first, then (where the system can
 * tell) any free range of the window. */
static void *map_target(intptr_t memory, uint64_t len, uint64_t lo, uint64_t hi) {
    if (lo == 0 && hi == UINT64_MAX) return plat_map_target(memory, len, 0, lo, hi);
    uint64_t align = plat_view_alignment();
    uint64_t mid = lo / 2 + hi / 2;
    for (int k = 0; k < 128; k++) {
        int64_t step = (int64_t)((k + 1) / 2) * (int64_t)(16 << 20) * (k % 2 ? 1 : -1);
        uint64_t hint = (mid + (uint64_t)step) & ~(align - 1);
        if (hint < lo || hint + len > hi || hint < align) continue;
        void *p = plat_map_target(memory, len, hint, lo, hi);
        if (p) return p;
    }
    return plat_map_free_range(memory, len, lo, hi);
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
    char why[1024];
    switch (placement) {
    case 0: break;
    case 1:
        /* Near the C library, which JIT code calls most. */
        windows = plat_library_windows(reach, len, window, why, sizeof why);
        if (!windows) return reply_error(id, "%s", why);
        break;
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
    intptr_t memory = plat_new_memory(len, why, sizeof why);
    if (memory == -1) return reply_error(id, "%s", why);
    void *target = NULL;
    int used = 0;
    for (; used < windows && !target; used++) target = map_target(memory, len, window[used][0], window[used][1]);
    if (!target) {
        plat_release(&(struct reservation){0, 0, 0, NULL, memory, NULL});
        return reply_error(id, "no free address range of %#llx bytes satisfies placement %u", (unsigned long long)len, placement);
    }
    uint8_t *working;
    if (plat_working_view(memory, target, len, &working, why, sizeof why) != 0) return reply_error(id, "%s", why);
    struct reservation res = {1, (uint64_t)(uintptr_t)target, len, working, memory, NULL};
    res.pages = calloc((size_t)(len / page_size), 1);
    if (!res.pages) {
        plat_release(&res);
        return reply_error(id, "out of memory for the page map of %#llx bytes", (unsigned long long)len);
    }
    reservations[slot] = res;
    if (tracing) logf_("kiln-executor-c: reserved %#llx bytes at %p (placement %u, window %#llx..%#llx)\n", (unsigned long long)len, target, placement, (unsigned long long)window[used - 1][0], (unsigned long long)window[used - 1][1]);
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

/* Prepare: the target view's pages get their final permission now; writes go to the
 * working view. */
static void do_prepare(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle"), start = rd_u64(r, "start"), end = rd_u64(r, "end");
    uint8_t permission = rd_u8(r, "permission");
    if (r->bad || r->left) return reply_error(id, "malformed Prepare: %s", r->bad ? r->bad : "trailing bytes");
    if (permission > 2) return reply_error(id, "unknown permission %u", permission);
    struct reservation *res = pages(id, handle, start, end);
    if (!res) return;
    char why[1024];
    if (plat_prepare(start, end, permission, why, sizeof why) != 0) return reply_error(id, "%s", why);
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
        if (!inside(res, segs[i][0], segs[i][1]) || segs[i][2] > 2) {
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
    /* Code written through the working view is fetched through the target view. */
    char why[1024];
    for (uint32_t i = 0; i < n; i++) {
        if (segs[i][2] != 0 || segs[i][1] == 0) continue;
        if (plat_code_written(res, segs[i][0], segs[i][1], why, sizeof why) != 0) {
            free(segs);
            return reply_error(id, "%s", why);
        }
    }
    free(segs);
    reply_simple(id, A_OK);
}

/* GuardBranchTargets: whole pages of read-execute code built for BTI are guarded where
 * the system has it (AArch64 Linux); elsewhere the range is checked and answered Ok. */
static void do_guard_branch_targets(uint32_t id, struct reader *r) {
    uint64_t addr = rd_u64(r, "address"), len = rd_u64(r, "length");
    if (r->bad || r->left) return reply_error(id, "malformed GuardBranchTargets: %s", r->bad ? r->bad : "trailing bytes");
    if (len == 0 || addr % page_size || len % page_size)
        return reply_error(id, "guard branch targets: %#llx+%#llx is not whole pages", (unsigned long long)addr, (unsigned long long)len);
    if (!prepared(addr, len, 0))
        return reply_error(id, "guard branch targets: %#llx+%#llx is not code this executor prepared", (unsigned long long)addr, (unsigned long long)len);
    char why[1024];
    if (plat_guard_branch_targets(holding(addr, len), addr, len, why, sizeof why) != 0) return reply_error(id, "%s", why);
    reply_simple(id, A_OK);
}

/* Deinitialize: the pages become inaccessible, and their contents are discarded, so that
 * they read as zeros when prepared again. */
static void do_deinitialize(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle"), start = rd_u64(r, "start"), end = rd_u64(r, "end");
    if (r->bad || r->left) return reply_error(id, "malformed Deinitialize: %s", r->bad ? r->bad : "trailing bytes");
    struct reservation *res = pages(id, handle, start, end);
    if (!res) return;
    memset(res->pages + (start - res->target) / page_size, 0, (end - start) / page_size);
    plat_discard(res, start, end);
    reply_simple(id, A_OK);
}

static void do_release(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle");
    if (r->bad || r->left) return reply_error(id, "malformed Release: %s", r->bad ? r->bad : "trailing bytes");
    struct reservation *res = reservation(handle);
    if (!res) return reply_error(id, "no reservation with handle %llu", (unsigned long long)handle);
    plat_release(res);
    free(res->pages);
    memset(res, 0, sizeof *res);
    reply_simple(id, A_OK);
}

/* Write: into the working view, after checking the whole range lies in the reservation. */
static void do_write(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle"), address = rd_u64(r, "address");
    uint32_t len;
    const uint8_t *bytes = rd_bytes(r, &len, "bytes");
    if (r->bad || r->left) return reply_error(id, "malformed Write: %s", r->bad ? r->bad : "trailing bytes");
    struct reservation *res = reservation(handle);
    if (!res) return reply_error(id, "no reservation with handle %llu", (unsigned long long)handle);
    if (!inside(res, address, len)) return reply_error(id, "write of %u bytes at %#llx is outside reservation %llu", len, (unsigned long long)address, (unsigned long long)handle);
    memcpy(res->working + (address - res->target), bytes, len);
    reply_simple(id, A_OK);
}

/* Read: from the working view (always readable), the range checked as for Write. */
static void do_read(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle"), address = rd_u64(r, "address"), len = rd_u64(r, "len");
    if (r->bad || r->left) return reply_error(id, "malformed Read: %s", r->bad ? r->bad : "trailing bytes");
    struct reservation *res = reservation(handle);
    if (!res) return reply_error(id, "no reservation with handle %llu", (unsigned long long)handle);
    if (len > 32u * 1024 * 1024 || !inside(res, address, len)) return reply_error(id, "read of %#llx bytes at %#llx is outside reservation %llu", (unsigned long long)len, (unsigned long long)address, (unsigned long long)handle);
    struct writer w = {0};
    wr_u8(&w, A_BYTES);
    wr_bytes(&w, res->working + (address - res->target), (uint32_t)len);
    send_frame(id, &w);
    free(w.p);
}

/* ---- symbols ------------------------------------------------------------------------- */

static void *libraries[MAX_LIBRARIES];
static char *library_paths[MAX_LIBRARIES];
static int library_count;

/* Library `id`'s handle (0: the process, NULL); 0 if there is no such library. */
static int library(uint64_t id, void **handle) {
    if (id > (uint64_t)library_count) return 0;
    *handle = id == 0 ? NULL : libraries[id - 1];
    return 1;
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
    plat_lookup(handle, libraries, library_count, name, &address, &kind);
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
    void *handle = NULL;
    if (!r->bad && !library(lib, &handle)) return reply_error(id, "no library with handle %llu", (unsigned long long)lib);
    struct writer w = {0};
    wr_u8(&w, A_SYMBOLS);
    wr_u32(&w, n);
    for (uint32_t i = 0; i < n && !r->bad; i++) {
        char *name = rd_string(r, "name");
        uint64_t address = 0;
        uint8_t kind = 0;
        if (name) plat_lookup(handle, libraries, library_count, name, &address, &kind);
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
    char why[1024];
    void *handle = plat_load_library(path, why, sizeof why);
    if (!handle) {
        reply_error(id, "%s", why);
        free(path);
        return;
    }
    libraries[library_count] = handle;
    library_paths[library_count] = path;
    reply_value(id, (uint64_t)++library_count);
}

/* ---- thread-local storage and exports ------------------------------------------------- */

/* TLS modules: ids from ReserveTlsModule, each block in static TLS once placed (JIT
 * code's __tls_get_addr, the platform's, finds it with tls_block_offset). */
#define TLS_MODULE_BASE 0x4b494c4e00000000ull
#define MAX_TLS_MODULES 4096
static struct tls_module {
    int placed, removed;
    int64_t tp_offset;
} tls_modules[MAX_TLS_MODULES];
static atomic_uint tls_module_count;

int tls_block_offset(uint64_t module, int64_t *offset) {
    uint64_t index = module - TLS_MODULE_BASE;
    if (index >= MAX_TLS_MODULES || index >= atomic_load(&tls_module_count) || !tls_modules[index].placed) return 0;
    *offset = tls_modules[index].tp_offset;
    return 1;
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
    if (plat_static_tls(size, align, image, image_len, &m->tp_offset, why, sizeof why) != 0)
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
static int export_count;

static void do_export_symbols(uint32_t id, struct reader *r) {
    uint32_t n = rd_count(r, 4 + 8 + 8 + 1, "symbols");
    struct export_symbol *symbols = calloc(n ? n : 1, sizeof *symbols);
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
    else if (!(handle = plat_export(symbols, n, why, sizeof why)))
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
    plat_unexport(exports[handle - 1]);
    exports[handle - 1] = NULL;
    reply_simple(id, A_OK);
}

/* SetEnvironment: the controller's environment (NAME=VALUE entries) replaces ours, and its
 * working directory (unless empty) becomes ours. Checked whole before anything changes. */
static void do_set_environment(uint32_t id, struct reader *r) {
    uint32_t n = rd_count(r, 4, "variables");
    char **vars = calloc(n + 1, sizeof *vars);
    if (!vars) return reply_error(id, "SetEnvironment: out of memory");
    char why[1024];
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
    if (dir[0] && plat_enter_directory(dir, why, sizeof why) != 0) {
        reply_error(id, "%s", why);
        free(dir);
        goto done;
    }
    free(dir);
    if (plat_replace_environment(vars, n, why, sizeof why) != 0) reply_error(id, "%s", why);
    else reply_simple(id, A_OK);
done:
    for (uint32_t i = 0; i < n; i++) free(vars[i]);
    free(vars);
}

/* ---- unwind tables ------------------------------------------------------------------ */

/* RegisterEhFrame / DeregisterEhFrame: with the process's unwinder where it takes
 * .eh_frame (libgcc's); on Windows, which unwinds with its own tables, checked and
 * answered Ok, and nothing is registered. */
static void do_eh_frame(uint32_t id, struct reader *r, int reg) {
    uint64_t address = rd_u64(r, "address");
    if (r->bad || r->left) return reply_error(id, "malformed eh_frame request: %s", r->bad ? r->bad : "trailing bytes");
    if (!prepared(address, 4, -1)) return reply_error(id, "eh_frame at %#llx is not in prepared memory", (unsigned long long)address);
    char why[1024];
    if (plat_eh_frame(address, reg, why, sizeof why) != 0) return reply_error(id, "%s", why);
    reply_simple(id, A_OK);
}

/* RegisterUnwindInfo / DeregisterUnwindInfo: a module's Windows unwind data (made by the
 * controller from its .eh_frame), copied into memory of the executor's own and registered
 * (RtlAddFunctionTable), so that the system's unwinder — crash reports, debuggers,
 * CaptureStackBackTrace, longjmp and exceptions — walks through JIT frames. */
#define MAX_UNWIND_TABLES 4096
static void *unwind_tables[MAX_UNWIND_TABLES];

static void do_register_unwind_info(uint32_t id, struct reader *r) {
    uint32_t n = rd_count(r, 20, "functions");
    uint64_t *begin = calloc(n ? n : 1, sizeof *begin), *end = calloc(n ? n : 1, sizeof *end);
    const uint8_t **info = calloc(n ? n : 1, sizeof *info);
    uint32_t *len = calloc(n ? n : 1, sizeof *len);
    int slot = -1;
    for (int i = 0; i < MAX_UNWIND_TABLES && slot < 0; i++)
        if (!unwind_tables[i]) slot = i;
    const char *bad = NULL;
    uint64_t lo = UINT64_MAX, hi = 0;
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
    }
    if (!bad && (r->bad || r->left)) bad = r->bad ? r->bad : "trailing bytes";
    if (!bad && n == 0) bad = "no function";
    if (!bad && slot < 0) bad = "too many unwind tables";
    if (!bad && hi - lo >= ((uint64_t)1 << 32)) bad = "functions more than 4 GiB apart";
    void *table = bad ? NULL : plat_add_unwind_table(begin, end, info, len, n, lo, hi, &bad);
    if (table) unwind_tables[slot] = table;
    free(begin);
    free(end);
    free(info);
    free(len);
    if (bad) return reply_error(id, "RegisterUnwindInfo: %s", bad);
    reply_value(id, (uint64_t)slot + 1);
}

/* RegisterFunctionTable: a module's unwind table as its COFF objects carry it (.pdata,
 * linked in the module with its .xdata): every entry's function must be prepared code and
 * its UNWIND_INFO (with its codes) prepared memory; the entries are copied and registered
 * with the module's base, the unwind information staying where it is. */
static void do_register_function_table(uint32_t id, struct reader *r) {
    uint64_t base = rd_u64(r, "image_base");
    uint32_t n = rd_count(r, 12, "entries");
    uint32_t *e = calloc(n ? (size_t)n * 3 : 1, sizeof *e);
    int slot = -1;
    for (int i = 0; i < MAX_UNWIND_TABLES && slot < 0; i++)
        if (!unwind_tables[i]) slot = i;
    const char *bad = e ? NULL : "out of memory";
    for (uint32_t i = 0; !bad && i < n; i++) {
        uint32_t *x = e + 3 * (size_t)i;
        x[0] = rd_u32(r, "begin");
        x[1] = rd_u32(r, "end");
        x[2] = rd_u32(r, "unwind_info");
        if (r->bad) break;
        uint64_t begin = base + x[0], end = base + x[1], info = base + (x[2] & ~1u);
        if (x[0] >= x[1] || !runnable(begin) || !runnable(end - 1))
            bad = "a function that is not code this executor prepared to run";
        else if (i > 0 && x[0] < x[-3])
            bad = "entries not sorted by their first byte";
        else if (!prepared(info, 4, -1) ||
                 !prepared(info, 4 + 2 * (uint64_t)((const uint8_t *)(uintptr_t)info)[2], -1))
            bad = "unwind information outside memory this executor prepared";
    }
    if (!bad && (r->bad || r->left)) bad = r->bad ? r->bad : "trailing bytes";
    if (!bad && n == 0) bad = "no function";
    if (!bad && slot < 0) bad = "too many unwind tables";
    void *table = bad ? NULL : plat_add_function_table(e, n, base, &bad);
    if (table) unwind_tables[slot] = table;
    free(e);
    if (bad) return reply_error(id, "RegisterFunctionTable: %s", bad);
    reply_value(id, (uint64_t)slot + 1);
}

static void do_deregister_unwind_info(uint32_t id, struct reader *r) {
    uint64_t handle = rd_u64(r, "handle");
    if (r->bad || r->left) return reply_error(id, "malformed DeregisterUnwindInfo: %s", r->bad ? r->bad : "trailing bytes");
    if (handle == 0 || handle > MAX_UNWIND_TABLES || !unwind_tables[handle - 1])
        return reply_error(id, "no unwind table with handle %llu", (unsigned long long)handle);
    plat_delete_unwind_table(unwind_tables[handle - 1]);
    unwind_tables[handle - 1] = NULL;
    reply_simple(id, A_OK);
}

/* ---- code guards ---------------------------------------------------------------------- */

/* Each request's run of JIT code holds a guard of the epoch current when it started; a
 * store of a stub's slot (StoreCodePointer) advances the epoch and answers the epoch the
 * replaced body was retired at; the controller frees a body once the oldest guard held
 * (OldestCodeGuard) is later. As Kiln's own executor does (kiln_executor::code_guards). */
static uint64_t guard_epoch = 1;
static uint64_t *guards_held;
static size_t guards_n, guards_cap;

static uint64_t guard_pin(void) {
    plat_lock(LOCK_GUARDS);
    if (guards_n == guards_cap) {
        size_t cap = guards_cap ? 2 * guards_cap : 64;
        uint64_t *held = realloc(guards_held, cap * sizeof *held);
        if (!held) plat_quit(70); /* a guard not kept could let a running body be freed */
        guards_held = held;
        guards_cap = cap;
    }
    uint64_t epoch = guard_epoch;
    guards_held[guards_n++] = epoch;
    plat_unlock(LOCK_GUARDS);
    return epoch;
}

static void guard_unpin(uint64_t epoch) {
    plat_lock(LOCK_GUARDS);
    for (size_t i = 0; i < guards_n; i++)
        if (guards_held[i] == epoch) {
            guards_held[i] = guards_held[--guards_n];
            break;
        }
    plat_unlock(LOCK_GUARDS);
}

static uint64_t guard_advance(void) {
    plat_lock(LOCK_GUARDS);
    uint64_t retired = guard_epoch++;
    plat_unlock(LOCK_GUARDS);
    return retired;
}

/* The epoch now: advanced by every StoreCodePointer. */
static uint64_t guard_now(void) {
    plat_lock(LOCK_GUARDS);
    uint64_t now = guard_epoch;
    plat_unlock(LOCK_GUARDS);
    return now;
}

static uint64_t guard_oldest(void) {
    plat_lock(LOCK_GUARDS);
    uint64_t oldest = guard_epoch;
    for (size_t i = 0; i < guards_n; i++)
        if (guards_held[i] < oldest) oldest = guards_held[i];
    plat_unlock(LOCK_GUARDS);
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

#define CODE_STACK (8u << 20)
#define WAITER_STACK (256u << 10)

static char *empty_argv[] = {"kiln", NULL};
static struct code_job *code_thread_job;
static int code_thread_state; /* 0 not started, 1 idle, 2 busy */
/* Requests whose JIT code runs (a program's exit() is reported while one does). */
static atomic_int running_code;
static atomic_int main_running;

int code_running(void) { return atomic_load(&running_code); }

/* Checks that every address of a list lies in reserved memory; answers if not. */
static int all_code(uint32_t id, const uint64_t *functions, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (!runnable(functions[i])) {
            reply_error(id, "%#llx is not code this executor prepared to run", (unsigned long long)functions[i]);
            return 0;
        }
    return 1;
}

static uint64_t *rd_addresses(struct reader *r, uint32_t *n) {
    *n = rd_count(r, 8, "functions");
    uint64_t *list = calloc(*n ? *n : 1, sizeof *list);
    if (!list) { r->bad = "memory"; return NULL; }
    for (uint32_t i = 0; i < *n; i++) list[i] = rd_u64(r, "function");
    return list;
}

static struct code_job *new_job(uint32_t id, uint8_t tag) {
    struct code_job *job = calloc(1, sizeof *job);
    if (!job) plat_quit(70);
    job->id = id;
    job->tag = tag;
    return job;
}

static void free_job(struct code_job *job) {
    for (int i = 0; job->argv && i < job->argc; i++) free(job->argv[i]);
    free(job->argv);
    free(job->list);
    free(job);
}

/* After the job's code: its answer, once nothing of it runs. */
static void finish_job(struct code_job *job, uint64_t value) {
    plat_drain_output();
    /* Not running any more before the answer: a Shutdown sent after it is served. */
    atomic_fetch_sub(&running_code, 1);
    if (job->tag == T_RUN_MAIN) atomic_store(&main_running, 0);
    if (job->tag == T_CALL || job->tag == T_RUN_MAIN) reply_value(job->id, value);
    else reply_simple(job->id, A_OK);
    free_job(job);
}

/* A job that could not start: answered, and not running. */
static void job_not_started(struct code_job *job, const char *why) {
    atomic_fetch_sub(&running_code, 1);
    if (job->tag == T_RUN_MAIN) atomic_store(&main_running, 0);
    reply_error(job->id, "%s", why);
    free_job(job);
}

typedef uint64_t (*call6)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

/* Runs the job's code; its value (the call's, main's status). Every address was checked
 * to be code prepared read-execute before the job was started. */
static uint64_t run_code(struct code_job *job) {
    uint64_t value = 0;
    plat_before_code();
    switch (job->tag) {
    case T_CALL: {
        /* Six integer arguments, in the system's calling convention (Win64: the first four
         * in rcx, rdx, r8, r9, the others on the stack above the home area). */
        const uint64_t *a = job->args;
        value = ((call6)(uintptr_t)job->address)(a[0], a[1], a[2], a[3], a[4], a[5]);
        break;
    }
    case T_RUN_INITIALIZERS:
        for (uint32_t i = 0; i < job->n; i++)
            ((void (*)(int, char **, char **))(uintptr_t)job->list[i])(1, empty_argv, plat_environ());
        break;
    case T_RUN_FINALIZERS:
        plat_finalize(job->dso);
        for (uint32_t i = 0; i < job->n; i++) ((void (*)(void))(uintptr_t)job->list[i])();
        break;
    case T_RUN_MAIN:
        value = (uint32_t)((int (*)(int, char **, char **))(uintptr_t)job->address)(job->argc, job->argv, plat_environ());
        break;
    }
    /* What the code wrote is sent before its answer (stdout is a pipe: fully buffered). */
    plat_flush_stdio();
    return value;
}

static void run_job(struct code_job *job) {
    uint64_t guard = guard_pin();
    uint64_t value = run_code(job);
    guard_unpin(guard);
    finish_job(job, value);
}

static void *code_thread(void *unused) {
    (void)unused;
    plat_code_thread_enter();
    plat_lock(LOCK_JOBS);
    for (;;) {
        while (!code_thread_job) plat_wait(COND_JOBS, LOCK_JOBS);
        struct code_job *job = code_thread_job;
        code_thread_job = NULL;
        plat_unlock(LOCK_JOBS);
        run_job(job);
        plat_lock(LOCK_JOBS);
        code_thread_state = 1;
    }
    return NULL;
}

struct own_run {
    struct code_job *job;
    uint64_t value;
    void *room;
};

static void *own_thread(void *arg) {
    struct own_run *m = arg;
    m->room = plat_code_thread_enter();
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
    struct plat_thread *thread;
    if (plat_start_thread(own_thread, &m, CODE_STACK, &thread) != 0) {
        guard_unpin(guard);
        job_not_started(m.job, "cannot start a thread for the request's code");
        return NULL;
    }
    plat_join(thread);
    /* The thread is gone: nothing can be running on what it was given for reports. */
    plat_code_thread_left(m.room);
    guard_unpin(guard);
    finish_job(m.job, m.value);
    return NULL;
}

/* Runs `job` off the reading thread; its code answers. */
static void start_job(struct code_job *job) {
    atomic_fetch_add(&running_code, 1);
    if (job->tag == T_RUN_MAIN) {
        if (plat_start_thread(own_waiter, job, WAITER_STACK, NULL) != 0) job_not_started(job, "cannot start main's thread");
        return;
    }
    plat_lock(LOCK_JOBS);
    if (code_thread_state == 0 && plat_start_thread(code_thread, NULL, CODE_STACK, NULL) == 0) code_thread_state = 1;
    if (code_thread_state == 1) {
        code_thread_state = 2;
        code_thread_job = job;
        plat_wake_one(COND_JOBS);
        plat_unlock(LOCK_JOBS);
        return;
    }
    plat_unlock(LOCK_JOBS);
    if (plat_start_thread(own_waiter, job, WAITER_STACK, NULL) != 0) job_not_started(job, "cannot start a thread for the request's code");
}

static void do_call(uint32_t id, struct reader *r) {
    uint64_t address = rd_u64(r, "address");
    uint32_t n = rd_count(r, 8, "arguments");
    if (n > 6) return reply_error(id, "Call takes at most 6 arguments, not %u", n);
    struct code_job *job = new_job(id, T_CALL);
    job->address = address;
    for (uint32_t i = 0; i < n; i++) job->args[i] = rd_u64(r, "argument");
    if (r->bad || r->left) {
        reply_error(id, "malformed Call: %s", r->bad ? r->bad : "trailing bytes");
        free_job(job);
    } else if (!runnable(address)) {
        reply_error(id, "%#llx is not code this executor prepared to run", (unsigned long long)address);
        free_job(job);
    } else {
        start_job(job);
    }
}

static void do_run_main(uint32_t id, struct reader *r) {
    struct code_job *job = new_job(id, T_RUN_MAIN);
    job->address = rd_u64(r, "address");
    uint32_t n = rd_count(r, 4, "argv");
    job->argv = calloc((size_t)n + 1, sizeof *job->argv);
    for (uint32_t i = 0; job->argv && i < n; i++) job->argv[i] = rd_string(r, "argument");
    job->argc = job->argv ? (int)n : 0;
    if (!job->argv || r->bad || r->left) {
        reply_error(id, "malformed RunMain: %s", r->bad ? r->bad : "trailing bytes");
    } else if (!runnable(job->address)) {
        reply_error(id, "main at %#llx is not code this executor prepared to run", (unsigned long long)job->address);
    } else if (atomic_exchange(&main_running, 1)) {
        reply_error(id, "main is running");
    } else {
        return start_job(job);
    }
    free_job(job);
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

static void do_input(struct reader *r) {
    uint32_t len;
    const uint8_t *bytes = rd_bytes(r, &len, "bytes");
    if (!r->bad) plat_give_input(bytes, len);
}

/* ---- call-through stubs ------------------------------------------------------------------ */

/* A stub with no body yet jumps to the platform's entry (__kiln_lazy_entry) with its id
 * where the stub put it; the entry saves the caller's argument registers, calls
 * kiln_lazy_resolve, restores them and jumps where it answered. The calling thread sends
 * ResolveStub (id 0x8000_0000 | n) and waits; the reading thread, which goes on serving
 * the controller's requests (the body's link), takes the answer, stores the slot and
 * wakes it. */
struct stub_wait {
    uint32_t n;
    int done;
    uint64_t target;
    /* The epoch when the ResolveStub was sent: a StoreCodePointer served after it may
     * have stored a newer body than the answer, computed from the body current then. */
    uint64_t asked;
    struct stub_wait *next;
};

static struct stub_wait *stub_waits;
static uint32_t stub_requests;

/* Where a call goes whose body could not be made: returns 0, whatever the signature. */
uint64_t kiln_lazy_call_failed(void) {
    return 0;
}

uint64_t kiln_lazy_resolve(uint64_t stub) {
    if (plat_in_forked_child()) {
        /* A child the program forked: the connection is its parent's, whose requests and
         * answers it must not mix with. */
        logf_("kiln-executor-c: call-through stub %llu called in a forked child: the call returns 0\n", (unsigned long long)stub);
        return (uint64_t)(uintptr_t)kiln_lazy_call_failed;
    }
    if (atomic_load(&running_code) == 0 || plat_is_reading_thread()) {
        logf_("kiln-executor-c: call-through stub %llu called when no request's code runs: the call returns 0\n", (unsigned long long)stub);
        return (uint64_t)(uintptr_t)kiln_lazy_call_failed;
    }
    int saved_errno = errno;
    struct stub_wait w = {0};
    w.asked = guard_now();
    plat_lock(LOCK_STUBS);
    do w.n = ++stub_requests & 0x7fffffffu; while (w.n == 0);
    w.next = stub_waits;
    stub_waits = &w;
    plat_unlock(LOCK_STUBS);
    struct writer m = {0};
    wr_u8(&m, T_RESOLVE_STUB);
    wr_u64(&m, stub);
    send_frame(0x80000000u | w.n, &m);
    free(m.p);
    plat_lock(LOCK_STUBS);
    while (!w.done) plat_wait(COND_STUBS, LOCK_STUBS);
    plat_unlock(LOCK_STUBS);
    errno = saved_errno;
    return w.target;
}

/* On the reading thread: the controller's answer to a ResolveStub. */
static void stub_answer(uint32_t fid, uint8_t tag, struct reader *r) {
    uint64_t target = (uint64_t)(uintptr_t)kiln_lazy_call_failed;
    uint64_t asked = 0;
    plat_lock(LOCK_STUBS);
    for (struct stub_wait *s = stub_waits; s; s = s->next)
        if (s->n == (fid & 0x7fffffffu)) asked = s->asked;
    plat_unlock(LOCK_STUBS);
    if (tag == A_STUB_RESOLVED) {
        uint64_t to = rd_u64(r, "target"), slot = rd_u64(r, "slot");
        if (r->bad || r->left) {
            logf_("kiln-executor-c: malformed StubResolved (%s): the call returns 0\n", r->bad ? r->bad : "trailing bytes");
        } else {
            target = to;
            if (slot && (slot % 8 || !prepared(slot, 8, 2)))
                logf_("kiln-executor-c: StubResolved names a slot at %#llx, not in prepared writable memory: not stored\n", (unsigned long long)slot);
            /* Stored only if no StoreCodePointer came since it was asked (one may have
             * stored a newer body: the slot keeps it; this call runs the body answered,
             * which its request's guard keeps). A slot left unresolved resolves again. */
            else if (slot && guard_now() == asked)
                plat_store_code_pointer(slot, to);
        }
    } else if (tag != A_ERROR) {
        logf_("kiln-executor-c: an answer of tag %u to ResolveStub: closing\n", tag);
        plat_quit(1);
    }
    plat_lock(LOCK_STUBS);
    struct stub_wait **at = &stub_waits;
    while (*at && (*at)->n != (fid & 0x7fffffffu)) at = &(*at)->next;
    struct stub_wait *w = *at;
    if (w) {
        *at = w->next;
        w->target = target;
        w->done = 1;
        plat_wake_all(COND_STUBS);
    }
    plat_unlock(LOCK_STUBS);
    if (!w) {
        logf_("kiln-executor-c: an answer with id %#x, which no ResolveStub had: closing\n", fid);
        plat_quit(1);
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
    plat_store_code_pointer(slot, target);
    reply_value(id, guard_advance());
}

/* ---- serving ------------------------------------------------------------------------- */

/* Reads one frame's body (id, tag, fields); -1 when the connection ends or the frame is
 * beyond the limit (nothing is allocated for it). The body is read into an allocation of
 * exactly its length. */
static int read_frame(uint8_t **body, uint32_t *len) {
    uint8_t head[4];
    if (read_frames(head, 4) != 0) return -1;
    *len = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24;
    if (*len < 5 || *len > MAX_FRAME) {
        logf_("kiln-executor-c: frame of %u bytes refused (limit %u): closing\n", *len, MAX_FRAME);
        return -1;
    }
    *body = malloc(*len);
    if (!*body || read_frames(*body, *len) != 0) {
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
    wr_string(&w, plat_triple);
    wr_u32(&w, plat_process_id());
    wr_u32(&w, MAX_FRAME);
    /* Runtime symbols: what JIT code takes from the executor (the platform's list). */
    size_t n;
    const struct runtime_symbol *symbols = plat_runtime_symbols(&n);
    wr_u32(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        wr_string(&w, symbols[i].name);
        wr_u64(&w, (uint64_t)(uintptr_t)symbols[i].address);
    }
    send_frame(0, &w);
    free(w.p);
}

void serve_connection(uintptr_t connection, const struct noise_session *established) {
    plat_connect(connection);
    tracing = getenv("KILN_EXECUTOR_TRACE") != NULL;
    page_size = plat_page_size();
    char why[256];
    if (established) {
        /* The handshake was done by the process that accepted the connection. */
        session = *established;
        secure = 1;
    } else if (keyed) {
        if (secure_accept(connection_io, NULL, &session, why, sizeof why) != 0) {
            logf_("kiln-executor-c: refused a connection: %s\n", why);
            plat_quit(1);
        }
        secure = 1;
    } else if (transfer_all((uint8_t *)preamble_plain, 8, 1) != 0) {
        plat_quit(1);
    }
    /* Keyed, the peer's first transport message decrypted: it holds the key. */
    plat_authenticated();
    plat_setup_crash_reports();
    plat_setup_stdio();
    plat_setup_runtime();
    plat_mark_reading_thread();
    send_hello();
    for (;;) {
        /* A request already decrypted needs no waiting for the socket. */
        if (plain_at == plain_len && plat_wait_request() != 0) plat_quit(1);
        uint8_t *body;
        uint32_t len;
        if (read_frame(&body, &len) != 0) plat_quit(0);
        struct reader r = {body, len, NULL};
        uint32_t id = rd_u32(&r, "id");
        uint8_t tag = rd_u8(&r, "tag");
        if (id & 0x80000000u) {
            /* Only an answer to a ResolveStub of ours has the top bit set. */
            if (!plat_serves(T_STORE_CODE_POINTER)) {
                logf_("kiln-executor-c: a message with id %#x, which no request of this executor had: closing\n", id);
                plat_quit(1);
            }
            stub_answer(id, tag, &r);
            free(body);
            continue;
        }
        if (tracing) logf_("kiln-executor-c: request %u (tag %u, %u bytes)\n", id, tag, len);
        switch (plat_serves(tag) ? tag : -1) {
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
        case T_INPUT: do_input(&r); break;
        case T_SET_ENVIRONMENT: do_set_environment(id, &r); break;
        case T_GUARD_BRANCH_TARGETS: do_guard_branch_targets(id, &r); break;
        case T_RESERVE_TLS_MODULE: do_reserve_tls_module(id, &r); break;
        case T_INSTALL_TLS: do_place_tls(id, &r, 0); break;
        case T_PLACE_STATIC_TLS: do_place_tls(id, &r, 1); break;
        case T_REMOVE_TLS: do_remove_tls(id, &r); break;
        case T_EXPORT_SYMBOLS: do_export_symbols(id, &r); break;
        case T_UNEXPORT_SYMBOLS: do_unexport_symbols(id, &r); break;
        case T_REGISTER_UNWIND_INFO: do_register_unwind_info(id, &r); break;
        case T_DEREGISTER_UNWIND_INFO: do_deregister_unwind_info(id, &r); break;
        case T_REGISTER_FUNCTION_TABLE: do_register_function_table(id, &r); break;
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
            /* The program's end, after main returned (its exit handlers, where the
             * executor keeps them), its output sent before the answer. */
            plat_program_end();
            plat_drain_output();
            reply_simple(id, A_OK);
            free(body);
            plat_shutdown_send();
            plat_quit(0);
        default: {
            const char *name = request_name(tag);
            if (name) reply_error(id, "%s does not implement %s", plat_executor_name, name);
            else reply_error(id, "unknown request tag %u", tag);
        }
        }
        free(body);
    }
}

/* ---- the listener -------------------------------------------------------------------- */

static const char usage[] =
    "usage: kiln-executor-c --listen ADDRESS:PORT [--key-file FILE] [--max-unauthenticated N]\n"
    "       kiln-executor-c --listen 127.0.0.1:PORT --no-auth\n"
    "\n"
    "  --listen ADDRESS:PORT    accept controllers on this IPv4 address (PORT 0: any; the\n"
    "                           address is printed once it listens); each connection\n"
    "                           authenticates with the key and is encrypted\n"
    "  --key-file FILE          the key: 64 hex digits, in a file only its owner may read\n"
    "                           (created, mode 0600, if missing; without the option a new\n"
    "                           one is made and its path printed)\n"
    "  --no-auth                plaintext, loopback addresses only\n"
    "  --max-unauthenticated N  most connections still in their handshake (default 64; the\n"
    "                           oldest makes room for a new one)\n";

/* 64 hex digits, white space around them ignored: 0 with the key. */
static int parse_key(const char *text, uint8_t out[NOISE_KEY]) {
    while (*text == ' ' || *text == '\t' || *text == '\n' || *text == '\r') text++;
    for (int i = 0; i < 2 * NOISE_KEY; i++) {
        char c = text[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (v < 0) return -1;
        if (i % 2 == 0) out[i / 2] = (uint8_t)(v << 4);
        else out[i / 2] |= (uint8_t)v;
    }
    for (text += 2 * NOISE_KEY; *text; text++)
        if (*text != ' ' && *text != '\t' && *text != '\n' && *text != '\r') return -1;
    return 0;
}

/* The key from `path` (checked private, parsed), or a new one written to it (a new file,
 * mode 0600) or, with no path, to a new file in the runtime or temporary directory. */
static int take_key(const char *path, uint16_t port) {
    char why[512], text[160];
    if (path) {
        int r = plat_read_private_file(path, text, sizeof text, why, sizeof why);
        if (r == 0) {
            if (parse_key(text, psk) != 0) {
                fprintf(stderr, "kiln-executor-c: %s: a key is 64 hexadecimal digits (32 bytes)\n", path);
                return -1;
            }
            fprintf(stderr, "kiln-executor-c: key from %s\n", path);
            return 0;
        }
        if (r != PRIVATE_FILE_MISSING) {
            fprintf(stderr, "kiln-executor-c: %s: %s\n", path, why);
            return -1;
        }
    }
    if (plat_random(psk, sizeof psk) != 0) {
        fprintf(stderr, "kiln-executor-c: no random bytes for a key\n");
        return -1;
    }
    char made[1024];
    if (!path) {
        const char *dir = getenv("XDG_RUNTIME_DIR");
        if (!dir || !*dir) dir = getenv("TMPDIR");
        if (!dir || !*dir) dir = getenv("TEMP");
        if (!dir || !*dir) dir = "/tmp";
        snprintf(made, sizeof made, "%s/kiln-executor-c-%u-%u.key", dir, (unsigned)plat_process_id(), (unsigned)port);
        path = made;
    }
    for (int i = 0; i < NOISE_KEY; i++) snprintf(text + 2 * i, 3, "%02x", psk[i]);
    text[2 * NOISE_KEY] = '\n';
    text[2 * NOISE_KEY + 1] = 0;
    if (plat_write_private_file(path, text, why, sizeof why) != 0) {
        fprintf(stderr, "kiln-executor-c: %s: %s\n", path, why);
        return -1;
    }
    noise_wipe(text, sizeof text);
    fprintf(stderr,
            "kiln-executor-c: new key in %s (%s): give it to kiln run --key-file %s or KILN_EXECUTOR_KEY_FILE\n",
            path, plat_private_file_note, path);
    return 0;
}

int main(int argc, char **argv) {
    int started = plat_startup(argc, argv);
    if (started >= 0) return started;
    const char *address = NULL, *key_file = NULL;
    int no_auth = 0;
    long max_unauthenticated = 64;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) address = argv[++i];
        else if (strcmp(argv[i], "--key-file") == 0 && i + 1 < argc) key_file = argv[++i];
        else if (strcmp(argv[i], "--no-auth") == 0) no_auth = 1;
        else if (strcmp(argv[i], "--max-unauthenticated") == 0 && i + 1 < argc) {
            char *end;
            max_unauthenticated = strtol(argv[++i], &end, 10);
            if (*end || max_unauthenticated < 1 || max_unauthenticated > MAX_UNAUTHENTICATED) {
                fprintf(stderr, "kiln-executor-c: --max-unauthenticated takes 1 to %d\n", MAX_UNAUTHENTICATED);
                return 2;
            }
        } else {
            fputs(usage, stderr);
            return 2;
        }
    }
    if (!address || (no_auth && key_file)) {
        fputs(usage, stderr);
        return 2;
    }
    char host[64];
    const char *colon = strrchr(address, ':');
    if (!colon || (size_t)(colon - address) >= sizeof host) {
        fprintf(stderr, "kiln-executor-c: expected ADDRESS:PORT, not %s\n", address);
        return 2;
    }
    memcpy(host, address, (size_t)(colon - address));
    host[colon - address] = 0;
    uint16_t port = (uint16_t)atoi(colon + 1);
    char why[1024];
    switch (plat_listen(host, port, no_auth, &port, why, sizeof why)) {
    case 0: break;
    case LISTEN_NOT_IPV4:
        fprintf(stderr, "kiln-executor-c: %s is not an IPv4 address\n", host);
        return 2;
    case LISTEN_NOT_LOOPBACK:
        fprintf(stderr,
                "kiln-executor-c: refusing to serve %s without authentication: anyone who reaches it could run code as "
                "this user. Drop --no-auth (connections then need the key), or listen on a loopback address.\n",
                host);
        return 2;
    default:
        fprintf(stderr, "kiln-executor-c: cannot listen on %s: %s\n", address, why);
        return 1;
    }
    if (!no_auth) {
        if (take_key(key_file, port) != 0) return 1;
        keyed = 1;
    } else {
        fprintf(stderr, "kiln-executor-c: --no-auth: any local process that reaches %s:%u can run code as this user\n",
                host, port);
    }
    fprintf(stderr, "kiln-executor-c: listening on %s:%u (%s)\n", host, port, plat_triple);
    fflush(stderr);
    if (plat_serve(keyed, (int)max_unauthenticated, why, sizeof why) != 0) {
        fprintf(stderr, "kiln-executor-c: %s\n", why);
        return 1;
    }
    return 0;
}
