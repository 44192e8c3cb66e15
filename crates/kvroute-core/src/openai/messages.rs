//! A chat request's `messages`, read in the same streaming pass as the other fields
//! ([`super::fields`]): kept as JSON, because chat templates read arbitrary keys, but only up to
//! the first message the view will refuse.

use std::fmt;

use serde::Deserialize as _;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::walk::{Scalar, ScalarSeed, Seen, drain_map, drain_seq};

/// `messages`: an array of message objects, kept as JSON (checked by the view). Parsing stops
/// keeping at the first message the view will refuse: that one is replaced by a small stand-in
/// that fails the view's check the same way, and the rest is only walked. So an array of a
/// million numbers, or a message whose `content` is one, costs no tree.
pub(super) struct MessagesSeed;

impl<'de> DeserializeSeed<'de> for MessagesSeed {
    type Value = Seen<Vec<Value>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessagesSeed {
    type Value = Seen<Vec<Value>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of messages")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some((message, refused)) = seq.next_element_seed(MessageSeed)? {
            items.push(message);
            if refused {
                drain_seq(seq)?;
                break;
            }
        }
        Ok(Seen::Is(items))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Seen::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Seen::Null)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        drain_map(map).map(|()| Seen::Other)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Seen::Other)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Seen::Other)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Seen::Other)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Seen::Other)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Seen::Other)
    }
}

/// One message: the object as JSON and whether the view will refuse it; anything but an object
/// becomes `null` (refused alike).
struct MessageSeed;

impl<'de> DeserializeSeed<'de> for MessageSeed {
    type Value = (Value, bool);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessageSeed {
    type Value = (Value, bool);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a message")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut obj = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = match key.as_str() {
                // A role that is not a string is refused whatever it holds: keep none of it.
                "role" => match map.next_value_seed(ScalarSeed)? {
                    Scalar::Str(s) => Value::String(s),
                    _ => Value::Null,
                },
                "content" => map.next_value_seed(ContentSeed)?,
                _ => map.next_value::<Value>()?,
            };
            obj.insert(key, value);
        }
        let role_ok = obj.get("role").is_some_and(Value::is_string);
        let content_ok = match obj.get("content") {
            None | Some(Value::Null | Value::String(_)) => true,
            Some(Value::Array(parts)) => parts.iter().all(is_part),
            Some(_) => false,
        };
        Ok((Value::Object(obj), !(role_ok && content_ok)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        drain_seq(seq).map(|()| (Value::Null, true))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok((Value::Null, true))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok((Value::Null, true))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok((Value::Null, true))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok((Value::Null, true))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok((Value::Null, true))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok((Value::Null, true))
    }
}

/// A content part the view accepts: an object with a string `type`.
fn is_part(p: &Value) -> bool {
    p.as_object()
        .is_some_and(|o| o.get("type").is_some_and(Value::is_string))
}

/// A message's `content`: a string, `null`, or parts up to the first the view refuses; any other
/// type becomes `false` (refused alike).
struct ContentSeed;

impl<'de> DeserializeSeed<'de> for ContentSeed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ContentSeed {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("message content")
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut parts = Vec::new();
        while let Some(part) = seq.next_element_seed(PartSeed)? {
            let refused = !is_part(&part);
            parts.push(part);
            if refused {
                drain_seq(seq)?;
                break;
            }
        }
        Ok(Value::Array(parts))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        drain_map(map).map(|()| Value::Bool(false))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Bool(false))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Bool(false))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Bool(false))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Bool(false))
    }
}

/// A content part: an object as JSON; anything else becomes `null` (refused alike).
struct PartSeed;

impl<'de> DeserializeSeed<'de> for PartSeed {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PartSeed {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a content part")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        Value::deserialize(de::value::MapAccessDeserializer::new(map))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        drain_seq(seq).map(|()| Value::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}
