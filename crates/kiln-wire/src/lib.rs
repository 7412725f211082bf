//! # kiln-wire
//!
//! What travels between a Kiln controller (where code is linked) and an executor (where it
//! runs), and nothing else: the [`protocol`]'s messages and their byte encoding, the framed
//! [`channel`] over a Unix or TCP socket (descriptors passed beside the bytes on Unix
//! sockets, a frame limit checked before allocating), and the [`secure`] layer that
//! authenticates and encrypts TCP connections. The controller (`kiln-remote`) and the
//! executor (`kiln-executor`, or one written in another language from
//! `docs/PROTOCOL.md`) both build on it; it depends on neither.
//!
//! A request as it travels, and back:
//!
//! ```
//! use kiln_wire::protocol::Request;
//!
//! let request = Request::Lookup { library: 0, name: "printf".into() };
//! // A frame: its length (4 bytes, little-endian), then the body `decode` reads.
//! let frame = request.encode();
//! let body = &frame[4..];
//! assert_eq!(u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize, body.len());
//! assert_eq!(Request::decode(body).unwrap(), request);
//! // A body cut short is an error naming what is missing, never a panic.
//! assert!(Request::decode(&body[..body.len() - 1]).is_err());
//! ```

pub mod channel;
pub mod protocol;
pub mod secure;
