//! How the protocol's fields are written and read, and the [`messages!`] macro that turns
//! the one message table (in `protocol.rs`) into the message enums, their tags, names,
//! encoders and decoders.
//!
//! Each field type knows its own encoding (kiln-codec's [`Field`], shared with the
//! linked-image description); a field whose wire form or range
//! differs from its type's (a permission that must be 0–2, an error text read lossily, a
//! field an older executor leaves off the end) names a [`Codec`] in the table with
//! `as`. Every length is checked against the bytes left before anything is allocated.

use super::{
    DebugFunction, DebugModule, DebugOutputs, DecodeError, LineRow, WirePlacement, WireSegment,
};

pub(crate) use kiln_codec::{Field, ListItem, Reader, Writer};

/// A frame's writer: its length and id (0 until [`super::with_id`]) left for
/// [`finish`], then the tag; the fields follow.
pub(crate) fn frame(tag: u8) -> Writer {
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, tag]);
    Writer::from_bytes(buf)
}

/// The frame's bytes, its length written in.
pub(crate) fn finish(mut w: Writer) -> Vec<u8> {
    let bytes = w.as_mut_bytes();
    let len = (bytes.len() - 4) as u32;
    bytes[..4].copy_from_slice(&len.to_le_bytes());
    w.into_bytes()
}

/// How a field of type `T` travels where it is not simply `T`'s [`Field`] encoding.
pub(crate) trait Codec<T> {
    fn put(value: &T, w: &mut Writer);
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<T, DecodeError>;
}

/// The field's own encoding (what a field with no `as` in the table uses).
pub(crate) struct Plain;

