//! Workloads as data: a `Trace` is a list of requests with arrival times, prompt and output
//! lengths and the ids of the prompt's blocks.
//!
//! Block ids are what make a trace useful for a KV-cache router: two requests that share their
//! first k ids share the first k × `block_tokens` prompt tokens, so they could share KV cache.
//! The ids carry no content (Mooncake anonymises prompts); `synthesis` turns them into tokens.
//!
//! The same `Trace` feeds the real-time replay (`bench`) and the virtual-time simulation
//! (`sim`), so every transform here is pure and keeps the trace sorted by arrival.
//!
//! Ordering: the parser accepts timestamps in any order and sorts the requests by arrival
//! (stable, so equal timestamps keep file order). Traces merged from several sources are
//! often slightly out of order, and replay only needs the order of arrivals, not of lines.
//! Negative or non-finite timestamps are rejected.

use std::hash::{Hash, Hasher};
use std::io::BufRead;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

/// Block size of the Mooncake traces, in tokens.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// One request of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRequest {
    /// Arrival time in seconds from the start of the trace.
    pub arrival_s: f64,
    /// Prompt length in tokens.
    pub input_tokens: u32,
    /// Number of tokens to generate.
    pub output_tokens: u32,
    /// Ids of the prompt's blocks of `block_tokens` tokens, in order; the last may be partial.
    /// Equal ids at the same position mean equal content.
    pub hash_ids: Vec<u64>,
    /// Tokens per block of `hash_ids`.
    pub block_tokens: u32,
    /// The session the request belongs to, when the trace names one (a line's `session_id`,
    /// or a sessions sidecar: [`super::sessions`]); sent as an affinity hint.
    pub session: Option<u64>,
}

/// A workload: requests sorted by arrival time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// The requests, by non-decreasing `arrival_s`.
    pub requests: Vec<TraceRequest>,
}

/// Why a trace could not be read.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// One line is not a valid request.
    #[error("trace line {line}: {reason}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A transform was given a parameter it cannot use.
    #[error("invalid trace transform: {0}")]
    Transform(String),
}

/// One Mooncake JSONL line, as written; unknown extra fields are ignored (other trace
/// producers add some). `block_size` is not Mooncake's (its traces are all 512 tokens per id):
/// traces kvroute records carry their engines' block size there.
#[derive(Deserialize)]
struct MooncakeLine {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
    block_size: Option<u32>,
    session_id: Option<serde_json::Value>,
}

impl Trace {
    /// A trace of `requests`, sorted by arrival (stable).
    pub fn new(mut requests: Vec<TraceRequest>) -> Trace {
        requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
        Trace { requests }
    }

    /// Reads a Mooncake JSONL file (`timestamp` ms, `input_length`, `output_length`,
    /// `hash_ids` of 512-token blocks, or of `block_size` tokens where a line says so, as
    /// `kvroute serve --record-trace` writes). Blank lines are skipped; unknown fields are
    /// ignored.
    pub fn from_mooncake_file(path: &Path) -> Result<Trace, TraceError> {
        let io = |source| TraceError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        Self::from_mooncake_reader(std::io::BufReader::new(file)).map_err(|e| match e {
            TraceError::Io { source, .. } => io(source),
            other => other,
        })
    }

    /// Reads Mooncake JSONL from a reader; see [`Trace::from_mooncake_file`].
    pub fn from_mooncake_reader(reader: impl BufRead) -> Result<Trace, TraceError> {
        Self::from_mooncake_with_sessions(reader, None)
    }

