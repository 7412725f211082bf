//! # kiln-codec
//!
//! The byte codec two of Kiln's formats are declared on: the executor protocol's messages
//! (kiln-wire) and the description of a linked image (kiln-link's relocatable images, which
//! kiln-cache stores). Each field type knows its own encoding ([`Field`]): integers
//! little-endian, byte strings and text as a `u32` length then the bytes, lists as a `u32`
//! count then the items, options as a byte (0 absent, 1 present) then the value, tuples as
//! their items in order. A decoder ([`Reader`]) checks every length and count against the
//! bytes left before it allocates, so a damaged or hostile input is an error
//! ([`DecodeError`]), never a panic or a huge allocation.
//!
//! Not serde: these formats are contracts between programs built apart (executor-c is C)
//! and files kept across runs, so each field's bytes are spelled out here, once, and the
//! formats that use them are versioned by their owners.
//!
//! ```
//! use kiln_codec::{Field, Reader, Writer};
//!
//! let value: (u64, String, Option<u32>, Vec<u64>) = (7, "main".into(), Some(3), vec![1, 2]);
//! let mut w = Writer::new();
//! value.put(&mut w);
//! let bytes = w.into_bytes();
//! let mut r = Reader::new(&bytes);
//! let back = <(u64, String, Option<u32>, Vec<u64>)>::get(&mut r, "example").unwrap();
//! r.end().unwrap();
//! assert_eq!(back, value);
//! // Cut short, it is an error naming the field, not a panic.
//! assert!(<(u64, String)>::get(&mut Reader::new(&bytes[..9]), "example").is_err());
//! ```

use std::sync::Arc;

/// Largest text accepted (symbol names, paths, arguments).
pub const MAX_STRING: usize = 1 << 16;
/// Largest number of items in a list.
pub const MAX_ITEMS: usize = 1 << 20;

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes ended before a field.
    #[error("message truncated: {0}")]
    Truncated(&'static str),
    /// An unknown message tag.
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    /// A field out of its range (a kind byte no variant has, a count larger than the
    /// bytes left could hold, text that is not UTF-8).
    #[error("invalid {what}: {value}")]
    Invalid {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// Bytes left over after the last field.
    #[error("{0} bytes after the end of the message")]
    Trailing(usize),
}

/// Builds encoded bytes: fields appended in order.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Writer::default()
    }

    /// A writer appending to `buf` (a frame's header already in it, say).
    pub fn from_bytes(buf: Vec<u8>) -> Self {
        Writer { buf }
    }

    /// A writer with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A byte string: its `u32` length, then the bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
        self
    }

    /// Bytes as they are (no length).
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }

    /// The bytes written so far, to patch a header.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// The encoded bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads encoded fields in order, every length checked against the bytes left.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.data.len() < n {
            return Err(DecodeError::Truncated(what));
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }

    /// One byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(a))
    }

    /// A byte string (`u32` length, the bytes), borrowed.
    pub fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }

    /// UTF-8 text (a byte string of at most [`MAX_STRING`] bytes), borrowed.
    pub fn str(&mut self, what: &'static str) -> Result<&'a str, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > MAX_STRING {
            return Err(DecodeError::Invalid {
                what,
                value: n as u64,
            });
        }
        std::str::from_utf8(self.take(n, what)?).map_err(|_| DecodeError::Invalid {
            what,
            value: n as u64,
        })
    }

    /// A list's count, refused when its items (at least `item_size` bytes each) could not
    /// fit in the bytes left, or when it is over [`MAX_ITEMS`].
    pub fn count(&mut self, what: &'static str, item_size: usize) -> Result<usize, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > MAX_ITEMS || n.saturating_mul(item_size) > self.data.len() {
            return Err(DecodeError::Invalid {
                what,
                value: n as u64,
            });
        }
        Ok(n)
    }

    /// Whether every byte was read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// How many bytes are left.
    pub fn remaining(&self) -> usize {
        self.data.len()
    }

    /// Skips what is left (a tail the caller does not want).
    pub fn skip_rest(&mut self) {
        self.data = &[];
    }

    /// An error unless every byte was read.
    pub fn end(&self) -> Result<(), DecodeError> {
        if self.data.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing(self.data.len()))
        }
    }
}

