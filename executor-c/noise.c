/*
 * noise.c: Noise_NNpsk0_25519_ChaChaPoly_SHA512, the responder (see noise.h). The state
 * machine follows the Noise specification's SymmetricState and HandshakeState (sections 5.2
 * and 5.3) for the one pattern Kiln uses:
 *
 *     NNpsk0:
 *       -> psk, e
 *       <- e, ee
 *
 * with the "psk" rules of section 9 (an "e" token also calls MixKey). Monocypher does all
 * of the cryptography; nothing here computes a primitive.
 */
#include "noise.h"

#include <string.h>

#include "monocypher.h"
#include "optional/monocypher-ed25519.h"

#define HASH 64

static const char protocol_name[] = "Noise_NNpsk0_25519_ChaChaPoly_SHA512";

struct symmetric {
    uint8_t ck[HASH], h[HASH];
    struct noise_cipher c;
};

void noise_wipe(void *secret, size_t n) { crypto_wipe(secret, n); }

static void mix_hash(struct symmetric *s, const uint8_t *data, size_t n) {
    crypto_sha512_ctx ctx;
    crypto_sha512_init(&ctx);
    crypto_sha512_update(&ctx, s->h, HASH);
    crypto_sha512_update(&ctx, data, n);
    crypto_sha512_final(&ctx, s->h);
}

/* Noise's HKDF (section 4.3), with HMAC-SHA512: two or three outputs. */
static void hkdf(const uint8_t ck[HASH], const uint8_t *ikm, size_t n, uint8_t out1[HASH], uint8_t out2[HASH],
                 uint8_t out3[HASH]) {
    uint8_t temp[HASH], in[HASH + 1];
    crypto_sha512_hmac(temp, ck, HASH, ikm, n);
    in[0] = 1;
    crypto_sha512_hmac(out1, temp, HASH, in, 1);
    memcpy(in, out1, HASH);
    in[HASH] = 2;
    crypto_sha512_hmac(out2, temp, HASH, in, HASH + 1);
    if (out3) {
        memcpy(in, out2, HASH);
        in[HASH] = 3;
        crypto_sha512_hmac(out3, temp, HASH, in, HASH + 1);
    }
    crypto_wipe(temp, sizeof temp);
    crypto_wipe(in, sizeof in);
}

static void mix_key(struct symmetric *s, const uint8_t *ikm, size_t n) {
    uint8_t out1[HASH], out2[HASH];
    hkdf(s->ck, ikm, n, out1, out2, NULL);
    memcpy(s->ck, out1, HASH);
    memcpy(s->c.key, out2, NOISE_KEY);
    s->c.n = 0;
    crypto_wipe(out1, sizeof out1);
    crypto_wipe(out2, sizeof out2);
}

static void mix_key_and_hash(struct symmetric *s, const uint8_t *ikm, size_t n) {
    uint8_t out1[HASH], out2[HASH], out3[HASH];
    hkdf(s->ck, ikm, n, out1, out2, out3);
    memcpy(s->ck, out1, HASH);
    mix_hash(s, out2, HASH);
    memcpy(s->c.key, out3, NOISE_KEY);
    s->c.n = 0;
    crypto_wipe(out1, sizeof out1);
    crypto_wipe(out2, sizeof out2);
    crypto_wipe(out3, sizeof out3);
}

/* ChaChaPoly's nonce (section 12.3): 32 bits of zeros, then n as a little-endian u64. */
static void nonce_of(uint64_t n, uint8_t nonce[12]) {
    memset(nonce, 0, 4);
    for (int i = 0; i < 8; i++) nonce[4 + i] = (uint8_t)(n >> (8 * i));
}

static void seal_with(struct noise_cipher *c, const uint8_t *ad, size_t ad_len, const uint8_t *plain, size_t n,
                      uint8_t *out) {
    uint8_t nonce[12];
    nonce_of(c->n, nonce);
    crypto_aead_ctx ctx;
    crypto_aead_init_ietf(&ctx, c->key, nonce);
    crypto_aead_write(&ctx, out, out + n, ad, ad_len, plain, n);
    crypto_wipe(&ctx, sizeof ctx);
    c->n++;
}

