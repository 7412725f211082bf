/*
 * What both of executor-c's executors (kiln_executor.c for Linux, kiln_executor_win.c for
 * Windows) answer alike: the simple answers, the checks of addresses against the
 * reservations, Write and Read. Included by each after it defines: struct reservation
 * (used, target, len, working, pages), reservations[MAX_RESERVATIONS], send_frame(),
 * reply_error(), and (below) prepared(), which differs (Linux keeps a BTI guard bit).
 */
#ifndef KILN_EXECUTOR_REQUESTS_H
#define KILN_EXECUTOR_REQUESTS_H

static int prepared(uint64_t addr, uint64_t len, int permission);

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

/* Whether code at `addr` may run: its page is prepared read-execute. */
static int runnable(uint64_t addr) {
    return prepared(addr, 1, 0);
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

#endif