/// A type with one encoding.
pub trait Field: Sized {
    /// The fewest bytes its encoding takes: bounds a list's count before allocating.
    const MIN: usize;
    /// Appends the encoding.
    fn put(&self, w: &mut Writer);
    /// Reads one; `what` names the field in errors.
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError>;
}

/// A type whose `Vec` is a list (a `u32` count, then the items). Every [`Field`] but `u8`
/// (a `Vec<u8>` is a byte string); implement it beside `Field` for a type of your own.
pub trait ListItem: Field {}

impl Field for u8 {
    const MIN: usize = 1;
    fn put(&self, w: &mut Writer) {
        w.u8(*self);
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        r.u8(what)
    }
}

impl Field for u32 {
    const MIN: usize = 4;
    fn put(&self, w: &mut Writer) {
        w.u32(*self);
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        r.u32(what)
    }
}

/// Two's complement in a `u32` (signal numbers, exit statuses).
impl Field for i32 {
    const MIN: usize = 4;
    fn put(&self, w: &mut Writer) {
        w.u32(*self as u32);
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        Ok(r.u32(what)? as i32)
    }
}

impl Field for u64 {
    const MIN: usize = 8;
    fn put(&self, w: &mut Writer) {
        w.u64(*self);
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        r.u64(what)
    }
}

/// Two's complement in a `u64` (addends).
impl Field for i64 {
    const MIN: usize = 8;
    fn put(&self, w: &mut Writer) {
        w.u64(*self as u64);
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        Ok(r.u64(what)? as i64)
    }
}

/// One byte, non-zero for true.
impl Field for bool {
    const MIN: usize = 1;
    fn put(&self, w: &mut Writer) {
        w.u8(u8::from(*self));
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        Ok(r.u8(what)? != 0)
    }
}

/// A byte string: `u32` length, then the bytes.
impl Field for Vec<u8> {
    const MIN: usize = 4;
    fn put(&self, w: &mut Writer) {
        w.bytes(self);
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        Ok(r.bytes(what)?.to_vec())
    }
}

/// UTF-8 as a byte string, at most [`MAX_STRING`] bytes.
impl Field for String {
    const MIN: usize = 4;
    fn put(&self, w: &mut Writer) {
        w.bytes(self.as_bytes());
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        r.str(what).map(str::to_string)
    }
}

/// As `String`.
impl Field for Arc<str> {
    const MIN: usize = 4;
    fn put(&self, w: &mut Writer) {
        w.bytes(self.as_bytes());
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        r.str(what).map(Arc::from)
    }
}

/// A byte (0 absent, 1 present), then the value if present.
impl<T: Field> Field for Option<T> {
    const MIN: usize = 1;
    fn put(&self, w: &mut Writer) {
        match self {
            Some(v) => {
                w.u8(1);
                v.put(w);
            }
            None => {
                w.u8(0);
            }
        }
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        match r.u8(what)? {
            0 => Ok(None),
            1 => T::get(r, what).map(Some),
            other => Err(DecodeError::Invalid {
                what,
                value: u64::from(other),
            }),
        }
    }
}

/// A `u32` count, then the items.
impl<T: ListItem> Field for Vec<T> {
    const MIN: usize = 4;
    fn put(&self, w: &mut Writer) {
        w.u32(self.len() as u32);
        for item in self {
            item.put(w);
        }
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        let n = r.count(what, T::MIN.max(1))?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(T::get(r, what)?);
        }
        Ok(items)
    }
}

impl ListItem for u32 {}
impl ListItem for i32 {}
impl ListItem for u64 {}
impl ListItem for i64 {}
impl ListItem for bool {}
impl ListItem for String {}
impl ListItem for Arc<str> {}
impl ListItem for Vec<u8> {}
impl<T: ListItem> ListItem for Vec<T> {}
impl<T: Field> ListItem for Option<T> {}

/// Tuples: their items in order.
macro_rules! tuple_field {
    ($($t:ident . $i:tt),+) => {
        impl<$($t: Field),+> Field for ($($t,)+) {
            const MIN: usize = 0 $(+ $t::MIN)+;
            fn put(&self, w: &mut Writer) {
                $(self.$i.put(w);)+
            }
            fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
                Ok(($($t::get(r, what)?,)+))
            }
        }
        impl<$($t: Field),+> ListItem for ($($t,)+) {}
    };
}
tuple_field!(A.0, B.1);
tuple_field!(A.0, B.1, C.2);
tuple_field!(A.0, B.1, C.2, D.3);

