//! The `model` (and `cache_salt`) of a JSON request body whose other fields routing does not
//! read: embeddings, rerank, score, tokenize, and bodies forwarded on the allow-list. One
//! streaming pass, no tree of the body; everything else is walked (parsed, so malformed JSON is
//! refused as the tree parser would refuse it) and dropped.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::ApiError;
use super::walk::{ScalarSeed, Seen, Skip, drain_seq};

/// What a JSON body says about its model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelField {
    /// `model`, when given as a non-empty string.
    pub model: Option<String>,
    /// `cache_salt`, when given as a string.
    pub cache_salt: Option<String>,
}

impl ModelField {
    /// Reads `body`: 400 for malformed JSON, a body that is not an object, or a `model` or
    /// `cache_salt` that is not a string.
    pub fn from_json(body: &[u8]) -> Result<ModelField, ApiError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let read = BodySeed
            .deserialize(&mut de)
            .and_then(|b| de.end().map(|()| b))
            .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), None))?;
        let Some((model, salt)) = read else {
            return Err(ApiError::invalid(
                "request body must be a JSON object",
                None,
            ));
        };
        let string = |seen: Seen<String>, key: &str| match seen {
            Seen::Absent | Seen::Null => Ok(None),
            Seen::Is(s) => Ok(Some(s)),
            Seen::Other => Err(ApiError::invalid(
                format!("`{key}` must be a string"),
                Some(key),
            )),
        };
        Ok(ModelField {
            model: string(model, "model")?.filter(|m| !m.is_empty()),
            cache_salt: string(salt, "cache_salt")?,
        })
    }
}

struct BodySeed;

type Read = Option<(Seen<String>, Seen<String>)>;

impl<'de> DeserializeSeed<'de> for BodySeed {
    type Value = Read;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Read, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BodySeed {
    type Value = Read;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Read, A::Error> {
        let (mut model, mut salt) = (Seen::Absent, Seen::Absent);
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Model => model = map.next_value_seed(ScalarSeed)?.string(),
                Key::CacheSalt => salt = map.next_value_seed(ScalarSeed)?.string(),
                Key::Other => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(Some((model, salt)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Read, A::Error> {
        drain_seq(seq)?;
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Read, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Read, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Read, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Read, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Read, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Read, E> {
        Ok(None)
    }
}

enum Key {
    Model,
    CacheSalt,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "model" => Key::Model,
                    "cache_salt" => Key::CacheSalt,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_model_and_salt_and_skips_the_rest() {
        let f = ModelField::from_json(
            br#"{"input": ["a", {"deep": [1, 2.5]}], "model": "e5", "cache_salt": "s"}"#,
        )
        .unwrap();
        assert_eq!(f.model.as_deref(), Some("e5"));
        assert_eq!(f.cache_salt.as_deref(), Some("s"));
        let none = ModelField::from_json(br#"{"input": "x", "model": null}"#).unwrap();
        assert_eq!(none, ModelField::default());
        assert_eq!(
            ModelField::from_json(br#"{"model": ""}"#).unwrap().model,
            None
        );
    }

    #[test]
    fn refuses_what_is_not_an_object_with_a_string_model() {
        for body in [
            &b"[1]"[..],
            b"\"x\"",
            b"{\"model\": 3}",
            b"{\"model\": \"m\",}",
            b"{\"model\": \"m\"} x",
            b"{\"cache_salt\": []}",
        ] {
            let e = ModelField::from_json(body).unwrap_err();
            assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(body));
        }
    }
}