static int open_with(struct noise_cipher *c, const uint8_t *ad, size_t ad_len, const uint8_t *in, size_t n,
                     uint8_t *plain) {
    if (n < NOISE_TAG) return -1;
    uint8_t nonce[12];
    nonce_of(c->n, nonce);
    crypto_aead_ctx ctx;
    crypto_aead_init_ietf(&ctx, c->key, nonce);
    int bad = crypto_aead_read(&ctx, plain, in + n - NOISE_TAG, ad, ad_len, in, n - NOISE_TAG);
    crypto_wipe(&ctx, sizeof ctx);
    if (bad) return -1;
    c->n++;
    return 0;
}

void noise_seal(struct noise_cipher *c, const uint8_t *plain, size_t n, uint8_t *out) {
    seal_with(c, NULL, 0, plain, n, out);
}

int noise_open(struct noise_cipher *c, const uint8_t *in, size_t n, uint8_t *plain) {
    return open_with(c, NULL, 0, in, n, plain);
}

/* One handshake message: a big-endian u16 length, which must be `n`, and the bytes. */
static int read_message(noise_io io, void *ctx, uint8_t *buf, size_t n) {
    uint8_t len[2];
    if (io(ctx, len, 2, 0) != 0) return -1;
    if (((size_t)len[0] << 8 | len[1]) != n) return -1;
    return io(ctx, buf, n, 0);
}

int noise_respond(const uint8_t psk[NOISE_KEY], const uint8_t ephemeral[NOISE_KEY], noise_io io, void *ctx,
                  struct noise_session *session, const char **why) {
    struct symmetric s;
    memset(&s, 0, sizeof s);
    /* The name is shorter than the hash: h is the name padded with zeros. */
    memcpy(s.h, protocol_name, sizeof protocol_name - 1);
    memcpy(s.ck, s.h, HASH);
    mix_hash(&s, NULL, 0); /* the empty prologue */
    int result = -1;
    uint8_t message[2 + NOISE_KEY + NOISE_TAG], empty[1], their_e[NOISE_KEY], my_e[NOISE_KEY], shared[NOISE_KEY];
    *why = "the peer does not hold the key (or does not speak Kiln's Noise handshake)";
    /* -> psk, e (and an empty payload) */
    if (read_message(io, ctx, message, NOISE_KEY + NOISE_TAG) != 0) {
        *why = "the peer sent no handshake message of the right length";
        goto out;
    }
    mix_key_and_hash(&s, psk, NOISE_KEY);
    memcpy(their_e, message, NOISE_KEY);
    mix_hash(&s, their_e, NOISE_KEY);
    mix_key(&s, their_e, NOISE_KEY);
    if (open_with(&s.c, s.h, HASH, message + NOISE_KEY, NOISE_TAG, empty) != 0) goto out;
    mix_hash(&s, message + NOISE_KEY, NOISE_TAG);
    /* <- e, ee (and an empty payload) */
    crypto_x25519_public_key(my_e, ephemeral);
    message[0] = 0;
    message[1] = NOISE_KEY + NOISE_TAG;
    memcpy(message + 2, my_e, NOISE_KEY);
    mix_hash(&s, my_e, NOISE_KEY);
    mix_key(&s, my_e, NOISE_KEY);
    crypto_x25519(shared, ephemeral, their_e);
    mix_key(&s, shared, NOISE_KEY);
    seal_with(&s.c, s.h, HASH, NULL, 0, message + 2 + NOISE_KEY);
    mix_hash(&s, message + 2 + NOISE_KEY, NOISE_TAG);
    if (io(ctx, message, sizeof message, 1) != 0) {
        *why = "the connection ended during the handshake";
        goto out;
    }
    /* Split: the initiator sends with the first key, the responder with the second. */
    uint8_t k1[HASH], k2[HASH];
    hkdf(s.ck, NULL, 0, k1, k2, NULL);
    memcpy(session->recv.key, k1, NOISE_KEY);
    memcpy(session->send.key, k2, NOISE_KEY);
    session->recv.n = session->send.n = 0;
    crypto_wipe(k1, sizeof k1);
    crypto_wipe(k2, sizeof k2);
    /* The initiator's first transport message: empty, so its tag alone. */
    if (read_message(io, ctx, message, NOISE_TAG) != 0 || noise_open(&session->recv, message, NOISE_TAG, empty) != 0) {
        *why = "the peer did not complete the handshake (a replayed first message, or a wrong key)";
        crypto_wipe(session, sizeof *session);
        goto out;
    }
    result = 0;
out:
    crypto_wipe(&s, sizeof s);
    crypto_wipe(shared, sizeof shared);
    return result;
}
