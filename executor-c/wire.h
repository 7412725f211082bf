/*
 * wire.h: what executor-c's executors share of docs/PROTOCOL.md — the message tags, the
 * names of requests, and the decoding (struct reader, rd_*) and encoding (struct writer,
 * wr_*) of fields. Included by executor.c and the platform files (platform.h);
 * everything here is static (inline: a file that does not use one of them is not warned).
 *
 * Decoding never reads past the frame: every rd_* checks the bytes left first, and the
 * first field that does not fit is kept in `bad` (later reads give zeros), so a request's
 * handler reads all its fields and then answers one Error naming the first bad one.
 */
#ifndef KILN_WIRE_H
#define KILN_WIRE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROTOCOL_VERSION 2
#define MAX_FRAME (32u * 1024 * 1024 + 64 * 1024)
#define MAX_STRING 65536

/* Message tags (docs/PROTOCOL.md). */
enum {
    T_HELLO = 0, T_RESERVE = 1, T_PREPARE = 2, T_INITIALIZE = 3, T_DEINITIALIZE = 4,
    T_RELEASE = 5, T_WRITE = 6, T_READ = 7, T_LOOKUP = 8, T_LOAD_LIBRARY = 9,
    T_REGISTER_EH_FRAME = 10, T_DEREGISTER_EH_FRAME = 11, T_RUN_INITIALIZERS = 12,
    T_RUN_FINALIZERS = 13, T_RUN_MAIN = 17, T_CALL = 18, T_SHUTDOWN = 19,
    T_LOOKUP_MANY = 20, T_INPUT = 24, T_SET_ENVIRONMENT = 30, T_GUARD_BRANCH_TARGETS = 31,
    T_RESERVE_TLS_MODULE = 14, T_INSTALL_TLS = 15, T_REMOVE_TLS = 16, T_PLACE_STATIC_TLS = 21,
    T_EXPORT_SYMBOLS = 22, T_UNEXPORT_SYMBOLS = 23,
    A_OK = 100, A_VALUE = 101, A_RESERVED = 102, A_BYTES = 103, A_SYMBOL = 104,
    A_ERROR = 105, A_CRASHED = 106, A_SYMBOLS = 107, A_EXITED = 108, A_OUTPUT = 109,
    T_RESOLVE_STUB = 29, T_STORE_CODE_POINTER = 33, T_OLDEST_CODE_GUARD = 34, A_STUB_RESOLVED = 110,
    T_REGISTER_UNWIND_INFO = 35, T_DEREGISTER_UNWIND_INFO = 36, T_REGISTER_FUNCTION_TABLE = 38,
};

/* The name of request `tag` (as docs/PROTOCOL.md names it), for the Error answering a
 * request an executor does not implement; NULL for a tag that is no request. */
static inline const char *request_name(int tag) {
    switch (tag) {
    case 1: return "Reserve";
    case 2: return "Prepare";
    case 3: return "Initialize";
    case 4: return "Deinitialize";
    case 5: return "Release";
    case 6: return "Write";
    case 7: return "Read";
    case 8: return "Lookup";
    case 9: return "LoadLibrary";
    case 10: return "RegisterEhFrame";
    case 11: return "DeregisterEhFrame";
    case 12: return "RunInitializers";
    case 13: return "RunFinalizers";
    case 14: return "ReserveTlsModule";
    case 15: return "InstallTls";
    case 16: return "RemoveTls";
    case 17: return "RunMain";
    case 18: return "Call";
    case 19: return "Shutdown";
    case 20: return "LookupMany";
    case 21: return "PlaceStaticTls";
    case 22: return "ExportSymbols";
    case 23: return "UnexportSymbols";
    case 24: return "Input";
    case 25: return "AdoptStdio";
    case 26: return "EnableDebugOutputs";
    case 27: return "RegisterDebug";
    case 28: return "UnregisterDebug";
    case 30: return "SetEnvironment";
    case 31: return "GuardBranchTargets";
    case 32: return "Batch";
    case 33: return "StoreCodePointer";
    case 34: return "OldestCodeGuard";
    case 35: return "RegisterUnwindInfo";
    case 36: return "DeregisterUnwindInfo";
    case 37: return "DeferExports";
    case 38: return "RegisterFunctionTable";
    default: return NULL;
    }
}

