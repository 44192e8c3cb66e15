//! A minimal, borrowing msgpack reader for the event decoder.
//!
//! Why not `rmpv::Value`: building a value tree allocates a node per token id and per hash,
//! and the decoder only needs to walk the payload once, in order. This cursor reads straight
//! from the payload slice, borrows strings, and skips what it does not need without recursion
//! (so hostile nesting cannot overflow the stack). Every read is bounds-checked and returns a
//! [`DecodeError`]; nothing here can panic on arbitrary bytes.
//!
//! [`DecodeError`] is defined here, at the bottom of the decoder, and not in `decode.rs`:
//! the reader, the field decoder and the batch decoder all return it, and keeping it in the
//! lowest file makes their imports go one way (msgpack ← fields ← decode).

use thiserror::Error;

/// Why a payload could not be decoded. The subscriber counts these and skips the batch.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The payload ended inside a value.
    #[error("payload truncated")]
    Truncated,
    /// A value had the wrong msgpack type.
    #[error("expected {expected} at byte {offset}")]
    UnexpectedType {
        /// What the decoder was looking for.
        expected: &'static str,
        /// Byte offset of the offending value in the payload.
        offset: usize,
    },
    /// The reserved msgpack marker 0xc1 appeared.
    #[error("reserved msgpack marker 0xc1")]
    Reserved,
    /// A string was not UTF-8.
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// The batch array had fewer than two elements.
    #[error("batch has {0} elements, expected at least 2")]
    BatchTooShort(usize),
    /// A field every release sends was missing from a known event.
    #[error("{event} is missing field {field}")]
    MissingField {
        /// The event type.
        event: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// An integer did not fit its field (a token id above `u32::MAX`, for instance).
    #[error("integer out of range for {0}")]
    OutOfRange(&'static str),
}

/// The msgpack type family of the next value, enough to choose how to read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Nil,
    Bool,
    Int,
    Float,
    Str,
    Bin,
    Array,
    Map,
    Ext,
    /// 0xc1, never used by msgpack.
    Reserved,
}

