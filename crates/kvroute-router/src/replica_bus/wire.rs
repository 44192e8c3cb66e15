//! The replica bus's messages on the wire: one JSON object per NATS message, on one subject.
//!
//! ```json
//! {"replica":"router-0-12","seq":41,"kind":"booked","worker":"w1","rank":0,"request":7,"prompt_tokens":40,"prefill_tokens":24,"block_size":16,"hashes":"AQAAAAAAAAACAAAAAAAAAA=="}
//! {"replica":"router-0-12","seq":42,"kind":"first_token","worker":"w1","rank":0,"request":7}
//! {"replica":"router-0-12","seq":43,"kind":"freed","worker":"w1","rank":0,"request":7}
//! {"replica":"router-0-12","seq":44,"kind":"heartbeat"}
//! {"replica":"router-1-9","seq":0,"kind":"hello"}
//! {"replica":"router-1-9","seq":7,"kind":"hello","of":"router-0-12"}
//! {"replica":"router-0-12","seq":45,"kind":"snapshot","bookings":[{"worker":"w1","rank":0,"request":8,"prompt_tokens":900,"prefill_tokens":900,"first_token":false}]}
//! ```
//!
//! Why JSON: operators can read the bus with any NATS client (`nats sub 'kvroute.replicas'`)
//! and a newer replica's extra fields are ignored by an older one (rolling upgrades). A step
//! without hashes is about 150 bytes. A booking carries its prompt's chained block hashes
//! (`hashes`, of `block_size`-token blocks; [`crate::fleet::booking::PromptBlocks`]) as one
//! base64 string of their little-endian bytes: 10.7 bytes a block, where a JSON array of
//! numbers takes about 20. The other replicas touch their working sets with every block, so
//! all are sent (one mark in 16, as `fleet::running_blocks` keeps, would be a sixteenth of the
//! bytes but cannot say which blocks a placement evicts); at most
//! [`crate::fleet::booking::MAX_ANNOUNCED_BLOCKS`], under NATS's default 1 MiB payload. A
//! booking without them (an older replica, a load-only policy) applies as token counts.
//! Snapshots carry none: they list every live booking at once. `seq` numbers every message a replica sends
//! (from 0 at its start), so a receiver counts what it missed and asks for a snapshot.
//! `hello` (sent on every connect) asks every replica for a snapshot of its live bookings, or,
//! with `of`, only the replica a receiver missed messages of.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::fleet::booking::{MAX_ANNOUNCED_BLOCKS, PromptBlocks};
use crate::fleet::replica_ledger::LiveBooking;
use crate::fleet::{BookingNote, BookingStep, TargetKey};
use crate::tokens::BlockHash;

/// One message, with its sender and number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The sending replica's id.
    pub replica: String,
    /// The sender's message number.
    pub seq: u64,
    /// What it says.
    #[serde(flatten)]
    pub body: Body,
}

/// A request's target and number, as every step names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    /// The worker's id.
    pub worker: String,
    /// Its data-parallel rank.
    #[serde(default)]
    pub rank: u32,
    /// The sender's number for the request.
    pub request: u64,
}

/// A live booking in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Live {
    /// Target and number.
    #[serde(flatten)]
    pub at: Ref,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Predicted uncached prompt tokens.
    pub prefill_tokens: u64,
    /// Whether its first token came.
    pub first_token: bool,
}

/// What a message says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Body {
    /// A request was routed.
    Booked {
        /// Target and number.
        #[serde(flatten)]
        at: Ref,
        /// Prompt tokens.
        prompt_tokens: u64,
        /// Predicted uncached prompt tokens.
        prefill_tokens: u64,
        /// Tokens per block of `hashes` (absent without them).
        #[serde(default, skip_serializing_if = "is_zero")]
        block_size: u32,
        /// The prompt's chained block hashes (absent when the decision did not hash it).
        #[serde(default, skip_serializing_if = "Hashes::is_empty")]
        hashes: Hashes,
    },
    /// A request's first token came.
    FirstToken {
        /// Target and number.
        #[serde(flatten)]
        at: Ref,
    },
    /// A request ended.
    Freed {
        /// Target and number.
        #[serde(flatten)]
        at: Ref,
    },
    /// The sender is alive.
    Heartbeat,
    /// Asks for snapshots: from every replica (sent on every connect), or from the one named
    /// by `of` (a receiver found a gap in its numbers).
    Hello {
        /// The replica asked, or all.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        of: Option<String>,
    },
    /// Every live booking of the sender: replaces what receivers hold for it.
    Snapshot {
        /// The bookings.
        bookings: Vec<Live>,
    },
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Block hashes on the wire: one base64 string of their little-endian bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hashes(pub Arc<[BlockHash]>);

