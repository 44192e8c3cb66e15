//! A JSON object's top-level members as slices of the body (`&RawValue`), found in one
//! streaming pass with no tree of the body: each endpoint then reads the few members it needs,
//! with its own typed reader, and never holds a `serde_json::Value` of what it does not use.
//! Used by the Responses request (`responses`) and vLLM's `/tokenize` and `/detokenize`
//! (`crate::tokens::tokenize_api`): a 32 MiB body of numbers parsed into a tree cost about
//! 1.2 GB, here it costs nothing beyond the body.
//!
//! The pass still parses every value it skips (numbers in range, strings valid, the nesting
//! limit: [`Skip`]), so a body the tree parser refused is refused here too, before any member
//! is judged. As in a tree, the last of duplicate keys wins.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::walk::{Scalar, ScalarSeed, Skip, drain_map, drain_seq};

/// The wanted members of a JSON object, as slices of the body.
#[derive(Debug)]
pub struct Members<'a> {
    wanted: &'static [&'static str],
    values: Vec<Option<&'a RawValue>>,
    /// The wanted keys present, in the order they first appear (a tree keeps that order).
    order: Vec<usize>,
    /// Whether the object has members that were not wanted.
    pub others: bool,
}

impl<'a> Members<'a> {
    /// The value of member `key` (one of the wanted keys), if present (`null` included).
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        let i = self.wanted.iter().position(|k| *k == key)?;
        self.values[i]
    }

    /// Whether member `key` (one of the wanted keys) is present.
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The wanted keys present, in the order of their first appearance in the body.
    pub fn keys(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.order.iter().map(|&i| self.wanted[i])
    }
}

/// Reads `body` (the whole of it must be one JSON value): the `wanted` members when it is an
/// object, `None` when it is valid JSON of another kind; `Err` when it is not valid JSON.
pub fn members<'a>(
    body: &'a [u8],
    wanted: &'static [&'static str],
) -> Result<Option<Members<'a>>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let read = MembersSeed(wanted).deserialize(&mut de)?;
    de.end()?;
    Ok(read)
}

/// As [`members`], for a value already known to be valid (a member's raw value).
pub fn members_of<'a>(raw: &'a RawValue, wanted: &'static [&'static str]) -> Option<Members<'a>> {
    members(raw.get().as_bytes(), wanted).ok().flatten()
}

/// A scalar member's value (`Absent` and containers are [`Scalar::Other`]/`None`): read without
/// building anything for a container, which is walked and dropped.
pub fn scalar(raw: Option<&RawValue>) -> Option<Scalar> {
    let raw = raw?;
    let mut de = serde_json::Deserializer::from_str(raw.get());
    Some(ScalarSeed.deserialize(&mut de).unwrap_or(Scalar::Other))
}

/// The kind of JSON value `raw` is, from its first character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `{…}`
    Object,
    /// `[…]`
    Array,
    /// `"…"`
    String,
    /// `null`
    Null,
    /// A number or a boolean.
    Other,
}

/// What kind of value `raw` holds.
pub fn kind(raw: &RawValue) -> Kind {
    match raw.get().trim_start().as_bytes().first() {
        Some(b'{') => Kind::Object,
        Some(b'[') => Kind::Array,
        Some(b'"') => Kind::String,
        Some(b'n') => Kind::Null,
        _ => Kind::Other,
    }
}

/// Calls `each` with every element of the array `raw` (as a slice of it) in order, until it
/// returns `false`; nothing when `raw` is not an array.
pub fn for_each_element<'a>(raw: &'a RawValue, each: impl FnMut(usize, &'a RawValue) -> bool) {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let _ = ElementsSeed(each).deserialize(&mut de);
}

struct MembersSeed(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for MembersSeed {
    type Value = Option<Members<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MembersSeed {
    type Value = Option<Members<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Members {
            wanted: self.0,
            values: vec![None; self.0.len()],
            order: Vec::new(),
            others: false,
        };
        while let Some(index) = map.next_key_seed(KeyIndex(self.0))? {
            match index {
                Some(i) => {
                    if out.values[i].is_none() {
                        out.order.push(i);
                    }
                    out.values[i] = Some(map.next_value::<&'de RawValue>()?);
                }
                None => {
                    out.others = true;
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(Some(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        drain_seq(seq).map(|()| None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// A key, mapped to its place among the wanted ones without being kept.
struct KeyIndex(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KeyIndex {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIndex {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|k| *k == v))
    }
}

struct ElementsSeed<F>(F);

impl<'de, F: FnMut(usize, &'de RawValue) -> bool> DeserializeSeed<'de> for ElementsSeed<F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, F: FnMut(usize, &'de RawValue) -> bool> Visitor<'de> for ElementsSeed<F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while let Some(element) = seq.next_element::<&'de RawValue>()? {
            if !(self.0)(i, element) {
                return drain_seq(seq);
            }
            i += 1;
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        drain_map(map)
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WANTED: &[&str] = &["model", "input"];

    #[test]
    fn members_are_slices_and_the_last_duplicate_wins() {
        let body = br#"{"model":"a","x":[1,2,{"y":3}],"model" : "b","input":[1, 2]}"#;
        let m = members(body, WANTED).unwrap().unwrap();
        assert_eq!(m.get("model").unwrap().get(), r#""b""#);
        assert_eq!(m.get("input").unwrap().get(), "[1, 2]");
        assert!(m.others);
        assert_eq!(m.keys().collect::<Vec<_>>(), ["model", "input"]);
        assert!(matches!(scalar(m.get("model")), Some(Scalar::Str(s)) if s == "b"));
        assert!(matches!(scalar(m.get("input")), Some(Scalar::Other)));
        assert_eq!(kind(m.get("input").unwrap()), Kind::Array);
        let mut seen = Vec::new();
        for_each_element(m.get("input").unwrap(), |i, e| {
            seen.push((i, e.get().to_owned()));
            true
        });
        assert_eq!(seen, [(0, "1".to_owned()), (1, "2".to_owned())]);
        assert!(members(b"[1]", WANTED).unwrap().is_none());
        assert!(members(b"{\"model\":1", WANTED).is_err());
        assert!(members(b"{} x", WANTED).is_err());
        assert!(
            members(b"{\"a\":1e999}", WANTED).is_err(),
            "skipped values are parsed"
        );
    }
}
