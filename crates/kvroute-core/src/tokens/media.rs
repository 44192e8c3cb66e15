//! Where a chat's first image (or audio, or video) sits in its tokens, and what the media are.
//!
//! A multimodal engine does not cache an image's blocks under their token ids alone. vLLM
//! expands the template's one placeholder into as many tokens as the image needs and keys every
//! block holding them by the image's own hash as well (`extra_keys`), and since block hashes
//! chain, every block after it too; SGLang's radix cache does the same with the image's pad
//! values. kvroute cannot reproduce those ids (it would need the model's image processor), and
//! it routes a chat on its text. That was right up to the first image and wrong after it: two
//! requests with the same words and different pictures ("describe this image", a form read over
//! and over) hashed alike to the end, so the router's own predictions credited the second with
//! the first's whole prompt, and without KV events (`index.mode = "approx"`) every such request
//! herded onto the worker of the first.
//!
//! So a chat with media is hashed as its text up to the first media item, and from the block
//! holding it on, the chain also covers a digest of every media item in order: blocks before it
//! still match the engine's (a shared system prompt is credited as before), blocks after it
//! match only a request with the same media at the same place, as the engine's do. The place is
//! found by rendering the chat a second time with each media item replaced by a marker text:
//! the two renderings' tokens agree up to the first item and differ from there, whatever the
//! template prints for media (a placeholder, or nothing).

use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

/// Marks a media item in the second rendering: private-use code points no template or prompt
/// prints on its own.
const MARKER: &str = "\u{F8FF}kvroute-media\u{F8FF}";

/// Where a chat's media begin in its tokens, and a digest of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MediaMark {
    /// The index of the first token that is not the same as in the chat without its media: the
    /// first media item's place.
    pub at: usize,
    /// A digest of every media item, in order (each as the client sent it).
    pub digest: u64,
}

/// Whether `part` of a message's content is media (`image_url`, `input_image`, `input_audio`,
/// `video_url`, `file`, …): anything but text, and an assistant's refusal.
pub fn is_media(part: &Value) -> bool {
    let ty = part.get("type").and_then(Value::as_str);
    let textual = ty.is_some_and(crate::openai::is_text_part_type);
    !textual && part.get("text").and_then(Value::as_str).is_none()
}

/// The content parts of `messages`' array contents.
fn parts(messages: &[Value]) -> impl Iterator<Item = &Value> {
    messages
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flatten()
}

/// Feeds what is written to it to the digest: an item (a base64 image can be megabytes) is
/// serialized straight into the hash, never into a buffer.
struct Digesting<'a>(&'a mut Xxh3);

impl std::io::Write for Digesting<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A digest of media items, fed one at a time in order.
#[derive(Clone, Default)]
pub struct Digest {
    hasher: Xxh3,
    any: bool,
}

impl Digest {
    /// Adds the media item `part`.
    pub fn add(&mut self, part: &Value) {
        self.any = true;
        // serde_json writes an object's members in one order for one parse: the same item
        // sent twice digests alike. A separator keeps two items apart from one.
        let _ = serde_json::to_writer(Digesting(&mut self.hasher), part);
        self.hasher.update(&[0xff]);
    }

    /// The digest of the items added, or `None` when there were none.
    pub fn finish(&self) -> Option<u64> {
        self.any.then(|| self.hasher.digest())
    }
}

/// A digest of `messages`' media items in order, or `None` when they have none.
pub fn digest(messages: &[Value]) -> Option<u64> {
    let mut d = Digest::default();
    for part in parts(messages).filter(|p| is_media(p)) {
        d.add(part);
    }
    d.finish()
}

/// `messages` with every media item replaced by a text part holding the marker (the items
/// themselves are not copied).
pub fn marked(messages: &[Value]) -> Vec<Value> {
    messages.iter().map(marked_message).collect()
}

