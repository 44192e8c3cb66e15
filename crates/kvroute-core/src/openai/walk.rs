//! Walking JSON values without keeping them: how a field appeared ([`Seen`]), a scalar's value
//! ([`Scalar`]), and containers parsed in full and dropped ([`Skip`], [`drain_seq`],
//! [`drain_map`]). Shared by the body's top-level reader and its `prompt` and `messages`
//! readers, so none of them imports another's internals.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// How a field appeared in the body (the last occurrence wins, as in a JSON tree).
#[derive(Debug, Default)]
pub(super) enum Seen<T> {
    /// Not in the body.
    #[default]
    Absent,
    /// `null`.
    Null,
    /// The expected type, with what routing keeps of it.
    Is(T),
    /// Any other type.
    Other,
}

/// A value walked and dropped. Parsed in full (`deserialize_any`, not `deserialize_ignored_any`,
/// which only scans), so malformed numbers and strings fail as they would in a tree.
pub(super) struct Skip;

impl<'de> de::Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Skip, D::Error> {
        d.deserialize_any(SkipVisitor)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Skip, A::Error> {
        drain_seq(seq).map(|()| Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Skip, A::Error> {
        drain_map(map).map(|()| Skip)
    }
}

pub(super) fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<Skip>()?.is_some() {}
    Ok(())
}

pub(super) fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<Skip, Skip>()?.is_some() {}
    Ok(())
}

/// A scalar field's value; containers are walked and reported as `Other`.
#[derive(Debug, PartialEq)]
pub enum Scalar {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A non-negative integer.
    U64(u64),
    /// A string.
    Str(String),
    /// Anything else: a negative or fractional number, an array, an object.
    Other,
}

impl Scalar {
    pub(super) fn string(self) -> Seen<String> {
        match self {
            Scalar::Null => Seen::Null,
            Scalar::Str(s) => Seen::Is(s),
            _ => Seen::Other,
        }
    }
    pub(super) fn bool(self) -> Seen<bool> {
        match self {
            Scalar::Null => Seen::Null,
            Scalar::Bool(b) => Seen::Is(b),
            _ => Seen::Other,
        }
    }
    pub(super) fn u64(self) -> Seen<u64> {
        match self {
            Scalar::Null => Seen::Null,
            Scalar::U64(n) => Seen::Is(n),
            _ => Seen::Other,
        }
    }
}

pub(super) struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ScalarSeed {
    type Value = Scalar;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Scalar, E> {
        // serde_json hands non-negative integers to `visit_u64`: this one is negative.
        Ok(Scalar::Other)
    }
    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::U64(v))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }
    fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar::Str(v))
    }
    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }
    fn visit_none<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scalar, A::Error> {
        drain_seq(seq).map(|()| Scalar::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar, A::Error> {
        drain_map(map).map(|()| Scalar::Other)
    }
}
