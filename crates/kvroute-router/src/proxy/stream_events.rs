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
//! chunk's end is seen whole with the next chunk and counted once; a chunk is not copied.

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
    /// The last bytes of what passed (`tail_len` of them).
    tail: [u8; TAIL],
    tail_len: usize,
    /// Bytes that passed.
    seen: u64,
}

impl StreamEvents {
    /// A count of a new stream.
    pub fn new() -> StreamEvents {
        StreamEvents::default()
    }

    /// Feeds the next chunk. The chunk is read where it lies: only the line starts at or before
    /// its first byte are read from the tail joined to the chunk's first bytes (at most
    /// 2 × [`TAIL`] bytes, on the stack), the others from the chunk itself.
    pub fn feed(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        let old = self.tail_len;
        let head = &chunk[..chunk.len().min(TAIL)];
        let mut joined = [0u8; 2 * TAIL];
        joined[..old].copy_from_slice(&self.tail[..old]);
        joined[old..old + head.len()].copy_from_slice(head);
        let joined = &joined[..old + head.len()];
        // Byte 0 of the tail is the stream's first while the tail holds all that passed.
        let first = (self.seen == old as u64).then_some(0);
        let at_or_before = first
            .into_iter()
            .chain(memchr_iter(b'\n', &joined[..old]).map(|i| i + 1));
        for s in at_or_before {
            self.count_at(joined, s, old);
        }
        for i in memchr_iter(b'\n', chunk) {
            self.count_at(chunk, i + 1, 0);
        }
        self.keep_tail(chunk);
        self.seen += chunk.len() as u64;
    }

    /// Counts the patterns starting at `s` in `buf` whose last byte is past `old` (each is
    /// counted by the feed in which its last byte arrives; one that does not end in `buf` is
    /// counted by a later feed, from the tail).
    fn count_at(&mut self, buf: &[u8], s: usize, old: usize) {
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

    /// Keeps the last [`TAIL`] bytes of the tail followed by `chunk`.
    fn keep_tail(&mut self, chunk: &[u8]) {
        if chunk.len() >= TAIL {
            self.tail.copy_from_slice(&chunk[chunk.len() - TAIL..]);
            self.tail_len = TAIL;
            return;
        }
        let from_tail = self.tail_len.min(TAIL - chunk.len());
        self.tail
            .copy_within(self.tail_len - from_tail..self.tail_len, 0);
        self.tail[from_tail..from_tail + chunk.len()].copy_from_slice(chunk);
        self.tail_len = from_tail + chunk.len();
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
    fn chunks_of_every_size_around_the_tail_count_alike() {
        // Shorter and longer than the tail kept between chunks: both ways of keeping it.
        for size in 1..=2 * TAIL + 8 {
            let cut: Vec<&[u8]> = STREAM.chunks(size).collect();
            assert_eq!(counted(&cut), 4, "chunks of {size}");
        }
    }

    #[test]
    fn a_stream_without_events_counts_none() {
        assert_eq!(counted(&[]), 0);
        assert_eq!(counted(&[b": ping\n\n", b"", b"data: [DONE]\n\n"]), 0);
        // Not at a line's start: the middle of a line is not an event.
        assert_eq!(counted(&[b"xdata: 1\n"]), 0);
    }
}