/// A cursor over one msgpack payload.
#[derive(Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Byte offset of the cursor in the payload.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// The payload bytes between two positions (for re-reading a value later).
    pub(crate) fn slice(&self, from: usize, to: usize) -> &'a [u8] {
        self.buf.get(from..to).unwrap_or(&[])
    }

    /// Bytes left after the cursor; an upper bound on the element count of any container,
    /// used to cap pre-allocation so a forged length cannot exhaust memory.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let bytes = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(bytes)
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn len8(&mut self) -> Result<usize, DecodeError> {
        Ok(self.byte()? as usize)
    }

    fn len16(&mut self) -> Result<usize, DecodeError> {
        Ok(u16::from_be_bytes(self.be()?) as usize)
    }

    fn len32(&mut self) -> Result<usize, DecodeError> {
        Ok(u32::from_be_bytes(self.be()?) as usize)
    }

    /// The kind of the next value, without consuming it.
    #[inline]
    pub(crate) fn peek(&self) -> Result<Kind, DecodeError> {
        let m = *self.buf.get(self.pos).ok_or(DecodeError::Truncated)?;
        Ok(match m {
            0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => Kind::Int,
            0x80..=0x8f | 0xde | 0xdf => Kind::Map,
            0x90..=0x9f | 0xdc | 0xdd => Kind::Array,
            0xa0..=0xbf | 0xd9..=0xdb => Kind::Str,
            0xc0 => Kind::Nil,
            0xc1 => Kind::Reserved,
            0xc2 | 0xc3 => Kind::Bool,
            0xc4..=0xc6 => Kind::Bin,
            0xc7..=0xc9 | 0xd4..=0xd8 => Kind::Ext,
            0xca | 0xcb => Kind::Float,
        })
    }

    /// Consumes a nil if one is next; tells whether it did.
    #[inline]
    pub(crate) fn eat_nil(&mut self) -> Result<bool, DecodeError> {
        if self.peek()? == Kind::Nil {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Reads an array header and returns its element count.
    #[inline]
    pub(crate) fn array_len(&mut self) -> Result<usize, DecodeError> {
        match self.byte()? {
            m @ 0x90..=0x9f => Ok((m & 0x0f) as usize),
            0xdc => self.len16(),
            0xdd => self.len32(),
            _ => Err(self.mismatch("array")),
        }
    }

    /// Reads a map header and returns its entry count.
    pub(crate) fn map_len(&mut self) -> Result<usize, DecodeError> {
        match self.byte()? {
            m @ 0x80..=0x8f => Ok((m & 0x0f) as usize),
            0xde => self.len16(),
            0xdf => self.len32(),
            _ => Err(self.mismatch("map")),
        }
    }

    /// Reads a UTF-8 string, borrowed from the payload.
    #[inline]
    pub(crate) fn str(&mut self) -> Result<&'a str, DecodeError> {
        let len = match self.byte()? {
            m @ 0xa0..=0xbf => (m & 0x1f) as usize,
            0xd9 => self.len8()?,
            0xda => self.len16()?,
            0xdb => self.len32()?,
            _ => return Err(self.mismatch("string")),
        };
        std::str::from_utf8(self.take(len)?).map_err(|_| DecodeError::InvalidUtf8)
    }

    /// Reads a binary blob, borrowed from the payload.
    pub(crate) fn bin(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = match self.byte()? {
            0xc4 => self.len8()?,
            0xc5 => self.len16()?,
            0xc6 => self.len32()?,
            _ => return Err(self.mismatch("bin")),
        };
        self.take(len)
    }

    /// Reads any msgpack integer, widened so that both u64 and i64 fit.
    #[inline]
    pub(crate) fn int(&mut self) -> Result<i128, DecodeError> {
        let m = self.byte()?;
        Ok(match m {
            0x00..=0x7f => m as i128,
            0xe0..=0xff => (m as i8) as i128,
            0xcc => self.byte()? as i128,
            0xcd => u16::from_be_bytes(self.be()?) as i128,
            0xce => u32::from_be_bytes(self.be()?) as i128,
            0xcf => u64::from_be_bytes(self.be()?) as i128,
            0xd0 => i8::from_be_bytes(self.be()?) as i128,
            0xd1 => i16::from_be_bytes(self.be()?) as i128,
            0xd2 => i32::from_be_bytes(self.be()?) as i128,
            0xd3 => i64::from_be_bytes(self.be()?) as i128,
            _ => return Err(self.mismatch("integer")),
        })
    }

    /// Reads a non-negative integer that fits in a u32 (a token id): the hot loop of the
    /// decoder, so the common encodings are matched first without widening.
    #[inline]
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        match self.buf.get(self.pos) {
            Some(&m) if m < 0x80 => {
                self.pos += 1;
                Ok(m as u32)
            }
            Some(0xcc) => Ok(self.be::<2>()?[1] as u32),
            Some(0xcd) => {
                let [_, a, b] = self.be::<3>()?;
                Ok(u16::from_be_bytes([a, b]) as u32)
            }
            Some(0xce) => {
                let [_, a, b, c, d] = self.be::<5>()?;
                Ok(u32::from_be_bytes([a, b, c, d]))
            }
            _ => u32::try_from(self.int()?).map_err(|_| DecodeError::OutOfRange("token id")),
        }
    }

    /// Reads a float, or an integer as a float (a timestamp may arrive as either).
    pub(crate) fn number(&mut self) -> Result<f64, DecodeError> {
        match self.peek()? {
            Kind::Int => Ok(self.int()? as f64),
            Kind::Float => match self.byte()? {
                0xca => Ok(f32::from_be_bytes(self.be()?) as f64),
                _ => Ok(f64::from_be_bytes(self.be()?)),
            },
            _ => {
                self.pos += 1;
                Err(self.mismatch("number"))
            }
        }
    }

    /// Skips one complete value, however deeply nested, iteratively.
    pub(crate) fn skip(&mut self) -> Result<(), DecodeError> {
        // Values still to skip; containers add their children. Each iteration consumes at
        // least one byte, so this terminates within `buf.len()` iterations.
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            let m = self.byte()?;
            let skip = match m {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
                0x80..=0x8f => {
                    pending += 2 * (m & 0x0f) as u64;
                    0
                }
                0x90..=0x9f => {
                    pending += (m & 0x0f) as u64;
                    0
                }
                0xa0..=0xbf => (m & 0x1f) as usize,
                0xc1 => return Err(DecodeError::Reserved),
                0xc4 | 0xd9 => self.len8()?,
                0xc5 | 0xda => self.len16()?,
                0xc6 | 0xdb => self.len32()?,
                0xc7 => self.len8()? + 1,
                0xc8 => self.len16()? + 1,
                0xc9 => self.len32()? + 1,
                0xca => 4,
                0xcb => 8,
                0xcc | 0xd0 => 1,
                0xcd | 0xd1 => 2,
                0xce | 0xd2 => 4,
                0xcf | 0xd3 => 8,
                0xd4 => 2,
                0xd5 => 3,
                0xd6 => 5,
                0xd7 => 9,
                0xd8 => 17,
                0xdc => {
                    pending += self.len16()? as u64;
                    0
                }
                0xdd => {
                    pending += self.len32()? as u64;
                    0
                }
                0xde => {
                    pending += 2 * self.len16()? as u64;
                    0
                }
                0xdf => {
                    pending += 2 * self.len32()? as u64;
                    0
                }
            };
            self.take(skip)?;
        }
        Ok(())
    }

    fn mismatch(&self, expected: &'static str) -> DecodeError {
        DecodeError::UnexpectedType {
            expected,
            offset: self.pos.saturating_sub(1),
        }
    }
}