impl<T: Field> Codec<T> for Plain {
    fn put(value: &T, w: &mut Writer) {
        value.put(w)
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<T, DecodeError> {
        T::get(r, what)
    }
}

/// Kind byte (0 anywhere, 1 near the host's libraries, 2 near a range, 3 below 2 GiB),
/// then the range's two ends (0 unless kind 2).
impl Field for WirePlacement {
    const MIN: usize = 17;
    fn put(&self, w: &mut Writer) {
        match *self {
            WirePlacement::Anywhere => w.u8(0).u64(0).u64(0),
            WirePlacement::HostLibraries => w.u8(1).u64(0).u64(0),
            WirePlacement::Near(a, b) => w.u8(2).u64(a).u64(b),
            WirePlacement::Low2GiB => w.u8(3).u64(0).u64(0),
        };
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        let kind = r.u8(what)?;
        let (a, b) = (r.u64(what)?, r.u64(what)?);
        Ok(match kind {
            0 => WirePlacement::Anywhere,
            1 => WirePlacement::HostLibraries,
            2 => WirePlacement::Near(a, b),
            3 => WirePlacement::Low2GiB,
            other => {
                return Err(DecodeError::Invalid {
                    what,
                    value: u64::from(other),
                })
            }
        })
    }
}

impl ListItem for LineRow {}
impl ListItem for DebugFunction {}

/// Three flag bytes (gdb, perf map, jitdump) and the jitdump directory (empty without).
impl Field for DebugOutputs {
    const MIN: usize = 7;
    fn put(&self, w: &mut Writer) {
        w.u8(u8::from(self.gdb))
            .u8(u8::from(self.perf_map))
            .u8(u8::from(self.jitdump_dir.is_some()))
            .bytes(self.jitdump_dir.as_deref().unwrap_or("").as_bytes());
    }
    fn get(r: &mut Reader<'_>, _: &'static str) -> Result<Self, DecodeError> {
        let gdb = bool::get(r, "gdb flag")?;
        let perf_map = bool::get(r, "perf map flag")?;
        let jitdump = bool::get(r, "jitdump flag")?;
        let dir = String::get(r, "jitdump directory")?;
        Ok(DebugOutputs {
            gdb,
            perf_map,
            jitdump_dir: jitdump.then_some(dir),
        })
    }
}

impl Field for LineRow {
    const MIN: usize = 16;
    fn put(&self, w: &mut Writer) {
        w.u64(self.address).u32(self.line).u32(self.file);
    }
    fn get(r: &mut Reader<'_>, _: &'static str) -> Result<Self, DecodeError> {
        Ok(LineRow {
            address: r.u64("line address")?,
            line: r.u32("line number")?,
            file: r.u32("line file")?,
        })
    }
}

impl Field for DebugFunction {
    const MIN: usize = 24;
    fn put(&self, w: &mut Writer) {
        w.bytes(self.name.as_bytes())
            .u64(self.address)
            .u64(self.size);
        self.lines.put(w);
    }
    fn get(r: &mut Reader<'_>, _: &'static str) -> Result<Self, DecodeError> {
        Ok(DebugFunction {
            name: String::get(r, "function name")?,
            address: r.u64("function address")?,
            size: r.u64("function size")?,
            lines: Vec::get(r, "line rows")?,
        })
    }
}

/// A flags byte (1 perf map, 2 jitdump), the images, the source files, the functions;
/// every line row's file must index the files.
impl Field for DebugModule {
    const MIN: usize = 13;
    fn put(&self, w: &mut Writer) {
        w.u8(u8::from(self.perf_map) | u8::from(self.jitdump) << 1);
        self.images.put(w);
        self.files.put(w);
        self.functions.put(w);
    }
    fn get(r: &mut Reader<'_>, _: &'static str) -> Result<Self, DecodeError> {
        let outputs = r.u8("perf outputs")?;
        let images = Vec::get(r, "debug images")?;
        let files: Vec<String> = Vec::get(r, "source files")?;
        let functions: Vec<DebugFunction> = Vec::get(r, "debug functions")?;
        for row in functions.iter().flat_map(|f| &f.lines) {
            if row.file as usize >= files.len() {
                return Err(DecodeError::Invalid {
                    what: "line file",
                    value: u64::from(row.file),
                });
            }
        }
        Ok(DebugModule {
            images,
            functions,
            files,
            perf_map: outputs & 1 != 0,
            jitdump: outputs & 2 != 0,
        })
    }
}

/// A page permission: 0 read-execute, 1 read, 2 read-write.
pub(crate) struct Permission;

fn check_permission(p: u8) -> Result<u8, DecodeError> {
    if p > 2 {
        return Err(DecodeError::Invalid {
            what: "permission",
            value: u64::from(p),
        });
    }
    Ok(p)
}

impl Codec<u8> for Permission {
    fn put(value: &u8, w: &mut Writer) {
        w.u8(*value);
    }
    fn get(r: &mut Reader<'_>, _: &'static str) -> Result<u8, DecodeError> {
        check_permission(r.u8("permission")?)
    }
}

/// Segments `(target, len, permission)`, each permission checked as [`Permission`].
pub(crate) struct Segments;

impl Codec<Vec<WireSegment>> for Segments {
    fn put(value: &Vec<WireSegment>, w: &mut Writer) {
        value.put(w)
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<WireSegment>, DecodeError> {
        let segments: Vec<WireSegment> = Vec::get(r, what)?;
        for &(_, _, p) in &segments {
            check_permission(p)?;
        }
        Ok(segments)
    }
}

/// `Call`'s integer arguments: at most six (the registers of the calling convention).
pub(crate) struct UpToSix;

impl Codec<Vec<u64>> for UpToSix {
    fn put(value: &Vec<u64>, w: &mut Writer) {
        value.put(w)
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<u64>, DecodeError> {
        let args: Vec<u64> = Vec::get(r, what)?;
        if args.len() > 6 {
            return Err(DecodeError::Invalid {
                what: "argument count",
                value: args.len() as u64,
            });
        }
        Ok(args)
    }
}

/// Text read as bytes and decoded lossily (an executor's error may quote a path that is
/// not UTF-8); any length the frame holds.
pub(crate) struct Lossy;

impl Codec<String> for Lossy {
    fn put(value: &String, w: &mut Writer) {
        w.bytes(value.as_bytes());
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<String, DecodeError> {
        Ok(String::from_utf8_lossy(r.bytes(what)?).into_owned())
    }
}

/// A field an older or smaller executor may leave off the end of its message: absent,
/// it reads as zero (executor-c's hello has no features, a crash report may give the
/// signal alone).
pub(crate) struct ZeroIfAbsent;

impl<T: Field + Default> Codec<T> for ZeroIfAbsent {
    fn put(value: &T, w: &mut Writer) {
        value.put(w)
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<T, DecodeError> {
        if r.is_empty() {
            Ok(T::default())
        } else {
            T::get(r, what)
        }
    }
}

/// Messages inside a message (a batch and its answers): each as its frame's body (id 0,
/// tag, fields) in a byte string. One level only: a batch inside a batch is refused
/// before it is decoded, so no frame nests deeper than that.
pub(crate) struct Nested;

impl Codec<Vec<super::Request>> for Nested {
    fn put(value: &Vec<super::Request>, w: &mut Writer) {
        w.u32(value.len() as u32);
        for request in value {
            w.bytes(&request.encode()[4..]);
        }
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<super::Request>, DecodeError> {
        let n = r.count(what, 9)?;
        let mut requests = Vec::with_capacity(n);
        for _ in 0..n {
            let body = r.bytes(what)?;
            if body.get(4) == Some(&super::tag::BATCH) {
                return Err(DecodeError::Invalid {
                    what: "batch inside a batch",
                    value: u64::from(super::tag::BATCH),
                });
            }
            requests.push(super::Request::decode(body)?);
        }
        Ok(requests)
    }
}

impl Codec<Vec<super::Response>> for Nested {
    fn put(value: &Vec<super::Response>, w: &mut Writer) {
        w.u32(value.len() as u32);
        for answer in value {
            w.bytes(&answer.encode()[4..]);
        }
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<super::Response>, DecodeError> {
        let n = r.count(what, 9)?;
        let mut answers = Vec::with_capacity(n);
        for _ in 0..n {
            let body = r.bytes(what)?;
            if body.get(4) == Some(&super::tag::BATCHED) {
                return Err(DecodeError::Invalid {
                    what: "batched answers inside batched answers",
                    value: u64::from(super::tag::BATCHED),
                });
            }
            answers.push(super::Response::decode(body)?);
        }
        Ok(answers)
    }
}

/// The codec a field of the table names after `as`, or [`Plain`].
macro_rules! codec {
    () => {
        $crate::protocol::codec::Plain
    };
    ($c:ty) => {
        $c
    };
}

/// The protocol's messages, declared once. For each enum it generates the enum, its
/// `encode` and `decode` and `name`; over all of them the [`tag`](super::tag) constants
/// and [`MESSAGES`](super::MESSAGES). A variant is written
///
/// ```text
/// /// docs
/// Name = TAG as CONSTANT "name in messages" { field: Type [as Codec], ... }
/// Name = TAG as CONSTANT "name in messages" (binding: Type [as Codec])
/// Name = TAG as CONSTANT "name in messages"
/// ```
///
/// and its fields travel in the order written, each named in decode errors. The tags
/// must be listed in increasing order (a test checks it); `Hello` (tag 0), the one message
/// outside the enums, is named by `hello`.
macro_rules! messages {
    (
        hello = $hello_tag:literal as $hello_konst:ident;
        $(
            $(#[$enum_meta:meta])*
            pub enum $enum:ident {
                $(
                    $(#[$variant_meta:meta])*
                    $name:ident = $tag:literal as $konst:ident $text:literal
                    $({ $( $(#[$field_meta:meta])* $field:ident : $field_ty:ty $(as $field_codec:ty)? ),* $(,)? })?
                    $(( $binding:ident : $inner_ty:ty $(as $inner_codec:ty)? ))?
                ),* $(,)?
            }
        )*
    ) => {
        /// Each message's tag, named as executor-c names it (`Hello` is `HELLO`).
        pub mod tag {
            #[doc = "The tag of `Hello`."]
            pub const $hello_konst: u8 = $hello_tag;
            $($(
                #[doc = concat!("The tag of `", stringify!($name), "`.")]
                pub const $konst: u8 = $tag;
            )*)*
        }

        /// Every message of the protocol, tag and name, as docs/PROTOCOL.md and
        /// executor-c name them, in increasing tag order: generated from the one table the
        /// codec is generated from. Tests hold the document's tables and executor-c's enum
        /// to it, so a tag cannot drift in one place alone.
        pub const MESSAGES: &[(u8, &str)] = &[
            ($hello_tag, "Hello"),
            $($(($tag, stringify!($name)),)*)*
        ];

        $(
            $(#[$enum_meta])*
            #[derive(Debug, Clone, PartialEq, Eq)]
            pub enum $enum {
                $(
                    $(#[$variant_meta])*
                    $name
                    $({ $( $(#[$field_meta])* $field: $field_ty ),* })?
                    $(( $inner_ty ))?
                ),*
            }

            impl $enum {
                /// The message's name in messages (`"lookup many"`).
                pub fn name(&self) -> &'static str {
                    match self {
                        $( $enum::$name { .. } => $text, )*
                    }
                }

                /// The message's tag.
                pub fn tag(&self) -> u8 {
                    match self {
                        $( $enum::$name { .. } => tag::$konst, )*
                    }
                }

                /// Encodes as a frame (length, id 0, tag, fields).
                pub fn encode(&self) -> Vec<u8> {
                    let w = match self {
                        $(
                            $enum::$name $({ $($field),* })? $(($binding))? => {
                                #[allow(unused_mut)]
                                let mut w = $crate::protocol::codec::frame(tag::$konst);
                                $($(
                                    <codec!($($field_codec)?) as $crate::protocol::codec::Codec<$field_ty>>::put($field, &mut w);
                                )*)?
                                $(
                                    <codec!($($inner_codec)?) as $crate::protocol::codec::Codec<$inner_ty>>::put($binding, &mut w);
                                )?
                                w
                            }
                        )*
                    };
                    $crate::protocol::codec::finish(w)
                }

                /// Decodes a frame's body (id, tag, fields): every field present, in
                /// range, and nothing after the last.
                pub fn decode(body: &[u8]) -> Result<Self, DecodeError> {
                    #[allow(unused_mut)]
                    let mut r = $crate::protocol::codec::Reader::new(body);
                    r.u32("message id")?;
                    let message = match r.u8("tag")? {
                        $(
                            tag::$konst => $enum::$name
                                $({ $(
                                    $field: <codec!($($field_codec)?) as $crate::protocol::codec::Codec<$field_ty>>::get(&mut r, stringify!($field))?
                                ),* })?
                                $((
                                    <codec!($($inner_codec)?) as $crate::protocol::codec::Codec<$inner_ty>>::get(&mut r, stringify!($binding))?
                                ))?,
                        )*
                        other => return Err(DecodeError::UnknownTag(other)),
                    };
                    r.end()?;
                    Ok(message)
                }
            }

            impl std::fmt::Display for $enum {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str(self.name())
                }
            }
        )*
    };
}
