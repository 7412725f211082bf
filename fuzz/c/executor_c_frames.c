/* libFuzzer harness of executor-c's frame parser (executor-c/wire.h, shared by the Linux
 * and Windows executors): the input is a stream of frames as a controller would send
 * them (u32 length, then id, tag and fields). Each frame goes through the length check
 * the executors make, then its fields are read with the decoders the request handlers
 * use (rd_u8/u32/u64, rd_bytes, rd_string, rd_count), in an order the frame's own bytes
 * choose, until the frame is used up or a field does not fit. Built with clang-16
 * -fsanitize=fuzzer,address (scripts/fuzz_check.sh): a read past a frame, a leak or a
 * crash is a failure. */
#include "../../executor-c/wire.h"

#include <stddef.h>
#include <stdint.h>

static void decode_fields(const uint8_t *body, uint32_t len) {
    struct reader r = {body, len, NULL};
    uint32_t id = rd_u32(&r, "id");
    uint8_t tag = rd_u8(&r, "tag");
    (void)id;
    (void)request_name(tag);
    /* The decoders, as a handler calls them: which one comes next is the frame's choice
     * (its tag, then each field's first byte), so every order is tried. */
    uint8_t pick = tag;
    for (int fields = 0; fields < 64 && !r.bad && r.left > 0; fields++) {
        switch (pick % 6) {
        case 0: (void)rd_u8(&r, "u8"); break;
        case 1: (void)rd_u32(&r, "u32"); break;
        case 2: (void)rd_u64(&r, "u64"); break;
        case 3: {
            uint32_t n;
            const uint8_t *at = rd_bytes(&r, &n, "bytes");
            if (at && n) pick ^= at[n - 1]; /* touches the last byte: in bounds */
            break;
        }
        case 4: {
            char *s = rd_string(&r, "string");
            if (s) pick ^= (uint8_t)strlen(s);
            free(s);
            break;
        }
        default: (void)rd_count(&r, 8, "count"); break;
        }
        if (r.left) pick = (uint8_t)(pick + r.p[0]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    while (size >= 4) {
        uint32_t len = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                       (uint32_t)data[3] << 24;
        data += 4;
        size -= 4;
        /* The executors' check: a frame is at least id and tag, at most MAX_FRAME. */
        if (len < 5 || len > MAX_FRAME) return 0;
        if (len > size) return 0; /* the connection ends inside the frame */
        /* The body in a buffer of its own size, as the executors allocate it: ASan sees
         * any read past it. */
        uint8_t *body = malloc(len);
        if (!body) return 0;
        memcpy(body, data, len);
        decode_fields(body, len);
        free(body);
        data += len;
        size -= len;
    }
    return 0;
}
