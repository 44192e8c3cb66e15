//! One recorded request as a Mooncake JSONL line.
//!
//! The fields are Mooncake's — `timestamp` (ms), `input_length`, `output_length`, `hash_ids` —
//! so any Mooncake reader takes the file, plus `block_size`: the tokens per id, which
//! Mooncake's own traces fix at 512 and which here is the engine's KV block size. Readers
//! ignore unknown fields (`kvroute simulate` reads `block_size` when present).
//!
//! `hash_ids` covers the whole prompt, `ceil(input_length / block_size)` ids as in Mooncake's
//! traces: one per full block, then a fresh id for a partial last block (see
//! [`BlockIds::tail`]).

use std::fmt::Write as _;
use std::time::Duration;

use super::ids::BlockIds;
use crate::tokens::BlockHash;

/// A routed request, as the recorder writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Arrival, from the recorder's start.
    pub arrival: Duration,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens, as observed in the response.
    pub output_tokens: u64,
    /// kvroute's chained hashes of the prompt's full blocks.
    pub hashes: Vec<BlockHash>,
    /// Tokens per block (the engine's KV block size).
    pub block_size: u32,
}

/// `record` as one line (with its newline); `seq` numbers the request, for its tail id.
pub fn mooncake_line(record: &Record, ids: &BlockIds, seq: u64) -> String {
    let mut out = String::with_capacity(96 + record.hashes.len() * 17);
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "{{\"timestamp\":{},\"input_length\":{},\"output_length\":{},\"hash_ids\":[",
        record.arrival.as_millis(),
        record.input_tokens.min(u64::from(u32::MAX)),
        record.output_tokens.min(u64::from(u32::MAX)),
    );
    for (i, h) in record.hashes.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{}", ids.id(*h));
    }
    let full = record.hashes.len() as u64 * u64::from(record.block_size);
    if record.input_tokens > full {
        if !record.hashes.is_empty() {
            out.push(',');
        }
        let _ = write!(out, "{}", ids.tail(seq));
    }
    let _ = writeln!(out, "],\"block_size\":{}}}", record.block_size);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(input_tokens: u64, hashes: &[u64]) -> Record {
        Record {
            arrival: Duration::from_micros(1_234_567),
            input_tokens,
            output_tokens: 9,
            hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
            block_size: 16,
        }
    }

    fn parse(line: &str) -> serde_json::Value {
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line}"
        );
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn a_line_covers_every_block_and_a_partial_tail() {
        let ids = BlockIds::random();
        let v = parse(&mooncake_line(&record(40, &[1, 2]), &ids, 0));
        assert_eq!(v["timestamp"], 1234);
        assert_eq!(v["input_length"], 40);
        assert_eq!(v["output_length"], 9);
        assert_eq!(v["block_size"], 16);
        let h = v["hash_ids"].as_array().unwrap();
        assert_eq!(h.len(), 3, "ceil(40 / 16) ids");
        assert_eq!(h[0], ids.id(BlockHash(1)));
        assert_eq!(h[1], ids.id(BlockHash(2)));
        assert_eq!(h[2], ids.tail(0));

        let exact = parse(&mooncake_line(&record(32, &[1, 2]), &ids, 1));
        assert_eq!(exact["hash_ids"].as_array().unwrap().len(), 2);
        let short = parse(&mooncake_line(&record(5, &[]), &ids, 2));
        assert_eq!(short["hash_ids"].as_array().unwrap().len(), 1);
        let empty = parse(&mooncake_line(&record(0, &[]), &ids, 3));
        assert!(empty["hash_ids"].as_array().unwrap().is_empty());
    }
}
