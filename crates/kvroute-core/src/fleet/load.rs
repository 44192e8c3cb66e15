//! Router-side load accounting per worker.
//!
//! The router knows what it sent before the engine reports anything: a request counts as
//! *queued prefill* from the moment it is routed until its first token, then as *decoding* until
//! it ends. A [`LoadGuard`] is the only way to change these counters and releases whatever is
//! still held when it is dropped, so an error, a retry or a client that hangs up can never
//! leak load (a leaked count would steer traffic away from a worker forever).
//!
//! With several router replicas the counters are only this replica's share: the last reading
//! of the engine's own load ([`Load::set_reading`]) adds the others' ([`Load::view`], see
//! [`super::load_view`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::booking::{Announcer, BookingStep, PromptBlocks, Ticket};
use super::decode_ages::{DecodeAges, DecodeStarts};
use super::load_view::{Admissions, EngineLoad, LoadSnapshot, Reading, combine};
use super::running_blocks::{RunningBlocks, marks};
use super::tenancy::{Occupancy, Tenancy};
use crate::tokens::BlockHash;

/// Live load counters of one worker.
#[derive(Debug, Default)]
pub struct Load {
    in_flight: AtomicU64,
    queued_prefill_tokens: AtomicU64,
    decoding: AtomicU64,
    active_prompt_tokens: AtomicU64,
    /// Requests admitted here, this replica's and (with a replica bus) other replicas'.
    admitted: AtomicU64,
    admitted_prefill_tokens: AtomicU64,
    admitted_prompt_tokens: AtomicU64,
    /// Requests that ended here, ever (with `admitted`, what may still be in an engine's
    /// lagging counts).
    finished: AtomicU64,
    /// `finished` when the engine was last asked for its load.
    finished_at_ask: AtomicU64,
    reading: Mutex<Option<(Reading, Option<Instant>)>>,
    /// The KV blocks of the requests in flight, shared prefixes once.
    running: Mutex<RunningBlocks>,
    /// When the requests decoding here reached their first token, where that is known.
    decode_starts: Mutex<DecodeStarts>,
    /// Where this replica announces what it books here, with a replica bus.
    announcer: OnceLock<Announcer>,
    /// This router's requests in flight here per tenant (placement isolation).
    tenancy: Arc<Tenancy>,
}

impl Load {
    /// Reads the counters.
    pub fn snapshot(&self) -> LoadSnapshot {
        LoadSnapshot {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            queued_prefill_tokens: self.queued_prefill_tokens.load(Ordering::Relaxed),
            decoding: self.decoding.load(Ordering::Relaxed),
            active_prompt_tokens: self.active_prompt_tokens.load(Ordering::Relaxed),
            admitted: self.admitted.load(Ordering::Relaxed),
            unseen_in_flight: 0,
        }
    }

    /// The load a routing decision weighs: this router's counters plus, when the engine's
    /// load was read, the requests other router replicas have there. Exactly
    /// [`Load::snapshot`] without a reading.
    pub fn view(&self) -> LoadSnapshot {
        let own = self.snapshot();
        let reading = self.reading();
        combine(own, reading.as_ref(), self.admissions())
    }

    /// Totals of every request admitted here (they price other replicas' requests).
    pub fn admissions(&self) -> Admissions {
        Admissions {
            requests: self.admitted.load(Ordering::Relaxed),
            prefill_tokens: self.admitted_prefill_tokens.load(Ordering::Relaxed),
            prompt_tokens: self.admitted_prompt_tokens.load(Ordering::Relaxed),
        }
    }

    /// Records a reading of the engine's own load; `own` is [`Load::snapshot`] taken when the
    /// engine was asked, `at` when (for the reading's age; the simulator passes `None`).
    pub fn set_reading(&self, engine: EngineLoad, own: LoadSnapshot, at: Option<Instant>) {
        let mut held = self.lock_reading();
        let reading = Reading::after(held.as_ref().map(|(r, _)| r), engine, own);
        *held = Some((reading, at));
    }

    /// Requests that ended since the engine was last asked, marking now as the last ask.
    pub fn finished_since_last_ask(&self) -> u64 {
        let now = self.finished.load(Ordering::Relaxed);
        now.saturating_sub(self.finished_at_ask.swap(now, Ordering::Relaxed))
    }

    /// Forgets the reading (too old, or the engine stopped answering): the view falls back to
    /// this router's own counters.
    pub fn clear_reading(&self) {
        *self.lock_reading() = None;
    }

    /// The last reading, if any.
    pub fn reading(&self) -> Option<Reading> {
        self.lock_reading().as_ref().map(|(r, _)| *r)
    }

    /// When the last reading was taken, if one is held and was timed.
    pub fn reading_taken(&self) -> Option<Instant> {
        self.lock_reading().as_ref().and_then(|(_, at)| *at)
    }

