//! How many tokens a response generated, read from the bytes passing through (for the
//! recorded trace's `output_length`).
//!
//! The engine's own count wins: `usage.completion_tokens`, which vLLM and SGLang put in every
//! JSON response and in a stream's last event when the client asks for
//! `stream_options.include_usage` (the last value seen counts, so a stream with continuous
//! usage stats works too). A stream without usage is counted by its content-bearing events:
//! vLLM and SGLang send one event per decode step, so this is the token count except where a
//! step yields several tokens (speculative decoding) or a request asks for `n` > 1 choices.
//!
//! The key is found without parsing the body: inside a JSON string a quote is escaped, so the
//! bytes `"completion_tokens"` can only be the key itself. Memory is bounded: one partial SSE
//! line (at most [`MAX_LINE`]) and a few bytes carried between chunks of a JSON body.

use serde_json::Value;

use super::first_token::event_has_content;

const KEY: &[u8] = b"\"completion_tokens\"";

/// Longest SSE line kept whole; a longer one counts as one content event.
const MAX_LINE: usize = 1 << 20;

/// Bytes carried from one chunk of a JSON body to the next: enough for the key, a colon with
/// some spaces and any u64.
const CARRY: usize = 64;

/// Counts the output tokens of one response as its chunks pass.
#[derive(Debug)]
pub struct OutputTokens {
    sse: bool,
    usage: Option<u64>,
    events: u64,
    /// An SSE line not yet complete, or the tail of a JSON body's last chunk.
    partial: Vec<u8>,
    /// Inside an SSE line too long to keep.
    oversized: bool,
}

impl OutputTokens {
    /// A counter for a stream (`sse`) or a plain JSON body.
    pub fn new(sse: bool) -> OutputTokens {
        OutputTokens {
            sse,
            usage: None,
            events: 0,
            partial: Vec::new(),
            oversized: false,
        }
    }

    /// Feeds the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.sse {
            self.feed_sse(chunk);
        } else {
            let mut buf = std::mem::take(&mut self.partial);
            buf.extend_from_slice(chunk);
            if let Some(n) = last_usage(&buf) {
                self.usage = Some(n);
            }
            let keep = buf.len().saturating_sub(CARRY);
            buf.drain(..keep);
            self.partial = buf;
        }
    }

    /// The output tokens: the engine's usage if it told it, else (for a stream) the content
    /// events counted; `None` for a JSON body without usage.
    pub fn count(&self) -> Option<u64> {
        match self.usage {
            Some(n) => Some(n),
            None if self.sse => Some(self.events),
            None => None,
        }
    }

    fn feed_sse(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            let (line, tail) = rest.split_at(pos);
            rest = &tail[1..];
            if std::mem::take(&mut self.oversized) {
                self.events += 1;
                self.partial.clear();
                continue;
            }
            if self.partial.is_empty() {
                self.line(line);
            } else {
                let mut full = std::mem::take(&mut self.partial);
                full.extend_from_slice(line);
                self.line(&full);
                full.clear();
                self.partial = full;
            }
        }
        if self.oversized {
            return;
        }
        if self.partial.len() + rest.len() <= MAX_LINE {
            self.partial.extend_from_slice(rest);
        } else {
            self.partial.clear();
            self.oversized = true;
        }
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data.is_empty() || data == b"[DONE]" {
            return;
        }
        if let Some(n) = last_usage(data) {
            self.usage = Some(n);
            return;
        }
        let content = match serde_json::from_slice::<Value>(data) {
            Ok(v) => event_has_content(&v),
            Err(_) => true,
        };
        if content {
            self.events += 1;
        }
    }
}

/// The value of the last complete `"completion_tokens": N` in `buf`.
fn last_usage(buf: &[u8]) -> Option<u64> {
    let mut found = None;
    let mut from = 0;
    while let Some(at) = find(&buf[from..], KEY) {
        let after = from + at + KEY.len();
        if let Some(n) = number_after_colon(&buf[after..]) {
            found = Some(n);
        }
        from = after;
    }
    found
}

/// Where `needle` first occurs in `hay` (memchr's substring search: the usage scan runs it
/// three times over every chunk of every response).
pub(super) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

/// `: N` (spaces allowed) with N followed by a non-digit: a number cut by the chunk's end is
/// not taken (it is seen whole with the next chunk).
pub(super) fn number_after_colon(s: &[u8]) -> Option<u64> {
    let s = s.trim_ascii_start().strip_prefix(b":")?.trim_ascii_start();
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits == s.len() {
        return None;
    }
    std::str::from_utf8(&s[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(sse: bool, chunks: &[&[u8]]) -> Option<u64> {
        let mut c = OutputTokens::new(sse);
        for chunk in chunks {
            c.feed(chunk);
        }
        c.count()
    }

    #[test]
    fn a_json_body_tells_its_usage_even_split_mid_key() {
        let body = br#"{"choices":[{"text":"say \"completion_tokens\": 99"}],"usage":{"prompt_tokens":5,"completion_tokens":17,"total_tokens":22,"completion_tokens_details":null}}"#;
        assert_eq!(counted(false, &[body]), Some(17));
        for cut in [1, 60, 95, 100, 104, 105, body.len() - 1] {
            let (a, b) = body.split_at(cut);
            assert_eq!(counted(false, &[a, b]), Some(17), "cut at {cut}");
        }
        assert_eq!(counted(false, &[b"{\"choices\":[]}"]), None);
    }

    #[test]
    fn a_stream_counts_content_events_unless_it_has_usage() {
        let stream: &[&[u8]] = &[
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choi",
            b"ces\":[{\"delta\":{\"content\":\"b\"}}]}\n\n: keep-alive\n\n",
            b"data: {\"choices\":[{\"delta\":{\"content\":\"c\"}}]}\r\n\r\n",
        ];
        assert_eq!(counted(true, stream), Some(3));
        let mut with_usage = stream.to_vec();
        with_usage.push(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":4}}\n\n");
        with_usage.push(b"data: [DONE]\n\n");
        assert_eq!(counted(true, &with_usage), Some(4));
        assert_eq!(counted(true, &[]), Some(0));
    }

    #[test]
    fn an_oversized_event_counts_once() {
        let big = vec![b'x'; MAX_LINE + 10];
        let chunks: Vec<&[u8]> = vec![
            b"data: ",
            &big,
            b"\n\ndata: {\"choices\":[{\"text\":\"y\"}]}\n\n",
        ];
        assert_eq!(counted(true, &chunks), Some(2));
    }
}
