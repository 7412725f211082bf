//! # kiln-wire
//!
//! What travels between a Kiln controller (where code is linked) and an executor (where it
//! runs), and nothing else: the [`protocol`]'s messages and their byte encoding, the framed
//! [`channel`] over a Unix or TCP socket (descriptors passed beside the bytes on Unix
//! sockets, a frame limit checked before allocating), and the [`secure`] layer that
//! authenticates and encrypts TCP connections. The controller (`kiln-remote`) and the
//! executor (`kiln-executor`, or one written in another language from
//! `docs/PROTOCOL.md`) both build on it; it depends on neither.

pub mod channel;
pub mod protocol;
pub mod secure;