    fn lock_reading(&self) -> std::sync::MutexGuard<'_, Option<(Reading, Option<Instant>)>> {
        self.reading.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, RunningBlocks> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_decode_starts(&self) -> std::sync::MutexGuard<'_, DecodeStarts> {
        self.decode_starts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long, at `now` on the decider's clock, the requests decoding here whose first
    /// token time is known have been decoding, added up (without walking them).
    pub fn decoded_s(&self, now: Duration) -> f64 {
        self.lock_decode_starts().decoded_s(now)
    }

    /// How long, at `now` on the decider's clock, the requests decoding here whose first
    /// token time is known have been decoding ([`LoadGuard::first_token_at`]).
    pub fn decode_ages(&self, now: Duration) -> DecodeAges {
        self.lock_decode_starts().ages(now)
    }

    /// This router's requests in flight here per tenant.
    pub fn tenancy(&self) -> &Arc<Tenancy> {
        &self.tenancy
    }

    /// Tokens the requests in flight here hold in the KV cache (shared prefixes once), and how
    /// many leading blocks of `hashes` they already hold.
    pub fn running(&self, hashes: &[BlockHash], block_size: u32) -> (u64, usize) {
        let (tokens, held, _) = self.running_sharing(hashes, block_size, 0);
        (tokens, held)
    }

    /// [`Load::running`], and how many of those requests hold the first `warm` blocks of
    /// `hashes` ([`RunningBlocks::sharing`]), read under one lock: a decision asks every
    /// candidate.
    pub fn running_sharing(
        &self,
        hashes: &[BlockHash],
        block_size: u32,
        warm: usize,
    ) -> (u64, usize, u32) {
        let running = self.lock_running();
        (
            running.tokens(block_size),
            running.held_prefix(hashes),
            running.sharing(hashes, warm),
        )
    }

    /// From now on, every request admitted here is announced through `announcer` (once: a
    /// later call changes nothing and returns false).
    pub fn announce_to(&self, announcer: Announcer) -> bool {
        self.announcer.set(announcer).is_ok()
    }

    /// Whether admissions here are announced.
    pub fn is_announced(&self) -> bool {
        self.announcer.get().is_some()
    }

    /// Counts a request of `prompt_tokens` routed here with `prefill_tokens` of them still to
    /// compute (the rest is expected from the worker's prefix cache), and announces it to the
    /// other router replicas when a bus is attached.
    pub fn admit(self: &Arc<Self>, prompt_tokens: u64, prefill_tokens: u64) -> LoadGuard {
        self.admit_holding(prompt_tokens, prefill_tokens, &[], 0)
    }

    /// [`Load::admit`] for a prompt whose chained block hashes (of `block_size`-token blocks)
    /// are known: its prefix counts once among the running requests' ([`RunningBlocks`]).
    pub fn admit_holding(
        self: &Arc<Self>,
        prompt_tokens: u64,
        prefill_tokens: u64,
        hashes: &[BlockHash],
        block_size: u32,
    ) -> LoadGuard {
        let mut guard = self.count(prompt_tokens, prefill_tokens, marks(hashes), block_size);
        guard.ticket = self.announcer.get().map(|a| {
            a.book(
                prompt_tokens,
                prefill_tokens,
                PromptBlocks::of(hashes, block_size),
            )
        });
        guard
    }

    /// [`Load::admit`] without announcing it: another replica's request, learned from the bus.
    /// It is known load like this replica's own (the engine reading's excess over it shrinks
    /// accordingly) and counts in the least-used tie-break and the pricing history, as it
    /// would on one router that routed everything. (Counting only own requests in the
    /// tie-break, to decorrelate replicas deciding at one instant, was measured worse: each
    /// replica then balances only its own share; `docs/benchmarks.md`, "Several router
    /// replicas".) Its prompt's `blocks` count among the running KV as an own request's do
    /// (shared prefixes once); without them, its prompt counts whole.
    pub fn admit_quietly(
        self: &Arc<Self>,
        prompt_tokens: u64,
        prefill_tokens: u64,
        blocks: &PromptBlocks,
    ) -> LoadGuard {
        self.count(
            prompt_tokens,
            prefill_tokens,
            marks(&blocks.hashes),
            blocks.block_size,
        )
    }

