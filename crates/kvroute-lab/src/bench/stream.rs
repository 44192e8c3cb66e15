//! Reading a streamed completion: which SSE events carry tokens, and what `usage` says.
//!
//! Pure bookkeeping over bytes and the times they arrived, so it is tested without sockets.
//! Each content-bearing `data:` event counts as one token arrival for inter-token latency
//! (servers usually send one token per event; when they batch, the gap is per event, which is
//! what a user sees). The final usage event gives the exact generated and cached counts.

use serde::Deserialize;

use kvroute_router::proxy::first_token::event_has_content;

/// Longest partial line kept; a longer line (no server sends one) is dropped.
const MAX_LINE: usize = 1 << 22;

/// Token arrivals and usage seen so far in one response.
#[derive(Debug, Default)]
pub struct StreamTally {
    partial: Vec<u8>,
    /// Offset (seconds from sending) of the first token event.
    pub first_token_s: Option<f64>,
    /// Offset of the latest token event.
    pub last_token_s: Option<f64>,
    /// Gaps between consecutive token events, seconds.
    pub gaps_s: Vec<f64>,
    /// Number of token events.
    pub token_events: u32,
    /// `usage.completion_tokens`, when reported.
    pub completion_tokens: Option<u32>,
    /// `usage.prompt_tokens_details.cached_tokens`, when reported.
    pub cached_tokens: Option<u32>,
    /// An `error` object the server sent inside the stream.
    pub stream_error: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    completion_tokens: Option<u32>,
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u32>,
}

impl StreamTally {
    /// Feeds a chunk of the body that arrived `at_s` seconds after sending.
    pub fn feed(&mut self, chunk: &[u8], at_s: f64) {
        let mut rest = chunk;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            let (line, tail) = rest.split_at(pos);
            rest = &tail[1..];
            if self.partial.is_empty() {
                self.line(line, at_s);
            } else {
                let mut full = std::mem::take(&mut self.partial);
                full.extend_from_slice(line);
                self.line(&full, at_s);
                // Reuse the allocation for the next partial line.
                full.clear();
                self.partial = full;
            }
        }
        if self.partial.len() + rest.len() <= MAX_LINE {
            self.partial.extend_from_slice(rest);
        } else {
            self.partial.clear();
        }
    }

    /// Reads a whole non-streamed JSON body (a server that ignored `stream: true`): its end is
    /// both the first and the last token.
    pub fn whole_body(&mut self, body: &[u8], at_s: f64) {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
            self.event(&v, at_s);
        }
    }

    fn line(&mut self, line: &[u8], at_s: f64) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data.is_empty() || data == b"[DONE]" {
            return;
        }
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
            self.event(&v, at_s);
        }
    }

    fn event(&mut self, v: &serde_json::Value, at_s: f64) {
        if event_has_content(v) {
            self.token(at_s);
        }
        if let Some(Ok(u)) = v
            .get("usage")
            .filter(|u| !u.is_null())
            .map(Usage::deserialize)
        {
            self.completion_tokens = u.completion_tokens.or(self.completion_tokens);
            if let Some(c) = u.prompt_tokens_details.and_then(|d| d.cached_tokens) {
                self.cached_tokens = Some(c);
            }
        }
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            let msg = e
                .get("message")
                .and_then(|m| m.as_str())
                .map_or_else(|| e.to_string(), str::to_string);
            self.stream_error = Some(msg);
        }
    }

    fn token(&mut self, at_s: f64) {
        if let Some(last) = self.last_token_s {
            self.gaps_s.push(at_s - last);
        } else {
            self.first_token_s = Some(at_s);
        }
        self.last_token_s = Some(at_s);
        self.token_events += 1;
    }

    /// Mean and 99th percentile of the gaps between token events.
    pub fn itl(&self) -> (Option<f64>, Option<f64>) {
        if self.gaps_s.is_empty() {
            return (None, None);
        }
        let mean = self.gaps_s.iter().sum::<f64>() / self.gaps_s.len() as f64;
        let mut sorted = self.gaps_s.clone();
        sorted.sort_by(f64::total_cmp);
        (
            Some(mean),
            Some(crate::report::stats::percentile(&sorted, 0.99)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_usage_and_split_lines() {
        let mut t = StreamTally::default();
        t.feed(
            b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"cho",
            0.1,
        );
        t.feed(b"ices\":[{\"text\":\"b\"}]}\n\n", 0.3);
        t.feed(b"data: {\"choices\":[{\"text\":\"c\"}]}\n\n", 0.4);
        t.feed(
            b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":512}}}\n\ndata: [DONE]\n\n",
            0.5,
        );
        assert_eq!(t.first_token_s, Some(0.1));
        assert_eq!(t.token_events, 3);
        assert_eq!(t.completion_tokens, Some(3));
        assert_eq!(t.cached_tokens, Some(512));
        let (mean, p99) = t.itl();
        assert!((mean.unwrap() - 0.15).abs() < 1e-9);
        assert!((p99.unwrap() - 0.2).abs() < 1e-9);
    }

    #[test]
    fn in_stream_error_is_kept() {
        let mut t = StreamTally::default();
        t.feed(b"data: {\"error\":{\"message\":\"boom\"}}\n", 0.0);
        assert_eq!(t.stream_error.as_deref(), Some("boom"));
        assert_eq!(t.token_events, 0);
    }
}