fn marked_message(message: &Value) -> Value {
    let (Value::Object(fields), Some(Value::Array(parts))) = (message, message.get("content"))
    else {
        return message.clone();
    };
    let content = parts
        .iter()
        .map(|p| {
            if is_media(p) {
                serde_json::json!({"type": "text", "text": MARKER})
            } else {
                p.clone()
            }
        })
        .collect();
    let mut out: serde_json::Map<String, Value> = fields
        .iter()
        .filter(|(k, _)| k.as_str() != "content")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert("content".to_owned(), Value::Array(content));
    Value::Object(out)
}

/// `messages` with the marker put before the string content of message `at`: where the media
/// of a message whose parts were flattened into text (a Responses input's, as vLLM's "string"
/// content format renders it, with the media's placeholders ahead of the text) begin.
pub fn marked_from(messages: &[Value], at: usize) -> Vec<Value> {
    let mut out = messages.to_vec();
    if let Some(Value::Object(m)) = out.get_mut(at) {
        let text = m.get("content").and_then(Value::as_str).unwrap_or_default();
        let content = format!("{MARKER}{text}");
        m.insert("content".to_owned(), Value::String(content));
    }
    out
}

/// The media mark of a chat whose tokens are `ids` and, with its media replaced by markers,
/// `marked_ids`; `digest` is [`digest`]'s.
pub fn mark(ids: &[u32], marked_ids: &[u32], digest: u64) -> MediaMark {
    let at = ids
        .iter()
        .zip(marked_ids)
        .take_while(|(a, b)| a == b)
        .count();
    MediaMark { at, digest }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(url: &str) -> Vec<Value> {
        vec![
            json!({"role": "system", "content": "You read forms."}),
            json!({"role": "user", "content": [
                {"type": "text", "text": "Describe this image."},
                {"type": "image_url", "image_url": {"url": url}},
            ]}),
        ]
    }

    #[test]
    fn text_only_chats_have_no_media() {
        let plain = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}]}),
            json!({"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}),
        ];
        assert_eq!(digest(&plain), None);
        assert_eq!(marked(&plain), plain);
    }

    #[test]
    fn the_digest_tells_media_apart_and_keeps_the_same_alike() {
        let a = digest(&chat("https://x/a.png")).unwrap();
        assert_eq!(digest(&chat("https://x/a.png")), Some(a));
        assert_ne!(digest(&chat("https://x/b.png")), Some(a));
        let audio = vec![
            json!({"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}),
        ];
        assert!(digest(&audio).is_some());
    }

    #[test]
    fn media_items_become_marker_text() {
        let m = marked(&chat("https://x/a.png"));
        assert_eq!(m[0], chat("u")[0]);
        assert_eq!(m[1]["content"][0]["text"], "Describe this image.");
        assert_eq!(m[1]["content"][1], json!({"type": "text", "text": MARKER}));
    }

    #[test]
    fn a_flattened_message_is_marked_before_its_text() {
        let m = vec![
            json!({"role": "system", "content": "s"}),
            json!({"role": "user", "content": "look", "name": "n"}),
        ];
        let marked = marked_from(&m, 1);
        assert_eq!(marked[0], m[0]);
        assert_eq!(marked[1]["content"], format!("{MARKER}look"));
        assert_eq!(marked[1]["name"], "n");
        assert_eq!(marked_from(&m, 5), m, "no such message: nothing marked");
    }

    #[test]
    fn items_fed_one_by_one_digest_as_a_chat_of_them() {
        let chat = chat("https://x/a.png");
        let mut d = Digest::default();
        assert_eq!(d.finish(), None);
        d.add(&chat[1]["content"][1]);
        assert_eq!(d.finish(), digest(&chat));
    }

    #[test]
    fn the_mark_is_where_the_two_renderings_part() {
        assert_eq!(mark(&[1, 2, 3, 9, 9], &[1, 2, 3, 7, 7, 7], 5).at, 3);
        assert_eq!(mark(&[1, 2], &[1, 2, 3], 5).at, 2);
        assert_eq!(mark(&[4], &[1], 5).at, 0);
    }
}