    /// Counts a request, unannounced.
    fn count(
        self: &Arc<Self>,
        prompt_tokens: u64,
        prefill_tokens: u64,
        marks: Arc<[BlockHash]>,
        block_size: u32,
    ) -> LoadGuard {
        self.lock_running().add(&marks, prompt_tokens, block_size);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.active_prompt_tokens
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        self.queued_prefill_tokens
            .fetch_add(prefill_tokens, Ordering::Relaxed);
        self.admitted.fetch_add(1, Ordering::Relaxed);
        self.admitted_prefill_tokens
            .fetch_add(prefill_tokens, Ordering::Relaxed);
        self.admitted_prompt_tokens
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        LoadGuard {
            load: Arc::clone(self),
            prompt_tokens,
            prefill_tokens,
            marks,
            block_size,
            stage: Stage::Prefill,
            ticket: None,
            occupancy: None,
            decode_start: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Prefill,
    Decode,
    Done,
}

/// The load one request holds on one worker; released on drop.
#[derive(Debug)]
pub struct LoadGuard {
    load: Arc<Load>,
    prompt_tokens: u64,
    prefill_tokens: u64,
    /// The prompt's prefix marks among the running requests' ([`RunningBlocks`]).
    marks: Arc<[BlockHash]>,
    block_size: u32,
    stage: Stage,
    /// The announcement of an own request (none for a quiet one, or without a bus).
    ticket: Option<Ticket>,
    /// Its tenant's count here, when the request has a tenant.
    occupancy: Option<Occupancy>,
    /// When it reached its first token, if told ([`LoadGuard::first_token_at`]).
    decode_start: Option<Duration>,
}

impl LoadGuard {
    /// The prefill tokens of other requests this router counts queued on the worker (not yet
    /// at their first token): what a request queued there now would run behind.
    pub fn others_queued_prefill_tokens(&self) -> u64 {
        let own = if self.stage == Stage::Prefill {
            self.prefill_tokens
        } else {
            0
        };
        self.load.view().queued_prefill_tokens.saturating_sub(own)
    }

    /// Counts the request as `tenant`'s on this worker until it ends.
    pub fn occupy(&mut self, tenant: &Arc<str>) {
        if self.stage != Stage::Done {
            self.occupancy = Some(self.load.tenancy.occupy(tenant));
        }
    }

    /// The request produced its first token: its prefill no longer queues others.
    pub fn first_token(&mut self) {
        if self.stage == Stage::Prefill {
            self.load
                .queued_prefill_tokens
                .fetch_sub(self.prefill_tokens, Ordering::Relaxed);
            self.load.decoding.fetch_add(1, Ordering::Relaxed);
            self.stage = Stage::Decode;
            if let Some(t) = &self.ticket {
                t.announce(BookingStep::FirstToken);
            }
        }
    }

    /// [`LoadGuard::first_token`] at `at` on the decider's clock: the request counts among
    /// the worker's decoding ones by age until it ends ([`Load::decode_ages`]).
    pub fn first_token_at(&mut self, at: Duration) {
        if self.stage == Stage::Prefill {
            self.first_token();
            self.load.lock_decode_starts().add(at, self.prompt_tokens);
            self.decode_start = Some(at);
        }
    }

    /// The request ended (completed, failed or cancelled); same as dropping the guard.
    pub fn finish(&mut self) {
        match self.stage {
            Stage::Prefill => {
                self.load
                    .queued_prefill_tokens
                    .fetch_sub(self.prefill_tokens, Ordering::Relaxed);
            }
            Stage::Decode => {
                self.load.decoding.fetch_sub(1, Ordering::Relaxed);
                if let Some(at) = self.decode_start.take() {
                    self.load
                        .lock_decode_starts()
                        .remove(at, self.prompt_tokens);
                }
            }
            Stage::Done => return,
        }
        self.load
            .active_prompt_tokens
            .fetch_sub(self.prompt_tokens, Ordering::Relaxed);
        self.load
            .lock_running()
            .remove(&self.marks, self.prompt_tokens, self.block_size);
        self.load.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.load.finished.fetch_add(1, Ordering::Relaxed);
        self.stage = Stage::Done;
        self.occupancy = None;
        if let Some(t) = &self.ticket {
            t.announce(BookingStep::Freed);
        }
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_by_its_decode_age_until_it_ends() {
        let load = Arc::new(Load::default());
        let mut told = load.admit(100, 100);
        let mut untold = load.admit(100, 100);
        told.first_token_at(Duration::from_secs(10));
        untold.first_token();
        // Only the request whose first token time is known has an age: 5 s at 15 s.
        let ages = load.decode_ages(Duration::from_secs(15));
        assert_eq!(
            ages.buckets_holding().collect::<Vec<_>>(),
            vec![(6.0, 1, 100)]
        );
        assert_eq!(load.snapshot().decoding, 2);
        // A second first token changes nothing; the end removes it.
        told.first_token_at(Duration::from_secs(12));
        assert_eq!(load.decode_ages(Duration::from_secs(15)).len(), 1);
        drop(told);
        assert!(load.decode_ages(Duration::from_secs(15)).is_empty());
        drop(untold);
        assert_eq!(load.snapshot().decoding, 0);
    }

    #[test]
    fn guard_moves_through_stages_and_releases_everything() {
        let load = Arc::new(Load::default());
        let mut g = load.admit(160, 100);
        assert_eq!(
            load.snapshot(),
            LoadSnapshot {
                in_flight: 1,
                queued_prefill_tokens: 100,
                decoding: 0,
                active_prompt_tokens: 160,
                admitted: 1,
                unseen_in_flight: 0,
            }
        );
        g.first_token();
        g.first_token();
        assert_eq!(
            load.snapshot(),
            LoadSnapshot {
                in_flight: 1,
                queued_prefill_tokens: 0,
                decoding: 1,
                active_prompt_tokens: 160,
                admitted: 1,
                unseen_in_flight: 0,
            }
        );
        drop(g);
        // Everything is released but the count of requests ever admitted.
        assert_eq!(
            load.snapshot(),
            LoadSnapshot {
                admitted: 1,
                ..LoadSnapshot::default()
            }
        );
    }

    #[test]
    fn a_guard_counts_its_tenant_until_the_request_ends() {
        let load = Arc::new(Load::default());
        let tenant: Arc<str> = "a".into();
        let mut g = load.admit(10, 10);
        g.occupy(&tenant);
        let mut h = load.admit(10, 10);
        h.occupy(&tenant);
        assert_eq!(load.tenancy().count("a"), 2);
        g.finish();
        assert_eq!(
            load.tenancy().count("a"),
            1,
            "released at the end, not the drop"
        );
        drop(h);
        assert!(load.tenancy().occupants().is_empty());
        // An ended request is not counted again.
        g.occupy(&tenant);
        assert_eq!(load.tenancy().count("a"), 0);
    }

    #[test]
    fn ended_requests_are_counted_once_per_ask() {
        let load = Arc::new(Load::default());
        let a = load.admit(10, 10);
        let b = load.admit(10, 10);
        assert_eq!(load.finished_since_last_ask(), 0);
        drop(a);
        drop(b);
        assert_eq!(load.finished_since_last_ask(), 2);
        assert_eq!(
            load.finished_since_last_ask(),
            0,
            "marked at the previous ask"
        );
    }

    #[test]
    fn dropping_before_first_token_releases_prefill() {
        let load = Arc::new(Load::default());
        let a = load.admit(10, 10);
        let mut b = load.admit(5, 5);
        b.finish();
        assert_eq!(load.snapshot().queued_prefill_tokens, 10);
        drop(a);
        drop(b);
        assert_eq!(
            load.snapshot(),
            LoadSnapshot {
                admitted: 2,
                ..LoadSnapshot::default()
            }
        );
    }

    #[test]
    fn an_announced_load_tells_every_step_once_and_a_quiet_admission_nothing() {
        use super::super::booking::{TargetKey, testing::Notes};
        let notes = Arc::new(Notes::default());
        let load = Arc::new(Load::default());
        let target = TargetKey {
            worker: "w".into(),
            rank: 1,
        };
        assert!(load.announce_to(Announcer::new(notes.clone(), target.clone())));
        assert!(!load.announce_to(Announcer::new(notes.clone(), target.clone())));
        let mut g = load.admit(100, 40);
        g.first_token();
        g.first_token();
        drop(g);
        let quiet = load.admit_quietly(7, 7, &PromptBlocks::default());
        drop(quiet);
        let steps: Vec<(u64, BookingStep)> = notes
            .notes
            .lock()
            .unwrap()
            .iter()
            .map(|n| {
                assert_eq!(n.target, target);
                (n.request, n.step.clone())
            })
            .collect();
        assert_eq!(
            steps,
            [
                (
                    0,
                    BookingStep::Booked {
                        prompt_tokens: 100,
                        prefill_tokens: 40,
                        blocks: PromptBlocks::default(),
                    }
                ),
                (0, BookingStep::FirstToken),
                (0, BookingStep::Freed),
            ]
        );
        assert_eq!(load.snapshot().admitted, 2, "both count in the tie-break");
        assert_eq!(load.admissions().requests, 2, "and price others' requests");
    }

    #[test]
    fn the_view_adds_other_replicas_requests_from_a_reading_until_it_is_cleared() {
        let load = Arc::new(Load::default());
        let _own = load.admit(100, 60);
        assert_eq!(load.view(), load.snapshot());
        let at = load.snapshot();
        load.set_reading(
            EngineLoad {
                running: 1,
                waiting: 3,
                kv_usage: Some(0.5),
            },
            at,
            None,
        );
        let v = load.view();
        assert_eq!((v.in_flight, v.unseen_in_flight), (4, 3));
        // Own request waiting, two others waiting at 60 tokens each, one other running.
        assert_eq!((v.queued_prefill_tokens, v.decoding), (60 + 120, 1));
        assert_eq!(load.snapshot().in_flight, 1);
        load.clear_reading();
        assert_eq!(load.view(), load.snapshot());
    }
}