/// Appends msgpack values with the smallest encoding, as msgspec (the engines' encoder) does,
/// so that what the simulated engine publishes matches real engines byte for byte.
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }

    fn header(&mut self, len: usize, fix: u8, fix_max: usize, m16: u8, m32: u8) {
        if len <= fix_max {
            self.buf.push(fix | len as u8);
        } else if len <= u16::MAX as usize {
            self.buf.push(m16);
            self.buf.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            self.buf.push(m32);
            self.buf.extend_from_slice(&(len as u32).to_be_bytes());
        }
    }

    pub(crate) fn array(&mut self, len: usize) {
        self.header(len, 0x90, 15, 0xdc, 0xdd);
    }

    pub(crate) fn map(&mut self, len: usize) {
        self.header(len, 0x80, 15, 0xde, 0xdf);
    }

    /// A map16 header even for a small map: msgspec sizes a struct's header by its declared
    /// field count, so a struct with more than 15 fields always gets map16.
    pub(crate) fn map16(&mut self, len: usize) {
        self.buf.push(0xde);
        self.buf
            .extend_from_slice(&(len.min(u16::MAX as usize) as u16).to_be_bytes());
    }

    #[inline]
    pub(crate) fn str(&mut self, s: &str) {
        let len = s.len();
        if len < 32 {
            self.buf.push(0xa0 | len as u8);
        } else if len <= u8::MAX as usize {
            self.buf.extend_from_slice(&[0xd9, len as u8]);
        } else if len <= u16::MAX as usize {
            self.buf.push(0xda);
            self.buf.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            self.buf.push(0xdb);
            self.buf.extend_from_slice(&(len as u32).to_be_bytes());
        }
        self.buf.extend_from_slice(s.as_bytes());
    }

    pub(crate) fn nil(&mut self) {
        self.buf.push(0xc0);
    }

    pub(crate) fn f64(&mut self, v: f64) {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    #[inline]
    pub(crate) fn uint(&mut self, v: u64) {
        if v < 128 {
            self.buf.push(v as u8);
        } else if v <= u8::MAX as u64 {
            self.buf.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= u16::MAX as u64 {
            self.buf.push(0xcd);
            self.buf.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= u32::MAX as u64 {
            self.buf.push(0xce);
            self.buf.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.buf.push(0xcf);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    #[inline]
    pub(crate) fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
        } else if v >= -32 {
            self.buf.push(v as i8 as u8);
        } else if v >= i8::MIN as i64 {
            self.buf.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i16::MIN as i64 {
            self.buf.push(0xd1);
            self.buf.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i32::MIN as i64 {
            self.buf.push(0xd2);
            self.buf.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            self.buf.push(0xd3);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_int_width() {
        let cases: &[(&[u8], i128)] = &[
            (&[0x05], 5),
            (&[0xff], -1),
            (&[0xcc, 0xc8], 200),
            (&[0xcd, 0x07, 0xd0], 2000),
            (&[0xce, 0, 1, 0, 0], 65536),
            (
                &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                u64::MAX as i128,
            ),
            (&[0xd0, 0x80], -128),
            (&[0xd1, 0xff, 0x00], -256),
            (&[0xd2, 0xff, 0xff, 0xff, 0xfe], -2),
            (&[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], i64::MIN as i128),
        ];
        for (bytes, want) in cases {
            assert_eq!(Reader::new(bytes).int().unwrap(), *want, "{bytes:x?}");
        }
    }

    #[test]
    fn skip_handles_nesting_and_stops_at_the_next_value() {
        // [[1, {"a": [nil]}], "x"] followed by 7
        let bytes = [
            0x92, 0x92, 0x01, 0x81, 0xa1, b'a', 0x91, 0xc0, 0xa1, b'x', 0x07,
        ];
        let mut r = Reader::new(&bytes);
        r.skip().unwrap();
        assert_eq!(r.int().unwrap(), 7);
    }

    #[test]
    fn writer_round_trips_ints_at_every_width() {
        for v in [
            0i64,
            5,
            127,
            128,
            255,
            256,
            65535,
            65536,
            -1,
            -32,
            -33,
            -128,
            -129,
            -32768,
            -32769,
            i64::MIN,
            i64::MAX,
        ] {
            let mut w = Writer::with_capacity(9);
            w.int(v);
            assert_eq!(Reader::new(&w.buf).int().unwrap(), v as i128);
        }
        let mut w = Writer::with_capacity(9);
        w.uint(u64::MAX);
        assert_eq!(Reader::new(&w.buf).int().unwrap(), u64::MAX as i128);
    }

    #[test]
    fn truncated_and_forged_lengths_are_errors() {
        assert!(Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]).skip().is_err());
        assert!(Reader::new(&[0xdb, 0, 0, 0, 9, b'a']).str().is_err());
        assert!(Reader::new(&[0xc1]).skip().is_err());
        assert!(Reader::new(&[]).peek().is_err());
    }
}
