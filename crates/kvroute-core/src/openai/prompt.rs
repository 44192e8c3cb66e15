//! A completion's `prompt`, read in the same streaming pass as the other fields
//! ([`super::fields`]): token ids go straight into `Vec<u32>`, and after the first item of the
//! wrong shape the rest is only walked.
//!
//! Token ids are kept compact ([`TokenIds`]: at most half the text they came in), since they
//! are held alongside the body that is forwarded.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::Prompt;
use super::token_ids::TokenIds;
use super::walk::{Scalar, ScalarSeed, Seen, drain_map, drain_seq};

/// Why a `prompt` array is not one of the four allowed shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PromptFault {
    /// Mixed, non-integer or out-of-range items, or a non-array item in a batch.
    Shape,
    /// `[]`.
    Empty,
    /// `[[1], []]`.
    EmptyTokenList,
}

/// `prompt`: a string, or an array whose first item decides the shape of the rest. Token ids
/// are collected into a buffer sized for the most the body's length can hold (an id's encoding
/// is at most half its text with its separator), so a long list is never copied while it
/// grows; untouched capacity costs no memory.
pub(super) struct PromptSeed(pub usize);

impl<'de> DeserializeSeed<'de> for PromptSeed {
    type Value = Seen<Result<Prompt, PromptFault>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

type PromptSeen = Seen<Result<Prompt, PromptFault>>;

impl<'de> Visitor<'de> for PromptSeed {
    type Value = PromptSeen;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a prompt")
    }
    fn visit_str<E>(self, v: &str) -> Result<PromptSeen, E> {
        Ok(Seen::Is(Ok(Prompt::Text(v.to_owned()))))
    }
    fn visit_string<E>(self, v: String) -> Result<PromptSeen, E> {
        Ok(Seen::Is(Ok(Prompt::Text(v))))
    }
    fn visit_unit<E>(self) -> Result<PromptSeen, E> {
        Ok(Seen::Null)
    }
    fn visit_none<E>(self) -> Result<PromptSeen, E> {
        Ok(Seen::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<PromptSeen, E> {
        Ok(Seen::Is(Err(PromptFault::Shape)))
    }
    fn visit_i64<E>(self, _: i64) -> Result<PromptSeen, E> {
        Ok(Seen::Is(Err(PromptFault::Shape)))
    }
    fn visit_u64<E>(self, _: u64) -> Result<PromptSeen, E> {
        Ok(Seen::Is(Err(PromptFault::Shape)))
    }
    fn visit_f64<E>(self, _: f64) -> Result<PromptSeen, E> {
        Ok(Seen::Is(Err(PromptFault::Shape)))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PromptSeen, A::Error> {
        drain_map(map)?;
        Ok(Seen::Is(Err(PromptFault::Shape)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PromptSeen, A::Error> {
        let prompt = match seq.next_element_seed(ItemSeed)? {
            None => return Ok(Seen::Is(Err(PromptFault::Empty))),
            Some(Item::Text(first)) => {
                let mut texts = vec![first];
                rest(&mut seq, &mut texts, TextSeed)?.map(|()| Prompt::Texts(texts))
            }
            Some(Item::Token(first)) => {
                let mut ids = TokenIds::with_capacity_bytes(self.0 / 2 + 1);
                match first {
                    Some(id) => {
                        ids.push(id);
                        rest(&mut seq, &mut ids, TokenSeed)?.map(|()| Prompt::Tokens(ids))
                    }
                    None => Err(PromptFault::Shape),
                }
            }
            Some(Item::Tokens(first)) => match first {
                Ok(ids) => {
                    let mut batches = vec![ids];
                    rest(&mut seq, &mut batches, TokenListSeed)?
                        .map(|()| Prompt::TokenBatches(batches))
                }
                Err(fault) => Err(fault),
            },
            Some(Item::Other) => Err(PromptFault::Shape),
        };
        // After a fault the rest is only checked for well-formedness.
        drain_seq(seq)?;
        Ok(Seen::Is(prompt.map(|mut p| {
            if let Prompt::Tokens(ids) = &mut p {
                ids.shrink_to_fit();
            }
            p
        })))
    }
}

/// Appends the items after the first, each read with `seed`, until the array ends or an item
/// has the wrong shape (then that item's fault; the caller drains the rest).
fn rest<'de, A, S, T>(
    seq: &mut A,
    out: &mut impl Extend<T>,
    seed: S,
) -> Result<Result<(), PromptFault>, A::Error>
where
    A: SeqAccess<'de>,
    S: DeserializeSeed<'de, Value = Result<T, PromptFault>> + Copy,
{
    while let Some(item) = seq.next_element_seed(seed)? {
        match item {
            Ok(v) => out.extend(std::iter::once(v)),
            Err(fault) => return Ok(Err(fault)),
        }
    }
    Ok(Ok(()))
}

/// The first item of a prompt array.
enum Item {
    Text(String),
    /// A number: a token id when it fits a `u32`.
    Token(Option<u32>),
    Tokens(Result<TokenIds, PromptFault>),
    Other,
}

#[derive(Clone, Copy)]
struct ItemSeed;

impl<'de> DeserializeSeed<'de> for ItemSeed {
    type Value = Item;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Item, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed {
    type Value = Item;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a prompt item")
    }
    fn visit_str<E>(self, v: &str) -> Result<Item, E> {
        Ok(Item::Text(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Item, E> {
        Ok(Item::Text(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Item, E> {
        Ok(Item::Token(u32::try_from(v).ok()))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Item, E> {
        Ok(Item::Token(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Item, E> {
        Ok(Item::Token(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Item, E> {
        Ok(Item::Other)
    }
    fn visit_unit<E>(self) -> Result<Item, E> {
        Ok(Item::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
        drain_map(map).map(|()| Item::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Item, A::Error> {
        TokenListSeed.visit_seq(seq).map(Item::Tokens)
    }
}

/// A string item after the first.
#[derive(Clone, Copy)]
struct TextSeed;

impl<'de> DeserializeSeed<'de> for TextSeed {
    type Value = Result<String, PromptFault>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        match ScalarSeed.deserialize(d)? {
            Scalar::Str(s) => Ok(Ok(s)),
            _ => Ok(Err(PromptFault::Shape)),
        }
    }
}

/// A token id: a JSON integer that fits a `u32`.
#[derive(Clone, Copy)]
struct TokenSeed;

impl<'de> DeserializeSeed<'de> for TokenSeed {
    type Value = Result<u32, PromptFault>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        match ScalarSeed.deserialize(d)? {
            Scalar::U64(n) => Ok(u32::try_from(n).map_err(|_| PromptFault::Shape)),
            _ => Ok(Err(PromptFault::Shape)),
        }
    }
}

/// A non-empty array of token ids (an item of a batch).
#[derive(Clone, Copy)]
struct TokenListSeed;

impl<'de> DeserializeSeed<'de> for TokenListSeed {
    type Value = Result<TokenIds, PromptFault>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TokenListSeed {
    type Value = Result<TokenIds, PromptFault>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of token ids")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut ids = TokenIds::new();
        let done = rest(&mut seq, &mut ids, TokenSeed)?;
        drain_seq(seq)?;
        Ok(match done {
            Ok(()) if ids.is_empty() => Err(PromptFault::EmptyTokenList),
            Ok(()) => {
                ids.shrink_to_fit();
                Ok(ids)
            }
            Err(fault) => Err(fault),
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        drain_map(map).map(|()| Err(PromptFault::Shape))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Err(PromptFault::Shape))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Err(PromptFault::Shape))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Err(PromptFault::Shape))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Err(PromptFault::Shape))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Err(PromptFault::Shape))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Err(PromptFault::Shape))
    }
}
