//! Finding the first generated token in a response stream, and an in-band error event.
//!
//! TTFT is the number users feel, and the moment the router releases a request's queued
//! prefill from its load accounting. For a stream it is the first SSE `data:` event that
//! carries content (chat streams open with a role-only delta, which does not count); for a
//! plain JSON response it is the end of the body. An engine whose generation fails after the
//! 200 head ends the stream with an error event (`data: {"error": …}`; older vLLM sends
//! `{"object": "error", …}`): such a response is counted as an error, not a success. The
//! detector sees the bytes exactly as they pass through and keeps at most one partial line;
//! after the first token it only looks at lines that contain `"error"` (a quote inside a JSON
//! string is escaped, so generated text cannot contain those bytes).

use serde_json::Value;

/// Incremental detector of the first content-bearing SSE event and of error events.
#[derive(Debug, Default)]
pub struct FirstTokenDetector {
    partial: Vec<u8>,
    found: bool,
    error: bool,
    /// Inside a `data:` line too long to keep: it counts as content when it ends.
    oversized: bool,
}

/// Longest partial line kept while looking; a longer line is judged without the rest.
const MAX_LINE: usize = 1 << 20;

impl FirstTokenDetector {
    /// Whether the first token has been seen.
    pub fn found(&self) -> bool {
        self.found
    }

    /// Whether an error event has been seen.
    pub fn error_seen(&self) -> bool {
        self.error
    }

    /// Feeds the next chunk of the stream; returns true exactly once, on the chunk that
    /// completes the first content-bearing event.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        let was_found = self.found;
        let mut rest = chunk;
        if self.oversized {
            let Some(pos) = rest.iter().position(|&b| b == b'\n') else {
                return false;
            };
            rest = &rest[pos + 1..];
            self.oversized = false;
            self.found = true;
        }
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            let (line, tail) = rest.split_at(pos);
            rest = &tail[1..];
            if self.partial.is_empty() {
                self.judge(line);
            } else {
                self.partial.extend_from_slice(line);
                let full = std::mem::take(&mut self.partial);
                self.judge(&full);
                self.partial = full;
                self.partial.clear();
            }
            if self.found && self.error {
                break;
            }
        }
        if self.found && self.error {
            self.partial = Vec::new();
        } else if self.partial.len() + rest.len() <= MAX_LINE {
            self.partial.extend_from_slice(rest);
        } else {
            // A `data:` line longer than MAX_LINE is not kept whole; an event that large
            // carries content (a huge tool call or text), so it counts as the first token
            // when it ends.
            let line_start: Vec<u8> = self
                .partial
                .iter()
                .chain(rest.iter())
                .take(5)
                .copied()
                .collect();
            self.partial.clear();
            self.oversized = !self.found && line_start == b"data:";
        }
        !was_found && self.found
    }

    fn judge(&mut self, line: &[u8]) {
        if !self.found && line_has_content(line) {
            self.found = true;
        }
        if !self.error && line_is_error(line) {
            self.error = true;
        }
    }
}

