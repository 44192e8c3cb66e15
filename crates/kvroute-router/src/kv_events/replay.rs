//! The replay client: ask a publisher's ROUTER socket for the batches we missed.
//!
//! Protocol (vLLM and SGLang): a DEALER sends `["", start_seq (8 bytes BE)]`; the ROUTER answers
//! one message per buffered batch with `seq >= start_seq`, `["", seq, payload]` (vLLM < 0.26) or
//! `["", topic, seq, payload]` (vLLM ≥ 0.26, SGLang ≥ 0.5.22), then a final one whose seq is -1.
//! Start sequence 0 asks for everything the publisher still buffers (the oldest retained first).
//! A fresh DEALER per replay: a timed-out request leaves stale replies queued on its socket,
//! which must not be mistaken for the answer to the next request.
//!
//! A [`ReplayRun`] is one request in flight, read without blocking from the subscriber's poll
//! loop, so live events keep arriving (the subscriber holds them) while it runs. It is bounded
//! ([`ReplayLimits`]): a peer that keeps answering and never sends the end marker cannot hold
//! the subscriber or grow its memory without limit.

use std::time::{Duration, Instant};

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
    /// A bound of [`ReplayLimits`] was reached before the end marker: the replay is abandoned.
    #[error("abandoned: {0}")]
    Abandoned(ReplayBound),
    /// The replay ended without every batch that was asked for (the publisher no longer
    /// buffers them).
    #[error("returned {got} of {wanted} batches")]
    Incomplete {
        /// Batches of the asked range returned.
        got: usize,
        /// Batches asked for.
        wanted: u64,
    },
    /// The connection to the publisher dropped while the replay ran.
    #[error("the publisher disconnected")]
    Disconnected,
}

/// Which bound of [`ReplayLimits`] ended a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ReplayBound {
    /// More replies (duplicates included) than `max_batches`.
    #[error("more than {0} replies")]
    Replies(usize),
    /// More bytes (replies plus live batches held meanwhile) than `max_bytes`.
    #[error("more than {0} bytes")]
    Bytes(usize),
    /// More live batches held meanwhile than `max_batches`.
    #[error("more than {0} live batches held")]
    Held(usize),
    /// Longer than `max_duration`.
    #[error("longer than {0:?}")]
    Duration(Duration),
}

/// Bounds of one replay. A replay that reaches one is abandoned: what it returned is dropped
/// (the worker's entries are cleared if it was filling a gap) and the live batches held
/// meanwhile are applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayLimits {
    /// Most replies read (vLLM buffers 10,000 batches by default) and most live batches held.
    pub max_batches: usize,
    /// Most payload bytes held: replies plus the live batches held meanwhile.
    pub max_bytes: usize,
    /// Longest a replay may run, from request to end marker.
    pub max_duration: Duration,
}

impl Default for ReplayLimits {
    /// 100,000 replies (10× vLLM's default buffer), 256 MiB, 15 s in all.
    fn default() -> Self {
        ReplayLimits {
            max_batches: 100_000,
            max_bytes: 256 << 20,
            max_duration: Duration::from_secs(15),
        }
    }
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

/// Replies read per call of [`ReplayRun::read`], so a peer that floods replies cannot keep the
/// subscriber from reading its live socket.
const READ_BURST: usize = 256;

/// One replay request in flight.
pub(crate) struct ReplayRun {
    dealer: zmq::Socket,
    start: u64,
    limits: ReplayLimits,
    reply_timeout: Duration,
    started: Instant,
    last_reply: Instant,
    replies: usize,
    bytes: usize,
    /// Replies at or after `start`, strictly increasing (duplicates and stragglers dropped).
    got: Vec<Replayed>,
    duplicates: u64,
}

impl ReplayRun {
    /// Sends the request for every buffered batch from `start`; waits at most `reply_timeout`
    /// for each reply.
    pub(crate) fn request(
        ctx: &zmq::Context,
        endpoint: &str,
        start: u64,
        limits: ReplayLimits,
        reply_timeout: Duration,
        now: Instant,
    ) -> Result<ReplayRun, ReplayError> {
        let dealer = ctx.socket(zmq::DEALER)?;
        dealer.set_linger(0)?;
        dealer.set_rcvhwm(0)?;
        dealer.connect(endpoint)?;
        dealer.send_multipart([&b""[..], &start.to_be_bytes()[..]], zmq::DONTWAIT)?;
        Ok(ReplayRun {
            dealer,
            start,
            limits,
            reply_timeout,
            started: now,
            last_reply: now,
            replies: 0,
            bytes: 0,
            got: Vec::new(),
            duplicates: 0,
        })
    }

    /// The socket to poll for replies.
    pub(crate) fn socket(&self) -> &zmq::Socket {
        &self.dealer
    }

    /// Replies that repeated or preceded one already received (dropped).
    pub(crate) fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Reads the replies that are waiting, without blocking. `Some(Ok(batches))` once the end
    /// marker arrived, `Some(Err(_))` when the replay failed or reached a bound (`held_bytes`:
    /// what the caller holds meanwhile, counted against `max_bytes`), `None` to go on.
    pub(crate) fn read(
        &mut self,
        held_bytes: usize,
        now: Instant,
    ) -> Option<Result<Vec<Replayed>, ReplayError>> {
        for _ in 0..READ_BURST {
            let frames = match self.dealer.recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => frames,
                Err(zmq::Error::EAGAIN) => break,
                Err(e) => return Some(Err(e.into())),
            };
            self.last_reply = now;
            let reply = match parse_reply(frames) {
                Ok(Some(reply)) => reply,
                Ok(None) => return Some(Ok(std::mem::take(&mut self.got))),
                Err(e) => return Some(Err(e)),
            };
            self.replies += 1;
            if self.replies > self.limits.max_batches {
                return Some(Err(ReplayError::Abandoned(ReplayBound::Replies(
                    self.limits.max_batches,
                ))));
            }
            let fresh =
                reply.seq >= self.start && self.got.last().is_none_or(|last| reply.seq > last.seq);
            if !fresh {
                self.duplicates += 1;
                continue;
            }
            self.bytes += reply.payload.len();
            if self.bytes + held_bytes > self.limits.max_bytes {
                return Some(Err(ReplayError::Abandoned(ReplayBound::Bytes(
                    self.limits.max_bytes,
                ))));
            }
            self.got.push(reply);
        }
        self.check_time(now).map(Err)
    }

    /// The error if the replay ran out of time (in all, or waiting for the next reply).
    pub(crate) fn check_time(&self, now: Instant) -> Option<ReplayError> {
        if now.duration_since(self.started) >= self.limits.max_duration {
            return Some(ReplayError::Abandoned(ReplayBound::Duration(
                self.limits.max_duration,
            )));
        }
        if now.duration_since(self.last_reply) >= self.reply_timeout {
            return Some(ReplayError::Timeout(self.reply_timeout));
        }
        None
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
