//! How many events a stream carried, counted from the bytes passing: what an answer wrote
//! when the engine did not say.
//!
//! The cost model learns how fast answers write tokens (`policy::residence`, the tokens running
//! answers hold in a worker's KV cache) from `usage.completion_tokens`. A stream reports it only
//! when the client asks for `stream_options.include_usage`, and most clients do not; without
//! another count, a fleet of such clients never teaches the rate and every answer is taken to
//! hold no tokens. vLLM and SGLang send one `data:` event per decode step, so the events are
//! the answer's tokens, plus a role-only first event (chat), an event with only the finish
//! reason where the engine sends one, fewer where a step yields several tokens (speculative
//! decoding) or the engine holds back a token whose text ends inside a character (SGLang's
//! detokenizer sends it with the next), and more where a request asks for `n` > 1 choices (an
//! event per choice per step): a rate within a few tokens per answer for the common
//! single-choice stream of text. For 12 tokens, vLLM 0.32 sends 13 chat events and 12
//! completion events; SGLang 0.5.23 sent 12–14 and 10–12 of the tiny test model's byte-level
//! tokens (`scripts/real-engines/sdk_stream_check.py`, run by both real-engine stages).
//!
//! Counted without parsing or buffering lines, unlike `output_tokens` (which parses each
//! event for the recorded trace, where the count must be exact): a line starting `data:` is an
//! event, `data: [DONE]` is not. Memory: the last [`TAIL`] bytes, so a line start cut by a
//! chunk's end is seen whole with the next chunk and counted once.

use memchr::memchr_iter;

/// Bytes kept from one chunk to the next: a newline and the longest pattern after it.
const TAIL: usize = 16;

const EVENT: &[u8] = b"data:";
const DONE: [&[u8]; 2] = [b"data: [DONE]", b"data:[DONE]"];

/// Counts a stream's `data:` events as its chunks pass.
#[derive(Debug, Default)]
pub struct StreamEvents {
    events: u64,
    done: u64,
    /// The last bytes of what passed.
    tail: Vec<u8>,
    /// Bytes that passed.
    seen: u64,
}

impl StreamEvents {
    /// A count of a new stream.
    pub fn new() -> StreamEvents {
        StreamEvents::default()
    }

    /// Feeds the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        let mut buf = std::mem::take(&mut self.tail);
        let old = buf.len();
        buf.extend_from_slice(chunk);
        // Byte 0 of the buffer is the stream's first while the tail holds all that passed.
        let first = (self.seen == old as u64).then_some(0);
        let starts = first
            .into_iter()
            .chain(memchr_iter(b'\n', &buf).map(|i| i + 1));
        for s in starts {
            // Each pattern is counted by the feed in which its last byte arrives.
            let ends_here = |p: &[u8]| {
                let end = s + p.len();
                end > old && end <= buf.len() && buf[s..end] == *p
            };
            if ends_here(EVENT) {
                self.events += 1;
            }
            if DONE.iter().any(|p| ends_here(p)) {
                self.done += 1;
            }
        }
        self.seen += chunk.len() as u64;
        let keep = buf.len().saturating_sub(TAIL);
        buf.drain(..keep);
        self.tail = buf;
    }

    /// The events that passed, `[DONE]` not counted.
    pub fn count(&self) -> u64 {
        self.events.saturating_sub(self.done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"data: a\"}}]}\n\n\
        : keep-alive\n\n\
        data:{\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r\n\r\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"c\"},\"finish_reason\":\"stop\"}]}\n\n\
        data: [DONE]\n\n";

    fn counted(chunks: &[&[u8]]) -> u64 {
        let mut e = StreamEvents::new();
        chunks.iter().for_each(|c| e.feed(c));
        e.count()
    }

    #[test]
    fn every_data_event_but_done_counts_once_however_the_stream_is_cut() {
        // Role, a, b, c: "data:" inside a string is not at a line's start.
        assert_eq!(counted(&[STREAM]), 4);
        for cut in 0..=STREAM.len() {
            let (a, b) = STREAM.split_at(cut);
            assert_eq!(counted(&[a, b]), 4, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = STREAM.chunks(1).collect();
        assert_eq!(counted(&bytes), 4);
        let threes: Vec<&[u8]> = STREAM.chunks(3).collect();
        assert_eq!(counted(&threes), 4);
    }

    #[test]
    fn a_stream_without_events_counts_none() {
        assert_eq!(counted(&[]), 0);
        assert_eq!(counted(&[b": ping\n\n", b"", b"data: [DONE]\n\n"]), 0);
        // Not at a line's start: the middle of a line is not an event.
        assert_eq!(counted(&[b"xdata: 1\n"]), 0);
    }
}
