//! Token ids a client sent, kept as compactly as their text.
//!
//! A body's ids are held while the body itself is (it is forwarded as sent), so their parsed
//! form adds to the body's cost. As `u32`s a prompt of one-digit ids (`1,2,3,…`: two bytes of
//! text each) takes twice its text and the router three times the body; as LEB128 varints an id
//! takes at most half its text with the separator (one byte up to 127, two up to 16,383, three
//! up to 2,097,151, …), so ids never cost more than half the body they came in. Routing only
//! walks them once, in order, to hash them into blocks; decoding costs about a nanosecond each.

use std::fmt;

/// An ordered list of token ids, LEB128-encoded.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TokenIds {
    bytes: Vec<u8>,
    len: usize,
}

impl TokenIds {
    /// An empty list.
    pub fn new() -> TokenIds {
        TokenIds::default()
    }

    /// An empty list with room for `bytes` bytes of encoded ids (an id takes 1 to 5).
    pub fn with_capacity_bytes(bytes: usize) -> TokenIds {
        TokenIds {
            bytes: Vec::with_capacity(bytes),
            len: 0,
        }
    }

    /// Appends `id`.
    #[inline]
    pub fn push(&mut self, mut id: u32) {
        while id >= 0x80 {
            self.bytes.push((id as u8) | 0x80);
            id >>= 7;
        }
        self.bytes.push(id as u8);
        self.len += 1;
    }

    /// How many ids.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ids, in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            bytes: &self.bytes,
            left: self.len,
        }
    }

    /// The ids as `u32`s (four bytes each).
    pub fn to_vec(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len);
        out.extend(self.iter());
        out
    }

    /// Gives back the capacity the ids did not use.
    pub fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
    }
}

impl From<&[u32]> for TokenIds {
    fn from(ids: &[u32]) -> TokenIds {
        ids.iter().copied().collect()
    }
}

impl From<Vec<u32>> for TokenIds {
    fn from(ids: Vec<u32>) -> TokenIds {
        TokenIds::from(ids.as_slice())
    }
}

impl FromIterator<u32> for TokenIds {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> TokenIds {
        let mut ids = TokenIds::new();
        ids.extend(iter);
        ids
    }
}

impl Extend<u32> for TokenIds {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        for id in iter {
            self.push(id);
        }
    }
}

impl fmt::Debug for TokenIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a TokenIds {
    type Item = u32;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The ids of a [`TokenIds`], decoded as they are walked.
#[derive(Clone)]
pub struct Iter<'a> {
    bytes: &'a [u8],
    left: usize,
}

impl Iterator for Iter<'_> {
    type Item = u32;

    #[inline]
    fn next(&mut self) -> Option<u32> {
        if self.left == 0 {
            return None;
        }
        let mut id: u32 = 0;
        let mut shift = 0;
        // `push` wrote every byte, so each id ends within the slice; `split_first` keeps the
        // walk panic-free regardless.
        while let Some((&b, rest)) = self.bytes.split_first() {
            self.bytes = rest;
            id |= u32::from(b & 0x7f) << shift;
            if b < 0x80 {
                break;
            }
            shift += 7;
        }
        self.left -= 1;
        Some(id)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_width_round_trips() {
        let ids = [
            0,
            1,
            9,
            127,
            128,
            16_383,
            16_384,
            151_935,
            2_097_151,
            2_097_152,
            268_435_455,
            268_435_456,
            u32::MAX,
        ];
        let t = TokenIds::from(&ids[..]);
        assert_eq!(t.len(), ids.len());
        assert_eq!(t.to_vec(), ids);
        assert_eq!(t.iter().len(), ids.len());
        assert_eq!(format!("{t:?}"), format!("{ids:?}"));
    }

    #[test]
    fn an_id_never_takes_more_than_half_its_text_with_a_separator() {
        for id in [
            0u32,
            9,
            10,
            99,
            100,
            127,
            128,
            999,
            1000,
            16_383,
            16_384,
            99_999,
            2_097_151,
            2_097_152,
            9_999_999,
            268_435_455,
            268_435_456,
            u32::MAX,
        ] {
            let t = TokenIds::from(vec![id]);
            let text = id.to_string().len() + 1;
            assert!(2 * t.bytes.len() <= text, "{id}: {} bytes", t.bytes.len());
        }
    }

    #[test]
    fn equal_lists_are_equal() {
        assert_eq!(
            TokenIds::from(vec![1, 300]),
            [1u32, 300].into_iter().collect()
        );
        assert_ne!(TokenIds::from(vec![1, 300]), TokenIds::from(vec![300, 1]));
        assert!(TokenIds::new().is_empty());
    }
}
