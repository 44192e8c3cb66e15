//! The replay client: ask a publisher's ROUTER socket for the batches we missed.
//!
//! Protocol (vLLM and SGLang): a DEALER sends `["", start_seq (8 bytes BE)]`; the ROUTER answers
//! one message per buffered batch with `seq >= start_seq`, `["", seq, payload]` (vLLM < 0.26) or
//! `["", topic, seq, payload]` (vLLM ≥ 0.26, SGLang ≥ 0.5.22), then a final one whose seq is -1.
//! A fresh DEALER per replay: a timed-out request leaves stale replies queued on its socket,
//! which must not be mistaken for the answer to the next request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use thiserror::Error;

/// Why a replay did not complete.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReplayError {
    /// A ZeroMQ call failed.
    #[error("zmq: {0}")]
    Zmq(#[from] zmq::Error),
    /// No reply (or no end marker) arrived within the timeout.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// A reply did not have the documented frames.
    #[error("malformed reply with {0} frames")]
    Malformed(usize),
    /// The subscriber was asked to stop.
    #[error("stopped")]
    Stopped,
}

/// One buffered batch as the publisher replays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// Its sequence number.
    pub seq: u64,
    /// The msgpack payload.
    pub payload: Vec<u8>,
}

/// The sequence number of a reply, or `None` for the end marker; `Err` if malformed.
/// The sequence is frame 1 of `["", seq, payload]` and frame 2 of `["", topic, seq, payload]`.
pub(crate) fn parse_reply(mut frames: Vec<Vec<u8>>) -> Result<Option<Replayed>, ReplayError> {
    let n = frames.len();
    if frames.first().is_some_and(Vec::is_empty) {
        frames.remove(0);
    }
    let (seq, payload) = match frames.len() {
        2 | 3 => {
            let payload = frames.pop().unwrap_or_default();
            let seq = frames.pop().unwrap_or_default();
            (seq, payload)
        }
        _ => return Err(ReplayError::Malformed(n)),
    };
    let seq: [u8; 8] = seq.try_into().map_err(|_| ReplayError::Malformed(n))?;
    let seq = i64::from_be_bytes(seq);
    if seq < 0 {
        return Ok(None);
    }
    Ok(Some(Replayed {
        seq: seq as u64,
        payload,
    }))
}

/// Requests every buffered batch from `start` and returns those before `until`, in the order
/// received. Waits at most `timeout` for each reply; checks `stop` between replies.
pub(crate) fn fetch(
    ctx: &zmq::Context,
    endpoint: &str,
    start: u64,
    until: u64,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<Vec<Replayed>, ReplayError> {
    let dealer = ctx.socket(zmq::DEALER)?;
    dealer.set_linger(0)?;
    dealer.set_rcvhwm(0)?;
    dealer.connect(endpoint)?;
    dealer.send_multipart([&b""[..], &start.to_be_bytes()[..]], 0)?;
    let slice = Duration::from_millis(50).min(timeout);
    let mut out = Vec::new();
    loop {
        let mut waited = Duration::ZERO;
        while dealer.poll(zmq::POLLIN, slice.as_millis() as i64)? == 0 {
            if stop.load(Ordering::Relaxed) {
                return Err(ReplayError::Stopped);
            }
            waited += slice;
            if waited >= timeout {
                return Err(ReplayError::Timeout(timeout));
            }
        }
        match parse_reply(dealer.recv_multipart(0)?)? {
            None => return Ok(out),
            Some(r) if r.seq >= start && r.seq < until => out.push(r),
            // Later batches also arrive live; the subscriber holds the one that triggered us.
            Some(_) => {}
        }
    }
}

/// Whether `got` is exactly the contiguous run `from..until`.
pub(crate) fn covers(got: &[Replayed], from: u64, until: u64) -> bool {
    got.len() as u64 == until.saturating_sub(from)
        && got.iter().zip(from..).all(|(r, want)| r.seq == want)
}

/// The longest contiguous tail of `got` that ends at `until - 1` (a suffix of history, safe to
/// apply to an empty index).
pub(crate) fn tail_ending_at(got: &[Replayed], until: u64) -> &[Replayed] {
    let mut start = got.len();
    let mut want = until;
    while start > 0 && want > 0 && got[start - 1].seq == want - 1 {
        start -= 1;
        want -= 1;
    }
    &got[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(seq: u64) -> Replayed {
        Replayed {
            seq,
            payload: vec![],
        }
    }

    #[test]
    fn parses_both_reply_shapes_and_the_end_marker() {
        let seq = 5u64.to_be_bytes().to_vec();
        let old = parse_reply(vec![vec![], seq.clone(), b"p".to_vec()]).unwrap();
        assert_eq!(
            old,
            Some(Replayed {
                seq: 5,
                payload: b"p".to_vec()
            })
        );
        let new = parse_reply(vec![vec![], b"kv-events".to_vec(), seq, b"p".to_vec()]).unwrap();
        assert_eq!(new.map(|r| r.seq), Some(5));
        let end = parse_reply(vec![vec![], (-1i64).to_be_bytes().to_vec(), vec![]]).unwrap();
        assert_eq!(end, None);
        assert!(parse_reply(vec![vec![], b"short".to_vec(), vec![]]).is_err());
        assert!(parse_reply(vec![vec![]]).is_err());
    }

    #[test]
    fn coverage_and_tails() {
        assert!(covers(&[r(2), r(3)], 2, 4));
        assert!(!covers(&[r(3)], 2, 4));
        assert!(covers(&[], 4, 4));
        let got = [r(1), r(3), r(4)];
        assert_eq!(tail_ending_at(&got, 5).len(), 2);
        assert_eq!(tail_ending_at(&got, 6).len(), 0);
    }
}