impl Hashes {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Hashes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = self.0.iter().flat_map(|h| h.0.to_le_bytes()).collect();
        s.serialize_str(&STANDARD.encode(bytes))
    }
}

impl<'de> Deserialize<'de> for Hashes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Hashes, D::Error> {
        use serde::de::Error;
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let bytes = STANDARD.decode(text.as_bytes()).map_err(D::Error::custom)?;
        if bytes.len() % 8 != 0 {
            return Err(D::Error::custom(format!(
                "hashes: {} bytes, not a whole number of 8-byte hashes",
                bytes.len()
            )));
        }
        Ok(Hashes(
            bytes
                .chunks_exact(8)
                .take(MAX_ANNOUNCED_BLOCKS)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    BlockHash(u64::from_le_bytes(b))
                })
                .collect(),
        ))
    }
}

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
#[error("undecodable replica bus message: {0}")]
pub struct WireError(#[from] serde_json::Error);

impl Envelope {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a message.
    pub fn decode(bytes: &[u8]) -> Result<Envelope, WireError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

fn at(target: &TargetKey, request: u64) -> Ref {
    Ref {
        worker: target.worker.to_string(),
        rank: target.rank,
        request,
    }
}

impl Ref {
    /// The target it names.
    pub fn target(&self) -> TargetKey {
        TargetKey {
            worker: self.worker.as_str().into(),
            rank: self.rank,
        }
    }
}

impl Body {
    /// The message announcing `note`.
    pub fn of_note(note: &BookingNote) -> Body {
        let at = at(&note.target, note.request);
        match &note.step {
            BookingStep::Booked {
                prompt_tokens,
                prefill_tokens,
                blocks,
            } => Body::Booked {
                at,
                prompt_tokens: *prompt_tokens,
                prefill_tokens: *prefill_tokens,
                block_size: blocks.block_size,
                hashes: Hashes(Arc::clone(&blocks.hashes)),
            },
            BookingStep::FirstToken => Body::FirstToken { at },
            BookingStep::Freed => Body::Freed { at },
        }
    }

    /// The announcement a booking step message carries, if it is one.
    pub fn note(&self) -> Option<BookingNote> {
        let (at, step) = match self {
            Body::Booked {
                at,
                prompt_tokens,
                prefill_tokens,
                block_size,
                hashes,
            } => (
                at,
                BookingStep::Booked {
                    prompt_tokens: *prompt_tokens,
                    prefill_tokens: *prefill_tokens,
                    // Hashes without a block size cannot be counted in tokens: token counts
                    // alone, as from an older replica.
                    blocks: if *block_size == 0 {
                        PromptBlocks::default()
                    } else {
                        PromptBlocks {
                            hashes: Arc::clone(&hashes.0),
                            block_size: *block_size,
                        }
                    },
                },
            ),
            Body::FirstToken { at } => (at, BookingStep::FirstToken),
            Body::Freed { at } => (at, BookingStep::Freed),
            _ => return None,
        };
        Some(BookingNote {
            target: at.target(),
            request: at.request,
            step,
        })
    }

    /// A snapshot of `live`.
    pub fn snapshot(live: &[LiveBooking]) -> Body {
        Body::Snapshot {
            bookings: live
                .iter()
                .map(|b| Live {
                    at: at(&b.target, b.request),
                    prompt_tokens: b.prompt_tokens,
                    prefill_tokens: b.prefill_tokens,
                    first_token: b.first_token,
                })
                .collect(),
        }
    }
}

/// The bookings a snapshot lists.
pub fn live_bookings(bookings: &[Live]) -> Vec<LiveBooking> {
    bookings
        .iter()
        .map(|b| LiveBooking {
            request: b.at.request,
            target: b.at.target(),
            prompt_tokens: b.prompt_tokens,
            prefill_tokens: b.prefill_tokens,
            first_token: b.first_token,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_reads_back_as_written_and_in_the_documented_shape() {
        let note = BookingNote {
            target: TargetKey {
                worker: "w1".into(),
                rank: 0,
            },
            request: 7,
            step: BookingStep::Booked {
                prompt_tokens: 40,
                prefill_tokens: 24,
                blocks: PromptBlocks::of(&[BlockHash(1), BlockHash(2)], 16),
            },
        };
        let e = Envelope {
            replica: "router-0-12".into(),
            seq: 41,
            body: Body::of_note(&note),
        };
        let text = String::from_utf8(e.encode()).unwrap();
        assert_eq!(
            text,
            r#"{"replica":"router-0-12","seq":41,"kind":"booked","worker":"w1","rank":0,"request":7,"prompt_tokens":40,"prefill_tokens":24,"block_size":16,"hashes":"AQAAAAAAAAACAAAAAAAAAA=="}"#
        );
        let back = Envelope::decode(text.as_bytes()).unwrap();
        assert_eq!(back, e);
        assert_eq!(back.body.note(), Some(note));
        let live = [LiveBooking {
            request: 8,
            target: TargetKey {
                worker: "w1".into(),
                rank: 3,
            },
            prompt_tokens: 900,
            prefill_tokens: 900,
            first_token: true,
        }];
        for body in [
            Body::Heartbeat,
            Body::Hello { of: None },
            Body::Hello {
                of: Some("x".into()),
            },
            Body::snapshot(&live),
        ] {
            let e = Envelope {
                replica: "r".into(),
                seq: 1,
                body,
            };
            assert_eq!(Envelope::decode(&e.encode()).unwrap(), e);
        }
        let Body::Snapshot { bookings } = Body::snapshot(&live) else {
            unreachable!()
        };
        assert_eq!(live_bookings(&bookings), live);
    }

    #[test]
    fn a_booking_without_hashes_applies_as_token_counts_and_bad_hashes_are_an_error() {
        let old = br#"{"replica":"r","seq":1,"kind":"booked","worker":"w1","request":7,"prompt_tokens":8000,"prefill_tokens":2048}"#;
        let note = Envelope::decode(old).unwrap().body.note().unwrap();
        assert_eq!(
            note.step,
            BookingStep::Booked {
                prompt_tokens: 8000,
                prefill_tokens: 2048,
                blocks: PromptBlocks::default(),
            }
        );
        // Hashes without a block size cannot be counted: token counts alone.
        let sizeless = br#"{"replica":"r","seq":1,"kind":"booked","worker":"w1","request":7,"prompt_tokens":40,"prefill_tokens":40,"hashes":"AQAAAAAAAAA="}"#;
        let note = Envelope::decode(sizeless).unwrap().body.note().unwrap();
        assert!(
            matches!(note.step, BookingStep::Booked { blocks, .. } if blocks.hashes.is_empty())
        );
        // Not base64, or not whole 8-byte hashes: the message is unreadable.
        for hashes in ["not base64!", "AQAA"] {
            let text = format!(
                r#"{{"replica":"r","seq":1,"kind":"booked","worker":"w1","request":7,"prompt_tokens":40,"prefill_tokens":40,"block_size":16,"hashes":"{hashes}"}}"#
            );
            assert!(Envelope::decode(text.as_bytes()).is_err(), "{hashes}");
        }
    }

    #[test]
    fn unknown_fields_are_ignored_and_garbage_is_an_error() {
        let e =
            Envelope::decode(br#"{"replica":"r","seq":1,"kind":"heartbeat","load":3}"#).unwrap();
        assert_eq!(e.body, Body::Heartbeat);
        assert!(Envelope::decode(b"not json").is_err());
        assert!(Envelope::decode(br#"{"replica":"r","seq":1,"kind":"nope"}"#).is_err());
    }
}
