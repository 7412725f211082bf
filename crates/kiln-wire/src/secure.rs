//! Authenticated, encrypted connections between a controller and an executor over TCP.
//!
//! Both ends hold one 32-byte pre-shared [`Key`]. Before anything else, they run the Noise
//! handshake `Noise_NNpsk0_25519_ChaChaPoly_SHA512` (the `snow` crate): fresh ephemeral
//! keys on both sides, mixed with the pre-shared key, so that only a peer holding the key
//! completes it, and every session has keys of its own (forward secrecy). Right after it
//! the initiator sends one empty transport message, which the responder must decrypt
//! before it serves anything: a replayed first handshake message gets no further, its
//! sender holding no session key. After it, every byte travels in Noise transport
//! messages: ChaCha20-Poly1305 with a per-direction message counter as nonce. The suite
//! (SHA-512 rather than BLAKE2s) is one that Monocypher, the small C library executor-c
//! takes its cryptography from, provides whole, HMAC included. So:
//! - a client with a wrong key, or one speaking the plain protocol, fails the first
//!   handshake message and is dropped before the executor reads a single request;
//! - a tampered message fails its tag; a replayed, dropped or reordered one fails because
//!   its nonce is not the next expected; messages of another session fail because its
//!   keys differ. Each ends the connection.
//!
//! On the wire a Noise message is a big-endian `u16` length and the message (at most
//! 65,535 bytes, so a protocol frame spans as many messages as it needs). The key is never
//! passed on a command line: it lives in a file only its owner can read (mode 0600), or in
//! an environment variable of the controller.

use std::io;
use std::path::{Path, PathBuf};

/// The Noise protocol name Kiln speaks.
pub const NOISE_PATTERN: &str = "Noise_NNpsk0_25519_ChaChaPoly_SHA512";

/// What a TCP executor sends first, before anything else: whether it requires the Noise
/// handshake (`N`) or serves plaintext (`P`, `--no-auth`). Only a hint to give a clear
/// error early: a controller that has a key insists on the handshake whatever it says, so
/// a forged `P` cannot downgrade it.
pub const PREAMBLE_NOISE: [u8; 8] = *b"KILN\0\0\0N";
/// See [`PREAMBLE_NOISE`].
pub const PREAMBLE_PLAIN: [u8; 8] = *b"KILN\0\0\0P";

/// Largest Noise message (the Noise specification's limit).
pub const MAX_NOISE_MESSAGE: usize = 65_535;

/// Authentication tag bytes per message.
pub const TAG: usize = 16;

/// Environment variable holding the key as 64 hex digits (controller side).
pub const KEY_ENV: &str = "KILN_EXECUTOR_KEY";
/// Environment variable naming a key file (controller side).
pub const KEY_FILE_ENV: &str = "KILN_EXECUTOR_KEY_FILE";

/// Why a key could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The file can be read by others.
    #[error(
        "{path}: the key file is readable or writable by others (mode {mode:o}); make it 0600"
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// Not 64 hex digits.
    #[error("{what}: a key is 64 hexadecimal digits (32 bytes)")]
    Malformed {
        /// Where it came from.
        what: String,
    },
    /// No randomness.
    #[error("no random bytes for a key: {0}")]
    Random(io::Error),
}

/// A 32-byte pre-shared key.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never printed.
        f.write_str("Key(…)")
    }
}

impl Key {
    /// A key from the bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Key(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fresh random key (`getrandom`).
    pub fn generate() -> Result<Self, KeyError> {
        let mut bytes = [0u8; 32];
        let mut filled = 0;
        while filled < bytes.len() {
            // SAFETY: getrandom writes at most the given length into the buffer.
            let n = unsafe {
                libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(KeyError::Random(e));
            }
            filled += n as usize;
        }
        Ok(Key(bytes))
    }