/* ---- decoding ------------------------------------------------------------------------ */

struct reader {
    const uint8_t *p;
    size_t left;
    const char *bad; /* the first field that did not fit, or NULL */
};

/* Copies the next `n` bytes to `out` if the frame has them (zeros otherwise). Safe: `p`
 * points into the frame's body with `left` bytes after it, and nothing is read past. */
static inline int take(struct reader *r, void *out, size_t n, const char *field) {
    if (r->bad) {
        memset(out, 0, n);
        return 0;
    }
    if (r->left < n) {
        r->bad = field;
        memset(out, 0, n);
        return 0;
    }
    memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
    return 1;
}

static inline uint8_t rd_u8(struct reader *r, const char *f) { uint8_t v; take(r, &v, 1, f); return v; }
static inline uint32_t rd_u32(struct reader *r, const char *f) {
    uint8_t b[4];
    take(r, b, 4, f);
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static inline uint64_t rd_u64(struct reader *r, const char *f) {
    uint64_t lo = rd_u32(r, f), hi = rd_u32(r, f);
    return lo | hi << 32;
}
/* A `bytes` field: points into the frame (its length checked against the bytes left). */
static inline const uint8_t *rd_bytes(struct reader *r, uint32_t *len, const char *f) {
    *len = rd_u32(r, f);
    if (r->bad) return NULL;
    if (*len > r->left) {
        r->bad = f;
        *len = 0;
        return NULL;
    }
    const uint8_t *at = r->p;
    r->p += *len;
    r->left -= *len;
    return at;
}
/* A `string` field, copied with a terminating NUL (NULL if malformed). */
static inline char *rd_string(struct reader *r, const char *f) {
    uint32_t len;
    const uint8_t *at = rd_bytes(r, &len, f);
    if (!at && r->bad) return NULL;
    if (len > MAX_STRING || memchr(at, 0, len)) {
        r->bad = f;
        return NULL;
    }
    char *s = malloc(len + 1);
    if (!s) {
        r->bad = "memory";
        return NULL;
    }
    memcpy(s, at, len);
    s[len] = 0;
    return s;
}
/* A list count that cannot claim more items than bytes left (each at least `min_item`). */
static inline uint32_t rd_count(struct reader *r, size_t min_item, const char *f) {
    uint32_t n = rd_u32(r, f);
    if (!r->bad && (uint64_t)n * min_item > r->left) r->bad = f;
    return r->bad ? 0 : n;
}

/* ---- encoding ------------------------------------------------------------------------ */

struct writer {
    uint8_t *p;
    size_t len, cap;
};

/* Appends `n` bytes, growing the buffer first (so the copy stays inside it). */
static inline void wr_raw(struct writer *w, const void *data, size_t n) {
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n) cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p) {
            fprintf(stderr, "kiln-executor-c: out of memory\n");
            _Exit(70);
        }
        w->p = p;
        w->cap = cap;
    }
    memcpy(w->p + w->len, data, n);
    w->len += n;
}
static inline void wr_u8(struct writer *w, uint8_t v) { wr_raw(w, &v, 1); }
static inline void wr_u32(struct writer *w, uint32_t v) {
    uint8_t b[4] = {v, v >> 8, v >> 16, v >> 24};
    wr_raw(w, b, 4);
}
static inline void wr_u64(struct writer *w, uint64_t v) { wr_u32(w, (uint32_t)v); wr_u32(w, v >> 32); }
static inline void wr_bytes(struct writer *w, const void *data, uint32_t n) { wr_u32(w, n); wr_raw(w, data, n); }
static inline void wr_string(struct writer *w, const char *s) { wr_bytes(w, s, (uint32_t)strlen(s)); }

#endif
