/*
 * noise.h: the executor's end of Kiln's authenticated transport (docs/PROTOCOL.md,
 * "Keyed TCP"): the Noise handshake Noise_NNpsk0_25519_ChaChaPoly_SHA512 as responder,
 * and its transport messages. Every primitive — X25519, ChaCha20-Poly1305 (IETF), SHA-512
 * and its HMAC — is Monocypher's (monocypher.c, optional/monocypher-ed25519.c, from the
 * monocypher-sys crate's sources; build.sh finds them). What is ours is only the Noise
 * state machine that strings them together, as the Noise specification (revision 34)
 * defines it, so that kiln-executor (snow) and executor-c speak the same suite.
 */
#ifndef KILN_NOISE_H
#define KILN_NOISE_H

#include <stddef.h>
#include <stdint.h>

#define NOISE_KEY 32
#define NOISE_TAG 16
/* The largest Noise message, and so the most plaintext one transport message carries. */
#define NOISE_MAX_MESSAGE 65535
#define NOISE_MAX_PLAIN (NOISE_MAX_MESSAGE - NOISE_TAG)

/* One direction's cipher: its key and the next message's number (the nonce). */
struct noise_cipher {
    uint8_t key[NOISE_KEY];
    uint64_t n;
};

/* An established session: what this end sends with, what it receives with. */
struct noise_session {
    struct noise_cipher send, recv;
};

/* Moves all `n` bytes to (`out`) or from the peer: 0, or -1 when it failed or ended. */
typedef int (*noise_io)(void *ctx, uint8_t *p, size_t n, int out);

/* Runs the handshake as responder with the pre-shared key `psk` and the ephemeral secret
 * `ephemeral` (32 random bytes), then reads the initiator's first transport message (empty,
 * sent right after the handshake): only a peer holding the key gets that far, a replayed
 * first message does not (its sender cannot derive the session's keys). Each message is a
 * big-endian u16 length and the message. 0 with `session`, or -1 with `why`. */
int noise_respond(const uint8_t psk[NOISE_KEY], const uint8_t ephemeral[NOISE_KEY], noise_io io, void *ctx,
                  struct noise_session *session, const char **why);

/* Encrypts `n` plaintext bytes (at most NOISE_MAX_PLAIN) into `out` (n + NOISE_TAG bytes)
 * with the cipher's next nonce. */
void noise_seal(struct noise_cipher *c, const uint8_t *plain, size_t n, uint8_t *out);
/* Decrypts a message of `n` bytes (at least NOISE_TAG) into `plain` (n - NOISE_TAG bytes)
 * with the cipher's next nonce: 0, or -1 when it fails its tag (tampered, replayed, out of
 * order, another session's) and the cipher is unchanged. */
int noise_open(struct noise_cipher *c, const uint8_t *in, size_t n, uint8_t *plain);

/* Erases secrets. */
void noise_wipe(void *secret, size_t n);

#endif
