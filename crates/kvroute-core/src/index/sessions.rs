//! Where each session a client named was last routed: the evidence an affinity hint carries.
//!
//! Clients already name their sessions: OpenAI's `prompt_cache_key` and `user`, or a header
//! such as `x-session-id`. A session's next request usually extends the previous one's prompt,
//! so the worker that served it is likely to still hold that prefix. The exact index knows
//! this for workers that publish KV events; for the others (and for prompts the router could
//! not tokenize) the hint is the only evidence. It is evidence, never a pin: the cost model
//! weighs it like any other cached prefix, so an overloaded home is left for a free worker.
//!
//! A session's entry keeps its home worker, when it was last routed, and a few of the last
//! prompt's block hashes at fixed fractions of its length (the last block among them). Block
//! hashes are chained, so a new prompt whose block `i` carries the hash marked at `i` shares
//! every block up to `i` with the last one: the largest such mark is how much of the new prompt
//! the home was given last time, known without keeping the prompt. Memory is bounded: at most
//! `capacity` sessions (the longest unused forgotten first), each forgotten after `ttl`.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::fleet::WorkerId;
use crate::tokens::BlockHash;

/// Sessions remembered by default (each costs about 200 bytes).
pub const DEFAULT_MAX_SESSIONS: usize = 65_536;
/// How long a session's home is remembered after its last request, by default: longer than
/// the think times of agent sessions (seconds to minutes), shorter than an engine keeps an idle
/// prefix under load.
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(600);

/// Marks kept per session: the last block and seven evenly spaced before it.
const MARKS: usize = 8;

/// A session as the router knows it: the client's name for it, scoped to the tenant and model
/// (two tenants naming a session alike are two sessions), hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionKey(u64);

impl SessionKey {
    /// The key of the session `name` of `tenant` on `model`.
    pub fn new(tenant: Option<&str>, model: &str, name: &[u8]) -> SessionKey {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        tenant.hash(&mut h);
        model.hash(&mut h);
        name.hash(&mut h);
        SessionKey(h.finish())
    }
}

/// A session's home as seen by one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SessionHome {
    /// The worker its last request was routed to.
    pub worker: WorkerId,
    /// Since then.
    pub age: Duration,
    /// Leading blocks of this request's prompt that the last one shared (0 when unknown).
    pub shared_blocks: u32,
}

struct Entry {
    worker: WorkerId,
    at: Duration,
    /// (blocks, hash of the last of them) of the last prompt, ascending.
    marks: Vec<(u32, BlockHash)>,
    /// Matches its place in `order` (a later request of the session moves it).
    seq: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<SessionKey, Entry>,
    /// Keys in the order last used, with the `seq` they were used under; stale pairs are
    /// skipped when met.
    order: VecDeque<(SessionKey, u64)>,
    seq: u64,
}

/// The homes of the sessions clients named.
pub struct SessionHomes {
    inner: Mutex<Inner>,
    ttl_ms: AtomicU64,
    capacity: AtomicUsize,
}

impl Default for SessionHomes {
    fn default() -> Self {
        SessionHomes::new(DEFAULT_SESSION_TTL, DEFAULT_MAX_SESSIONS)
    }
}

impl SessionHomes {
    /// An empty table of at most `capacity` sessions, each remembered for `ttl`.
    pub fn new(ttl: Duration, capacity: usize) -> SessionHomes {
        let homes = SessionHomes {
            inner: Mutex::new(Inner::default()),
            ttl_ms: AtomicU64::new(0),
            capacity: AtomicUsize::new(0),
        };
        homes.configure(ttl, capacity);
        homes
    }

    /// New limits (a config reload), applied from the next request; entries past the new
    /// capacity are forgotten on the next learn.
    pub fn configure(&self, ttl: Duration, capacity: usize) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.ttl_ms.store(ms, Ordering::Relaxed);
        self.capacity.store(capacity, Ordering::Relaxed);
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.load(Ordering::Relaxed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The home of `key` at `now` for a prompt of `hashes`; `None` when the session is unknown
    /// or its last request is older than the TTL.
    pub fn home(
        &self,
        key: SessionKey,
        hashes: &[BlockHash],
        now: Duration,
    ) -> Option<SessionHome> {
        let ttl = self.ttl();
        let inner = self.lock();
        let e = inner.map.get(&key)?;
        let age = now.saturating_sub(e.at);
        if age > ttl {
            return None;
        }
        let shared_blocks = e
            .marks
            .iter()
            .rev()
            .find(|(n, h)| hashes.get(*n as usize - 1) == Some(h))
            .map_or(0, |(n, _)| *n);
        Some(SessionHome {
            worker: e.worker,
            age,
            shared_blocks,
        })
    }

    /// Records that a request of `key` with a prompt of `hashes` was routed to `worker` at
    /// `now`.
    pub fn learn(&self, key: SessionKey, worker: WorkerId, hashes: &[BlockHash], now: Duration) {
        let capacity = self.capacity.load(Ordering::Relaxed);
        if capacity == 0 {
            return;
        }
        let ttl = self.ttl();
        let mut inner = self.lock();
        inner.seq += 1;
        let seq = inner.seq;
        inner.map.insert(
            key,
            Entry {
                worker,
                at: now,
                marks: marks(hashes),
                seq,
            },
        );
        inner.order.push_back((key, seq));
        inner.trim(capacity, ttl, now);
    }

    /// Forgets every session whose home is `worker` (it went down or left: its cache is gone,
    /// and its number may later name another worker).
    pub fn clear_worker(&self, worker: WorkerId) {
        self.lock().map.retain(|_, e| e.worker != worker);
    }

    /// Sessions remembered now.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether no session is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// Forgets the longest-unused sessions past `capacity` and those older than `ttl`; drops
    /// stale order entries as it meets them.
    fn trim(&mut self, capacity: usize, ttl: Duration, now: Duration) {
        while let Some(&(key, seq)) = self.order.front() {
            let current = self.map.get(&key).map(|e| (e.seq, e.at));
            let drop_it = match current {
                Some((s, _)) if s != seq => true, // stale: used again since
                None => true,                     // forgotten already
                Some((_, at)) => self.map.len() > capacity || now.saturating_sub(at) > ttl,
            };
            if !drop_it {
                break;
            }
            self.order.pop_front();
            if current.is_some_and(|(s, _)| s == seq) {
                self.map.remove(&key);
            }
        }
        // Stale pairs left behind the front by sessions used again are bounded by twice the
        // sessions: compact when they outnumber them.
        if self.order.len() > 2 * self.map.len().max(16) {
            let map = &self.map;
            self.order
                .retain(|(k, s)| map.get(k).is_some_and(|e| e.seq == *s));
        }
    }
}

/// The marks of a prompt of `hashes`: (blocks, hash of the last) at `MARKS` fractions of its
/// length, the whole prompt last; none for a prompt without a full block.
fn marks(hashes: &[BlockHash]) -> Vec<(u32, BlockHash)> {
    let n = hashes.len();
    let mut out: Vec<(u32, BlockHash)> = Vec::with_capacity(MARKS);
    for k in 1..=MARKS {
        let blocks = n * k / MARKS;
        if blocks == 0 || out.last().is_some_and(|(b, _)| *b as usize == blocks) {
            continue;
        }
        let Ok(b) = u32::try_from(blocks) else { break };
        out.push((b, hashes[blocks - 1]));
    }
    out
}

#[cfg(test)]
#[path = "sessions_tests.rs"]
mod tests;
