//! Finding the id of a Responses API response (`resp_…`) in the bytes passing through, so the
//! router learns which worker stores it: the top-level `id` of a JSON body, or the
//! `response.id` of a stream's first events (`response.created`). The scan looks at a bounded
//! prefix of the body ([`SCAN_LIMIT`]) and stops at the first id; the bytes themselves are never
//! held back or changed.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

/// Bytes of a response looked at before giving up (engines put the id first: vLLM's JSON body
/// starts with it, its stream with `response.created`).
pub const SCAN_LIMIT: usize = 256 << 10;

/// Longest id learned; a longer one is not remembered.
pub const MAX_ID_BYTES: usize = 256;

/// Incremental finder of a response id.
#[derive(Debug)]
pub struct ResponseIdScanner {
    sse: bool,
    /// The JSON body so far, or the SSE stream's unfinished line.
    buf: Vec<u8>,
    scanned: usize,
    done: bool,
}

impl ResponseIdScanner {
    /// A scanner for an SSE stream (`sse`) or a JSON body.
    pub fn new(sse: bool) -> Self {
        ResponseIdScanner {
            sse,
            buf: Vec::new(),
            scanned: 0,
            done: false,
        }
    }

    /// Feeds the next chunk; returns the id the one time it is found.
    pub fn feed(&mut self, chunk: &[u8]) -> Option<String> {
        if self.done {
            return None;
        }
        let take = chunk.len().min(SCAN_LIMIT - self.scanned);
        let chunk = &chunk[..take];
        self.scanned += take;
        let found = if self.sse {
            self.feed_sse(chunk)
        } else {
            self.feed_json(chunk)
        };
        if found.is_some() || self.scanned >= SCAN_LIMIT {
            self.finish();
        }
        found.filter(|id| !id.is_empty() && id.len() <= MAX_ID_BYTES)
    }

    fn finish(&mut self) {
        self.done = true;
        self.buf = Vec::new();
    }

    fn feed_json(&mut self, chunk: &[u8]) -> Option<String> {
        self.buf.extend_from_slice(chunk);
        match top_level_id(&self.buf) {
            Scan::Found(id) => Some(id),
            Scan::More => None,
            Scan::Absent => {
                self.finish();
                None
            }
        }
    }

    fn feed_sse(&mut self, chunk: &[u8]) -> Option<String> {
        let mut rest = chunk;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            let (line, tail) = rest.split_at(pos);
            rest = &tail[1..];
            let found = if self.buf.is_empty() {
                event_response_id(line)
            } else {
                self.buf.extend_from_slice(line);
                let full = std::mem::take(&mut self.buf);
                event_response_id(&full)
            };
            if found.is_some() {
                return found;
            }
        }
        self.buf.extend_from_slice(rest);
        None
    }
}

/// The `response.id` of one SSE `data:` line (`response.created` and the other
/// `response.*` lifecycle events carry the whole response object).
fn event_response_id(line: &[u8]) -> Option<String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let data = line.strip_prefix(b"data:")?.trim_ascii();
    let v: Value = serde_json::from_slice(data).ok()?;
    v.get("response")?.get("id")?.as_str().map(str::to_owned)
}

enum Scan {
    Found(String),
    /// The body ends before its top-level `id`.
    More,
    /// The body is complete (or not JSON) and has no top-level string `id`.
    Absent,
}

/// The top-level string `id` of a JSON object that may be cut short.
fn top_level_id(buf: &[u8]) -> Scan {
    let mut found = None;
    let mut de = serde_json::Deserializer::from_slice(buf);
    match IdSeed(&mut found).deserialize(&mut de) {
        _ if found.is_some() => Scan::Found(found.unwrap_or_default()),
        Err(e) if e.is_eof() => Scan::More,
        _ => Scan::Absent,
    }
}

/// Walks an object's keys until `id`, whose string value it stores and then stops (with an
/// error: nothing after it is read).
struct IdSeed<'a>(&'a mut Option<String>);

impl<'de> DeserializeSeed<'de> for IdSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IdSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "id" {
                if let Value::String(id) = map.next_value::<Value>()? {
                    *self.0 = Some(id);
                    return Err(de::Error::custom("found"));
                }
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_id_found_across_chunks() {
        let body = br#"{"id":"resp_abc","object":"response","output":[{"id":"msg_1"}]}"#;
        for split in 1..body.len() {
            let mut s = ResponseIdScanner::new(false);
            let a = s.feed(&body[..split]);
            let b = s.feed(&body[split..]);
            assert_eq!(a.or(b).as_deref(), Some("resp_abc"), "split at {split}");
        }
    }

    #[test]
    fn json_id_after_other_fields_and_nested_ids_ignored() {
        let mut s = ResponseIdScanner::new(false);
        let body = br#"{"output":[{"id":"msg_1","content":"{\"id\":\"x\"}"}],"id":"resp_2"}"#;
        assert_eq!(s.feed(body).as_deref(), Some("resp_2"));
        assert_eq!(s.feed(b"more"), None, "found once");
        let mut none = ResponseIdScanner::new(false);
        assert_eq!(none.feed(br#"{"error":{"message":"x"}}"#), None);
        assert_eq!(
            none.feed(br#"{"id":"late"}"#),
            None,
            "a complete body was judged"
        );
    }

    #[test]
    fn sse_id_from_response_created() {
        let stream = concat!(
            "event: response.created\r\n",
            "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_s\",\"status\":\"in_progress\"}}\r\n\r\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n"
        )
        .as_bytes();
        for split in 1..stream.len() {
            let mut s = ResponseIdScanner::new(true);
            let a = s.feed(&stream[..split]);
            let b = s.feed(&stream[split..]);
            assert_eq!(a.or(b).as_deref(), Some("resp_s"), "split at {split}");
        }
    }

    #[test]
    fn long_ids_and_long_bodies_are_not_learned() {
        let long = format!(r#"{{"id":"{}"}}"#, "x".repeat(MAX_ID_BYTES + 1));
        assert_eq!(ResponseIdScanner::new(false).feed(long.as_bytes()), None);
        let mut s = ResponseIdScanner::new(false);
        let filler = format!(r#"{{"pad":"{}""#, "y".repeat(SCAN_LIMIT));
        assert_eq!(s.feed(filler.as_bytes()), None);
        assert_eq!(s.feed(br#","id":"resp_late"}"#), None);
    }
}