    /// Parses 64 hex digits (surrounding white space ignored).
    pub fn from_hex(text: &str, what: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        let malformed = || KeyError::Malformed { what: what.into() };
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(malformed());
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| malformed())?;
        }
        Ok(Key(bytes))
    }

    /// The key as 64 hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads a key file, refusing one that others may read or write.
    pub fn read_file(path: &Path) -> Result<Self, KeyError> {
        use std::os::unix::fs::PermissionsExt;
        let io_err = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io_err)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        let text = std::fs::read_to_string(path).map_err(io_err)?;
        Key::from_hex(&text, &path.display().to_string())
    }

    /// Writes the key to a new file, created with mode 0600 (an existing file is an
    /// error, never overwritten).
    pub fn write_new_file(&self, path: &Path) -> Result<(), KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let io_err = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io_err)?;
        writeln!(file, "{}", self.to_hex()).map_err(io_err)
    }

    /// The controller's key from the environment: [`KEY_ENV`] (hex), else the file named
    /// by [`KEY_FILE_ENV`]; `None` if neither is set.
    pub fn from_env() -> Result<Option<Self>, KeyError> {
        if let Ok(hex) = std::env::var(KEY_ENV) {
            return Key::from_hex(&hex, KEY_ENV).map(Some);
        }
        match std::env::var_os(KEY_FILE_ENV) {
            Some(path) => Key::read_file(Path::new(&path)).map(Some),
            None => Ok(None),
        }
    }
}

/// Which end of the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The controller (connects, speaks first).
    Initiator,
    /// The executor (accepts).
    Responder,
}

/// The transport after the handshake: `snow`'s.
#[cfg(feature = "noise")]
pub(crate) type Transport = snow::StatelessTransportState;

/// The transport in a build without the `noise` feature: a type with no values (no
/// channel becomes secure, so none is ever made).
#[cfg(not(feature = "noise"))]
pub(crate) enum Transport {}

/// The error a transport of a build without Noise would give (none is ever made).
#[cfg(not(feature = "noise"))]
#[derive(Debug)]
pub(crate) struct NoNoise;

#[cfg(not(feature = "noise"))]
impl std::fmt::Display for NoNoise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no Noise support in this build")
    }
}

#[cfg(not(feature = "noise"))]
impl Transport {
    pub(crate) fn write_message(
        &self,
        _nonce: u64,
        _plain: &[u8],
        _out: &mut [u8],
    ) -> Result<usize, NoNoise> {
        match *self {}
    }

    pub(crate) fn read_message(
        &self,
        _nonce: u64,
        _record: &[u8],
        _plain: &mut [u8],
    ) -> Result<usize, NoNoise> {
        match *self {}
    }
}

/// Builds the handshake state for `role` with `key`.
#[cfg(feature = "noise")]
pub(crate) fn handshake_state(key: &Key, role: Role) -> Result<snow::HandshakeState, snow::Error> {
    let params: snow::params::NoiseParams = NOISE_PATTERN.parse()?;
    let builder = snow::Builder::new(params).psk(0, key.as_bytes())?;
    match role {
        Role::Initiator => builder.build_initiator(),
        Role::Responder => builder.build_responder(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_hex_and_refuse_garbage() {
        let key = Key::generate().unwrap();
        assert_eq!(Key::from_hex(&key.to_hex(), "t").unwrap(), key);
        assert!(Key::from_hex("abc", "t").is_err());
        assert!(Key::from_hex(&"zz".repeat(32), "t").is_err());
        // 64 bytes, not 64 characters: an error, not a panic.
        assert!(Key::from_hex(&"é".repeat(32), "t").is_err());
        assert_ne!(Key::generate().unwrap(), key);
        assert_eq!(format!("{key:?}"), "Key(…)");
    }

    #[test]
    fn a_key_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("kiln-key-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let key = Key::generate().unwrap();
        key.write_new_file(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(Key::read_file(&path).unwrap(), key);
        assert!(key.write_new_file(&path).is_err(), "never overwritten");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            Key::read_file(&path),
            Err(KeyError::Permissions { .. })
        ));
        std::fs::remove_file(&path).unwrap();
    }
}