/// Whether one SSE line is a `data:` event reporting an error (OpenAI's, SGLang's and vLLM's
/// `{"error": …}`, older vLLM's `{"object": "error", …}`, or the Responses API's
/// `{"type": "error", …}`).
fn line_is_error(line: &[u8]) -> bool {
    const NEEDLE: &[u8] = b"\"error\"";
    if !line.windows(NEEDLE.len()).any(|w| w == NEEDLE) {
        return false;
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Some(data) = line.strip_prefix(b"data:") else {
        return false;
    };
    match serde_json::from_slice::<Value>(data.trim_ascii()) {
        Ok(Value::Object(o)) => {
            o.contains_key("error")
                || o.get("object").and_then(Value::as_str) == Some("error")
                || o.get("type").and_then(Value::as_str) == Some("error")
        }
        _ => false,
    }
}

/// Whether one SSE line is a `data:` event with generated content.
fn line_has_content(line: &[u8]) -> bool {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Some(data) = line.strip_prefix(b"data:") else {
        return false;
    };
    let data = data.trim_ascii();
    if data.is_empty() || data == b"[DONE]" {
        return false;
    }
    match serde_json::from_slice::<Value>(data) {
        Ok(v) => event_has_content(&v),
        // Not JSON: some servers stream plain text; any payload is content.
        Err(_) => true,
    }
}

/// Whether a completion or chat chunk, or a Responses API stream event, carries a generated
/// token.
pub fn event_has_content(v: &Value) -> bool {
    if let Some(kind) = v.get("type").and_then(Value::as_str) {
        // Responses API: `response.output_text.delta`, `response.reasoning_text.delta`,
        // `response.function_call_arguments.delta`, … with a non-empty `delta`.
        return kind.starts_with("response.")
            && kind.ends_with(".delta")
            && v.get("delta").is_some_and(|d| match d {
                Value::String(s) => !s.is_empty(),
                Value::Null => false,
                _ => true,
            });
    }
    let Some(choices) = v.get("choices").and_then(Value::as_array) else {
        return false;
    };
    choices.iter().any(|c| {
        let non_empty = |x: Option<&Value>| match x {
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            _ => false,
        };
        if non_empty(c.get("text")) {
            return true;
        }
        let Some(d) = c.get("delta") else {
            return false;
        };
        non_empty(d.get("content"))
            || non_empty(d.get("reasoning_content"))
            || non_empty(d.get("reasoning"))
            || non_empty(d.get("tool_calls"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_only_chat_delta_is_not_a_token() {
        let mut d = FirstTokenDetector::default();
        assert!(!d.feed(
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
        ));
        assert!(d.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"));
        assert!(d.found());
        assert!(!d.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"more\"}}]}\n\n"));
    }

    #[test]
    fn event_split_across_chunks() {
        let mut d = FirstTokenDetector::default();
        assert!(!d.feed(b"data: {\"choices\":[{\"te"));
        assert!(!d.feed(b"xt\":\"hel"));
        assert!(d.feed(b"lo\"}]}\r\n\r\n"));
    }

    #[test]
    fn done_comments_and_usage_are_not_tokens() {
        let mut d = FirstTokenDetector::default();
        assert!(!d.feed(b": keep-alive\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n"));
        assert!(!d.found());
    }

    #[test]
    fn error_events_are_seen_before_and_after_the_first_token() {
        let mut d = FirstTokenDetector::default();
        assert!(d.feed(b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n"));
        // Generated text and logprobs may say "error": not an error event.
        assert!(!d.feed(b"data: {\"choices\":[{\"text\":\"\\\"error\\\"\",\"logprobs\":{\"tokens\":[\"error\"]}}]}\n\n"));
        assert!(!d.error_seen());
        // Split across chunks.
        assert!(!d.feed(b"data: {\"error\": {\"message\":\"engine"));
        assert!(!d.feed(b" died\"}}\n\n"));
        assert!(d.error_seen());

        let mut d = FirstTokenDetector::default();
        assert!(!d.feed(b"data: {\"object\":\"error\",\"message\":\"x\",\"code\":500}\n\n"));
        assert!(d.error_seen() && !d.found());
    }

    #[test]
    fn responses_stream_deltas_count_and_lifecycle_events_do_not() {
        let mut d = FirstTokenDetector::default();
        assert!(!d.feed(b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n"));
        assert!(!d.feed(b"data: {\"type\":\"response.output_text.delta\",\"delta\":\"\"}\n\n"));
        assert!(d.feed(b"data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n"));
        assert!(!d.feed(b"data: {\"type\":\"error\",\"code\":\"x\",\"message\":\"boom\"}\n\n"));
        assert!(d.error_seen());
    }

    #[test]
    fn reasoning_and_tool_calls_count() {
        for ev in [
            r#"{"choices":[{"delta":{"reasoning_content":"x"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#,
            r#"{"choices":[{"text":"a","index":0}]}"#,
        ] {
            let mut d = FirstTokenDetector::default();
            assert!(d.feed(format!("data: {ev}\n").as_bytes()), "{ev}");
        }
    }
}