    /// [`Self::from_mooncake_reader`], the `k`-th non-empty line's session taken from
    /// `sessions[k]` when given (a line-aligned sidecar: [`super::sessions`]), before the
    /// requests are sorted by arrival.
    pub fn from_mooncake_with_sessions(
        reader: impl BufRead,
        sessions: Option<&[Option<u64>]>,
    ) -> Result<Trace, TraceError> {
        let mut requests = Vec::new();
        for (i, line) in reader.lines().enumerate() {
            let line = line.map_err(|source| TraceError::Io {
                path: "<reader>".to_string(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let mut request = parse_mooncake_line(&line, i + 1)?;
            if let Some(sessions) = sessions {
                request.session = sessions.get(requests.len()).copied().flatten();
            }
            requests.push(request);
        }
        Ok(Trace::new(requests))
    }

    /// Reads Mooncake JSONL from a string; see [`Trace::from_mooncake_file`].
    pub fn from_mooncake_str(text: &str) -> Result<Trace, TraceError> {
        Self::from_mooncake_reader(text.as_bytes())
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Whether the trace has no request.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Time from the first to the last arrival, in seconds.
    pub fn duration_s(&self) -> f64 {
        match (self.requests.first(), self.requests.last()) {
            (Some(a), Some(b)) => b.arrival_s - a.arrival_s,
            _ => 0.0,
        }
    }

    /// The requests arriving in `[start_s, end_s)`, re-based so the window starts at 0.
    pub fn window(&self, start_s: f64, end_s: f64) -> Result<Trace, TraceError> {
        if !(start_s.is_finite() && end_s.is_finite() && start_s >= 0.0 && end_s > start_s) {
            return Err(TraceError::Transform(format!(
                "window {start_s}:{end_s} must satisfy 0 <= start < end"
            )));
        }
        let requests = self
            .requests
            .iter()
            .filter(|r| r.arrival_s >= start_s && r.arrival_s < end_s)
            .map(|r| TraceRequest {
                arrival_s: r.arrival_s - start_s,
                ..r.clone()
            })
            .collect();
        Ok(Trace { requests })
    }

    /// The first `n` requests.
    pub fn head(&self, n: usize) -> Trace {
        Trace {
            requests: self.requests.iter().take(n).cloned().collect(),
        }
    }

    /// The same requests arriving `factor` times faster: every inter-arrival time is divided
    /// by `factor` (so arrival times, measured from the first request, are too).
    pub fn speed_up(&self, factor: f64) -> Result<Trace, TraceError> {
        if !(factor.is_finite() && factor > 0.0) {
            return Err(TraceError::Transform(format!(
                "speed-up factor {factor} must be a positive number"
            )));
        }
        let origin = self.requests.first().map_or(0.0, |r| r.arrival_s);
        let requests = self
            .requests
            .iter()
            .map(|r| TraceRequest {
                arrival_s: origin + (r.arrival_s - origin) / factor,
                ..r.clone()
            })
            .collect();
        Ok(Trace { requests })
    }

    /// The same requests, each arriving a uniform random time in `[0, seconds)` later (drawn
    /// from `seed`), re-sorted by arrival: requests that share one coarse timestamp no longer
    /// arrive at the same instant.
    pub fn jitter(&self, seconds: f64, seed: u64) -> Result<Trace, TraceError> {
        use rand::{Rng, SeedableRng};
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(TraceError::Transform(format!(
                "arrival jitter {seconds} must be a number of seconds >= 0"
            )));
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x6a69_7474_6572);
        let requests = self
            .requests
            .iter()
            .map(|r| TraceRequest {
                arrival_s: r.arrival_s + seconds * rng.random::<f64>(),
                ..r.clone()
            })
            .collect();
        Ok(Trace::new(requests))
    }

    /// Caps every prompt at `max_tokens`, keeping its exact prefix: the prompt is cut, and so
    /// are the block ids beyond it, so shared prefixes stay shared. A cut that falls inside a
    /// block keeps that block's id (its content is a prefix of the full block's content).
    pub fn cap_input(&self, max_tokens: u32) -> Result<Trace, TraceError> {
        if max_tokens == 0 {
            return Err(TraceError::Transform(
                "input-length cap must be at least 1 token".to_string(),
            ));
        }
        let requests = self
            .requests
            .iter()
            .map(|r| {
                if r.input_tokens <= max_tokens {
                    return r.clone();
                }
                let blocks = max_tokens.div_ceil(r.block_tokens.max(1)) as usize;
                TraceRequest {
                    input_tokens: max_tokens,
                    hash_ids: r.hash_ids.iter().take(blocks).copied().collect(),
                    ..r.clone()
                }
            })
            .collect();
        Ok(Trace { requests })
    }

    /// The same requests with blocks of `block_tokens` tokens, for traces written with another
    /// block size than Mooncake's 512 (ids keep their meaning; only their length changes).
    pub fn with_block_tokens(&self, block_tokens: u32) -> Result<Trace, TraceError> {
        if block_tokens == 0 {
            return Err(TraceError::Transform(
                "block size must be at least 1 token".to_string(),
            ));
        }
        let requests = self
            .requests
            .iter()
            .map(|r| TraceRequest {
                block_tokens,
                ..r.clone()
            })
            .collect();
        Ok(Trace { requests })
    }

    /// Total prompt tokens over all requests.
    pub fn total_input_tokens(&self) -> u64 {
        self.requests
            .iter()
            .map(|r| u64::from(r.input_tokens))
            .sum()
    }
}

/// Parses one Mooncake line; `line_no` is 1-based, for the error message.
fn parse_mooncake_line(text: &str, line_no: usize) -> Result<TraceRequest, TraceError> {
    let err = |reason: String| TraceError::Line {
        line: line_no,
        reason,
    };
    // serde's message names the missing or mistyped field and its column.
    let parsed: MooncakeLine = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
    if !parsed.timestamp.is_finite() || parsed.timestamp < 0.0 {
        return Err(err(format!(
            "timestamp {} must be a non-negative number of milliseconds",
            parsed.timestamp
        )));
    }
    if parsed.block_size == Some(0) {
        return Err(err("block_size must be at least 1 token".to_string()));
    }
    Ok(TraceRequest {
        arrival_s: parsed.timestamp / 1000.0,
        input_tokens: parsed.input_length,
        output_tokens: parsed.output_length,
        hash_ids: parsed.hash_ids,
        block_tokens: parsed.block_size.unwrap_or(MOONCAKE_BLOCK_TOKENS),
        session: parsed.session_id.as_ref().and_then(session_number),
    })
}

/// A session id as a number: an unsigned integer as itself, anything else (a string, a negative
/// or fractional number) hashed; `null` names no session.
pub fn session_number(v: &Value) -> Option<u64> {
    match v {
        Value::Null => None,
        Value::Number(n) if n.is_u64() => n.as_u64(),
        Value::String(s) if s.is_empty() => None,
        other => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            other.to_string().hash(&mut h);
            Some(h.finish())
        }
    }
}

/// The transforms a run applies to its trace, in this order: time window, first N requests,
/// faster arrivals, input-length cap. `bench` and `simulate` share them so that the same flags
/// mean the same workload in real and virtual time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Transforms {
    /// Keep requests arriving in `[start, end)` seconds.
    pub window: Option<(f64, f64)>,
    /// Keep the first N requests.
    pub max_requests: Option<usize>,
    /// Divide inter-arrival times by this factor.
    pub speed_up: Option<f64>,
    /// Cut inputs to at most this many tokens, keeping the exact prefix.
    pub max_input_tokens: Option<u32>,
    /// Delay each arrival by a uniform time in `[0, seconds)` drawn from `seed`.
    pub jitter: Option<(f64, u64)>,
}

impl Transforms {
    /// Applies the transforms to `trace`, describing each one at the end of `label`.
    pub fn apply(&self, mut trace: Trace, label: &mut String) -> Result<Trace, TraceError> {
        if let Some((a, b)) = self.window {
            trace = trace.window(a, b)?;
            label.push_str(&format!(", window {a}:{b} s"));
        }
        if let Some(n) = self.max_requests {
            trace = trace.head(n);
            label.push_str(&format!(", first {n}"));
        }
        if let Some(x) = self.speed_up {
            trace = trace.speed_up(x)?;
            label.push_str(&format!(", arrivals ×{x}"));
        }
        if let Some(n) = self.max_input_tokens {
            trace = trace.cap_input(n)?;
            label.push_str(&format!(", input cap {n}"));
        }
        if let Some((s, seed)) = self.jitter {
            trace = trace.jitter(s, seed)?;
            label.push_str(&format!(", arrivals jittered by up to {s} s"));
        }
        Ok(trace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_spreads_one_timestamp_and_keeps_every_request() {
        let t = Trace::from_mooncake_str(
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n\
             {\"timestamp\": 0, \"input_length\": 2, \"output_length\": 1, \"hash_ids\": [2]}\n\
             {\"timestamp\": 0, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [3]}\n",
        )
        .unwrap();
        let j = t.jitter(1.0, 7).unwrap();
        let at: Vec<f64> = j.requests.iter().map(|r| r.arrival_s).collect();
        assert_eq!(at.len(), 3);
        assert!(at.iter().all(|a| (0.0..1.0).contains(a)));
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}");
        assert_eq!(j.total_input_tokens(), 6);
        assert_eq!(t.jitter(1.0, 7).unwrap().requests, j.requests);
        assert!(t.jitter(-1.0, 7).is_err());
    }

    #[test]
    fn sorts_out_of_order_lines_stably() {
        let t = Trace::from_mooncake_str(
            "{\"timestamp\": 2000, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n\
             {\"timestamp\": 1000, \"input_length\": 2, \"output_length\": 1, \"hash_ids\": [2]}\n\
             {\"timestamp\": 1000, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [3]}\n",
        )
        .unwrap();
        let order: Vec<u32> = t.requests.iter().map(|r| r.input_tokens).collect();
        assert_eq!(order, vec![2, 3, 1]);
        assert_eq!(t.requests[0].arrival_s, 1.0);
    }

    #[test]
    fn a_line_may_name_its_block_size() {
        let t = Trace::from_mooncake_str(
            "{\"timestamp\": 0, \"input_length\": 20, \"output_length\": 1, \"hash_ids\": [1, 2], \"block_size\": 16}\n\
             {\"timestamp\": 1, \"input_length\": 20, \"output_length\": 1, \"hash_ids\": [1]}\n",
        )
        .unwrap();
        assert_eq!(t.requests[0].block_tokens, 16);
        assert_eq!(t.requests[1].block_tokens, MOONCAKE_BLOCK_TOKENS);
        let e = Trace::from_mooncake_str(
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [], \"block_size\": 0}",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("block_size"), "{e}");
    }

    #[test]
    fn extra_fields_are_ignored_but_missing_ones_named() {
        let ok = Trace::from_mooncake_str(
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [], \"x\": 1}",
        );
        assert_eq!(ok.unwrap().len(), 1);
        let e =
            Trace::from_mooncake_str("{\"timestamp\": 0, \"input_length\": 1, \"hash_ids\": []}")
                .unwrap_err()
                .to_string();
        assert!(e.contains("line 1") && e.contains("output_length"), "{e}");
    }
}
