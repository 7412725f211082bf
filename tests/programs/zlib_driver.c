/* zlib_driver.c: exercises Debian's static libz.a.
 *
 * Generates 1 MiB of deterministic, compressible pseudo-random data, compresses it with
 * compress2(level 9) and with a streaming deflate (small output buffer, several flush
 * modes), inflates both back (uncompress and streaming inflate), checks equality, and
 * prints sizes, crc32 and adler32 values. Also a gzip-wrapped stream and crc32_combine.
 * Exit code 0 on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#define DATA_SIZE (1u << 20)

static void fill(unsigned char *buf, size_t n)
{
    /* words from a small dictionary chosen by an xorshift generator, plus runs and noise */
    static const char *const dict[] = {"lorem ", "ipsum ", "dolor ", "sit ", "amet ",
                                       "kiln ", "linker ", "object ", "section ", "symbol ",
                                       "relocation ", "\n"};
    unsigned long long s = 0x9E3779B97F4A7C15ULL;
    size_t i = 0;
    while (i < n) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        unsigned r = (unsigned)(s >> 32);
        if (r % 16 == 0) { /* a run of one byte */
            size_t len = 8 + r % 40;
            for (size_t k = 0; k < len && i < n; k++)
                buf[i++] = (unsigned char)('A' + (r >> 8) % 26);
        } else if (r % 16 == 1) { /* raw noise */
            for (int k = 0; k < 4 && i < n; k++)
                buf[i++] = (unsigned char)(r >> (8 * k));
        } else {
            const char *w = dict[(r >> 4) % 12];
            while (*w && i < n)
                buf[i++] = (unsigned char)*w++;
        }
    }
}

static int stream_deflate(const unsigned char *in, size_t in_len, unsigned char *out,
                          size_t out_cap, size_t *out_len, int window_bits, int *chunks)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    int rc = deflateInit2(&zs, 6, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY);
    if (rc != Z_OK)
        return rc;
    unsigned char obuf[4096];
    size_t produced = 0, consumed = 0;
    const size_t in_chunk = 65536;
    *chunks = 0;
    int flush;
    do {
        size_t take = in_len - consumed < in_chunk ? in_len - consumed : in_chunk;
        zs.next_in = (unsigned char *)in + consumed;
        zs.avail_in = (uInt)take;
        consumed += take;
        /* vary flush modes: a sync flush every 4th chunk, a full flush every 7th */
        flush = consumed == in_len ? Z_FINISH
                : (*chunks % 7 == 6) ? Z_FULL_FLUSH
                : (*chunks % 4 == 3) ? Z_SYNC_FLUSH
                                     : Z_NO_FLUSH;
        do {
            zs.next_out = obuf;
            zs.avail_out = sizeof obuf;
            rc = deflate(&zs, flush);
            if (rc == Z_STREAM_ERROR) {
                deflateEnd(&zs);
                return rc;
            }
            size_t have = sizeof obuf - zs.avail_out;
            if (produced + have > out_cap) {
                deflateEnd(&zs);
                return Z_BUF_ERROR;
            }
            memcpy(out + produced, obuf, have);
            produced += have;
        } while (zs.avail_out == 0);
        (*chunks)++;
    } while (flush != Z_FINISH);
    deflateEnd(&zs);
    *out_len = produced;
    return rc == Z_STREAM_END ? Z_OK : rc;
}

static int stream_inflate(const unsigned char *in, size_t in_len, unsigned char *out,
                          size_t out_cap, size_t *out_len, int window_bits)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    int rc = inflateInit2(&zs, window_bits);
    if (rc != Z_OK)
        return rc;
    size_t consumed = 0;
    zs.next_out = out;
    zs.avail_out = 0;
    size_t produced = 0;
    do {
        /* feed input in odd-sized pieces, take output in 3000-byte pieces */
        if (zs.avail_in == 0 && consumed < in_len) {
            size_t take = in_len - consumed < 1237 ? in_len - consumed : 1237;
            zs.next_in = (unsigned char *)in + consumed;
            zs.avail_in = (uInt)take;
            consumed += take;
        }
        size_t room = out_cap - produced < 3000 ? out_cap - produced : 3000;
        zs.next_out = out + produced;
        zs.avail_out = (uInt)room;
        rc = inflate(&zs, Z_NO_FLUSH);
        produced += room - zs.avail_out;
        if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
            inflateEnd(&zs);
            return rc;
        }
        if (rc == Z_BUF_ERROR && consumed == in_len && zs.avail_in == 0)
            break;
    } while (rc != Z_STREAM_END);
    inflateEnd(&zs);
    *out_len = produced;
    return rc == Z_STREAM_END ? Z_OK : Z_DATA_ERROR;
}

