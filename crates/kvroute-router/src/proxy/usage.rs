//! A response's `usage` as the engine reported it — prompt, completion and cached prompt
//! tokens (`usage.prompt_tokens_details.cached_tokens`, which vLLM fills with
//! `--enable-prompt-tokens-details` and SGLang with `--enable-cache-report`) — read from the
//! bytes passing, JSON body or stream alike (a stream has them in its last event when the
//! client asks for `stream_options.include_usage`).
//!
//! Found without parsing, as `output_tokens` finds `completion_tokens`: inside a JSON string a
//! quote is escaped, so `"cached_tokens"` in the bytes can only be the key. The last value of
//! each key wins (a stream with continuous usage repeats them). Memory: a few bytes carried
//! between chunks.

use super::output_tokens::{find, number_after_colon};

const KEYS: [&[u8]; 3] = [
    b"\"prompt_tokens\"",
    b"\"completion_tokens\"",
    b"\"cached_tokens\"",
];

/// Bytes carried from one chunk to the next: enough for a key, a colon with some spaces and
/// any u64.
const CARRY: usize = 64;

/// What the engine reported; `None` for what it did not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt: Option<u64>,
    /// `usage.completion_tokens`.
    pub completion: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens` (absent or `null` when the engine does not
    /// report it).
    pub cached: Option<u64>,
}

impl Usage {
    /// Prompt plus completion, when both are known.
    pub fn total(&self) -> Option<u64> {
        Some(self.prompt? + self.completion?)
    }
}

/// Reads [`Usage`] from a response's chunks as they pass.
#[derive(Debug, Default)]
pub struct UsageScan {
    usage: Usage,
    carry: Vec<u8>,
}

impl UsageScan {
    /// A scan of a new response.
    pub fn new() -> UsageScan {
        UsageScan::default()
    }

    /// Feeds the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(chunk);
        for (i, key) in KEYS.iter().enumerate() {
            if let Some(n) = last_value(&buf, key) {
                let slot = match i {
                    0 => &mut self.usage.prompt,
                    1 => &mut self.usage.completion,
                    _ => &mut self.usage.cached,
                };
                *slot = Some(n);
            }
        }
        let keep = buf.len().saturating_sub(CARRY);
        buf.drain(..keep);
        self.carry = buf;
    }

    /// What was reported so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }
}

/// The last complete `key: N` in `buf`. A value seen whole in one chunk is seen again with the
/// carried tail of the next only if the key is in that tail too; the same value, so no harm.
fn last_value(buf: &[u8], key: &[u8]) -> Option<u64> {
    let mut found = None;
    let mut from = 0;
    while let Some(at) = find(&buf[from..], key) {
        let after = from + at + key.len();
        if let Some(n) = number_after_colon(&buf[after..]) {
            found = Some(n);
        }
        from = after;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&[u8]]) -> Usage {
        let mut s = UsageScan::new();
        for c in chunks {
            s.feed(c);
        }
        s.usage()
    }

    #[test]
    fn usage_is_read_from_a_json_body_split_anywhere() {
        let body: &[u8] = br#"{"choices":[{"text":"\"cached_tokens\": 5"}],"usage":{"prompt_tokens":320,"total_tokens":330,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":288}}}"#;
        let whole = Usage {
            prompt: Some(320),
            completion: Some(10),
            cached: Some(288),
        };
        for cut in 1..body.len() {
            assert_eq!(scan(&[&body[..cut], &body[cut..]]), whole, "cut at {cut}");
        }
        assert_eq!(whole.total(), Some(330));
    }

    #[test]
    fn a_stream_reports_its_last_usage_and_null_details_are_absent() {
        let stream: &[&[u8]] = &[
            b"data: {\"choices\":[{\"text\":\"hi\"}]}\n\n",
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"prompt_tokens_details\":null}}\n\n",
            b"data: [DONE]\n\n",
        ];
        assert_eq!(
            scan(stream),
            Usage {
                prompt: Some(7),
                completion: Some(2),
                cached: None
            }
        );
        assert_eq!(scan(&[b"{\"choices\":[]}"]), Usage::default());
    }
}