/// Declares a struct's encoding as its fields in order, each with the name its decode
/// errors give: implements [`Field`] and [`ListItem`] for it.
///
/// ```
/// #[derive(Debug, PartialEq)]
/// struct Row { address: u64, line: u32, file: u32 }
/// kiln_codec::record!(Row { address: u64 as "line address", line: u32 as "line number", file: u32 as "line file" });
///
/// use kiln_codec::Field;
/// let mut w = kiln_codec::Writer::new();
/// Row { address: 16, line: 3, file: 0 }.put(&mut w);
/// let bytes = w.into_bytes();
/// assert_eq!(bytes.len(), Row::MIN);
/// let row = Row::get(&mut kiln_codec::Reader::new(&bytes), "row").unwrap();
/// assert_eq!(row, Row { address: 16, line: 3, file: 0 });
/// ```
#[macro_export]
macro_rules! record {
    ($name:ident { $($field:ident : $ty:ty as $what:literal),+ $(,)? }) => {
        impl $crate::Field for $name {
            const MIN: usize = 0 $(+ <$ty as $crate::Field>::MIN)+;
            fn put(&self, w: &mut $crate::Writer) {
                $(<$ty as $crate::Field>::put(&self.$field, w);)+
            }
            fn get(
                r: &mut $crate::Reader<'_>,
                _: &'static str,
            ) -> Result<Self, $crate::DecodeError> {
                Ok($name {
                    $($field: <$ty as $crate::Field>::get(r, $what)?,)+
                })
            }
        }
        impl $crate::ListItem for $name {}
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Field + PartialEq + std::fmt::Debug>(value: T) -> Vec<u8> {
        let mut w = Writer::new();
        value.put(&mut w);
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        assert_eq!(T::get(&mut r, "value").unwrap(), value);
        r.end().unwrap();
        bytes
    }

    #[test]
    fn fields_read_back_as_written() {
        round_trip(0xdead_beef_u32);
        round_trip(-5i32);
        round_trip(-7i64);
        round_trip(u64::MAX);
        round_trip(true);
        assert_eq!(round_trip(vec![1u8, 2, 3]), [3, 0, 0, 0, 1, 2, 3]);
        round_trip(String::from("héllo"));
        round_trip(Arc::<str>::from("name"));
        assert_eq!(round_trip(None::<u64>), [0]);
        round_trip(Some(vec![String::from("a"), String::new()]));
        round_trip(vec![(1u64, 2u8), (3, 4)]);
        round_trip(vec![vec![1u8], vec![]]);
        round_trip((1u64, String::from("x"), false, Some(2u32)));
    }

    #[test]
    fn damaged_bytes_are_errors_never_panics_or_huge_allocations() {
        let mut w = Writer::new();
        (vec![String::from("abc"); 3], Some(9u64)).put(&mut w);
        let bytes = w.into_bytes();
        for len in 0..bytes.len() {
            let mut r = Reader::new(&bytes[..len]);
            assert!(
                <(Vec<String>, Option<u64>)>::get(&mut r, "cut").is_err(),
                "{len}"
            );
        }
        // A count no bytes could hold is refused before anything is allocated.
        let huge = [0xff, 0xff, 0xff, 0x7f];
        assert_eq!(
            Vec::<u64>::get(&mut Reader::new(&huge), "list"),
            Err(DecodeError::Invalid {
                what: "list",
                value: 0x7fff_ffff
            })
        );
        // An option's byte other than 0 and 1, text that is not UTF-8, text too long.
        assert!(Option::<u8>::get(&mut Reader::new(&[2, 0]), "option").is_err());
        assert!(String::get(&mut Reader::new(&[1, 0, 0, 0, 0xff]), "text").is_err());
        let long = ((MAX_STRING + 1) as u32).to_le_bytes();
        assert!(String::get(&mut Reader::new(&long), "text").is_err());
        assert_eq!(Reader::new(&[1]).end(), Err(DecodeError::Trailing(1)));
    }
}