int main(void)
{
    int failures = 0;
    unsigned char *data = malloc(DATA_SIZE);
    uLong bound = compressBound(DATA_SIZE);
    unsigned char *comp = malloc(bound);
    unsigned char *comp2 = malloc(bound + 1024);
    unsigned char *back = malloc(DATA_SIZE);
    if (!data || !comp || !comp2 || !back)
        return 2;
    fill(data, DATA_SIZE);

    printf("zlib version prefix: %.1s\n", zlibVersion());
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, data, DATA_SIZE);
    uLong adl = adler32(1L, data, DATA_SIZE);
    printf("data: size=%u crc32=%08lx adler32=%08lx\n", DATA_SIZE, crc, adl);

    /* crc32_combine / adler32_combine over two halves */
    uLong c1 = crc32(0L, data, DATA_SIZE / 3);
    uLong c2 = crc32(0L, data + DATA_SIZE / 3, DATA_SIZE - DATA_SIZE / 3);
    uLong a1 = adler32(1L, data, DATA_SIZE / 3);
    uLong a2 = adler32(1L, data + DATA_SIZE / 3, DATA_SIZE - DATA_SIZE / 3);
    uLong cc = crc32_combine(c1, c2, DATA_SIZE - DATA_SIZE / 3);
    uLong ac = adler32_combine(a1, a2, DATA_SIZE - DATA_SIZE / 3);
    printf("combine: crc32 %s adler32 %s\n", cc == crc ? "ok" : "MISMATCH",
           ac == adl ? "ok" : "MISMATCH");
    failures += cc != crc;
    failures += ac != adl;

    /* one-shot compress2 at level 9 + uncompress */
    uLongf comp_len = bound;
    int rc = compress2(comp, &comp_len, data, DATA_SIZE, 9);
    uLongf back_len = DATA_SIZE;
    int rc2 = uncompress(back, &back_len, comp, comp_len);
    int eq = rc == Z_OK && rc2 == Z_OK && back_len == DATA_SIZE && memcmp(back, data, DATA_SIZE) == 0;
    printf("compress2(9): rc=%d size=%lu ratio=%.4f crc32(comp)=%08lx uncompress rc=%d equal=%d\n",
           rc, (unsigned long)comp_len, (double)comp_len / DATA_SIZE, crc32(0L, comp, comp_len), rc2, eq);
    failures += !eq;

    /* other levels, one shot */
    for (int level = 0; level <= 9; level += 3) {
        uLongf l = bound;
        rc = compress2(comp, &l, data, DATA_SIZE, level);
        printf("compress2(%d): rc=%d size=%lu adler32(comp)=%08lx\n", level, rc, (unsigned long)l,
               adler32(1L, comp, l));
    }

    /* streaming deflate (zlib wrapper, then gzip wrapper) + streaming inflate */
    static const struct {
        const char *name;
        int wbits;
    } modes[] = {{"zlib", 15}, {"gzip", 15 + 16}, {"raw", -15}};
    for (int m = 0; m < 3; m++) {
        size_t slen = 0, blen = 0;
        int chunks = 0;
        memset(back, 0, DATA_SIZE);
        rc = stream_deflate(data, DATA_SIZE, comp2, bound + 1024, &slen, modes[m].wbits, &chunks);
        rc2 = stream_inflate(comp2, slen, back, DATA_SIZE, &blen, modes[m].wbits);
        eq = rc == Z_OK && rc2 == Z_OK && blen == DATA_SIZE && memcmp(back, data, DATA_SIZE) == 0;
        printf("stream %-4s: deflate rc=%d chunks=%d size=%zu crc32(comp)=%08lx inflate rc=%d "
               "size=%zu crc32(back)=%08lx equal=%d\n",
               modes[m].name, rc, chunks, slen, crc32(0L, comp2, (uInt)slen), rc2, blen,
               crc32(0L, back, (uInt)blen), eq);
        failures += !eq;
    }

    /* corrupted input must be rejected */
    comp[comp_len / 2] ^= 0x55;
    back_len = DATA_SIZE;
    rc = uncompress(back, &back_len, comp, comp_len);
    printf("corrupted: uncompress rc=%d (%s)\n", rc, rc == Z_OK ? "ACCEPTED" : "rejected");
    failures += rc == Z_OK;

    free(data);
    free(comp);
    free(comp2);
    free(back);
    printf("failures=%d\n", failures);
    return failures ? 1 : 0;
}
