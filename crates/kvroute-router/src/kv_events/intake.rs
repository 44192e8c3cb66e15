//! The intake threads: a few threads, each watching the sockets of many engines'
//! subscriptions (SUB, connection monitor, replay DEALER) through one epoll set, and running
//! each ready stream's logic ([`super::stream`]). Which thread a subscription joins, how a
//! readiness token names a socket and when a socket still holds messages are decided in
//! [`super::intake_plan`].
//!
//! Why: a thread per engine cost a wake-up, a context switch and a channel hand-over per
//! batch; at 1,024 engines × 50 batches/s that was the router's whole CPU and the lag reached
//! seconds. A thread that serves many sockets takes everything ready since its last wake-up at
//! once, so its wake-ups grow slower than the event rate.
//!
//! Why epoll on each socket's `ZMQ_FD` rather than `zmq::poll`: a `zmq::poll` asks every socket
//! of the thread for its state at every wake-up (about 770 sockets for 256 engines), so a
//! thread spent about a core polling at 10 batches/s per engine whatever the rate. An epoll
//! set reports only the sockets that signalled, so a wake-up costs what is ready. The price is
//! `ZMQ_FD`'s edge-triggered contract: a signalled socket is read until it is empty, or kept
//! pending ([`super::intake_plan::Pending`]).
//!
//! Subscriptions come and go at runtime (workers found and lost by discovery): the handle's
//! owner sends the thread a command and wakes it through an `inproc` PAIR; a removal waits for
//! the thread's acknowledgement, so nothing of the removed stream is sent afterwards (as
//! joining its thread did). A subscription whose consumer is gone is removed by the thread
//! itself at its next wake-up (at least every poll interval).

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Interest, Token};

use super::intake_plan::{Pending, Role, WAKE, named, place, token};
use super::monitored::MonitoredSub;
use super::stream::Stream;

/// Longest a thread sleeps without subscriptions asking for less (each asks for its
/// `poll_interval`).
const MAX_SLEEP: Duration = Duration::from_millis(50);

/// Shortest time between two wake-ups of a thread that read sockets. Waiting this long lets a
/// busy fleet's batches gather, so each wake-up (a context switch) takes many; it adds at most
/// this to a batch's lag. (With `zmq::poll`, whose every call asked every socket for its
/// state, polling again at once for the next single batch spent more than a core on 1,024
/// engines at 10 batches/s each, `benches/event_lag.rs`.)
const PACE: Duration = Duration::from_millis(1);

/// Distinct numbers for subscriptions and threads.
static IDS: AtomicU64 = AtomicU64::new(0);

/// Every intake thread started so far (they never end: the process keeps them).
static THREADS: Mutex<Vec<Arc<IntakeThread>>> = Mutex::new(Vec::new());

/// One engine's subscription as an intake thread runs it.
pub(super) struct Subscription {
    pub(super) id: u64,
    pub(super) socket: MonitoredSub,
    pub(super) stream: Stream,
    /// Set when the thread removed it because its consumer was gone.
    pub(super) finished: Arc<AtomicBool>,
}

enum Command {
    Add(Box<Subscription>),
    /// Remove a subscription, then acknowledge.
    Remove(u64, mpsc::Sender<()>),
}

/// The owner's side of one intake thread.
pub(super) struct IntakeThread {
    commands: Mutex<mpsc::Sender<Command>>,
    /// Our end of the thread's wake-up PAIR.
    waker: Mutex<zmq::Socket>,
    /// Subscriptions placed on it whose handles live (for placing new ones).
    load: AtomicUsize,
}

/// A subscription's place on its thread; dropping it removes the subscription and waits
/// until the thread has let go of it.
pub(super) struct Placed {
    id: u64,
    thread: Arc<IntakeThread>,
}

impl Drop for Placed {
    fn drop(&mut self) {
        let (ack, acked) = mpsc::channel();
        if self.thread.send(Command::Remove(self.id, ack)) {
            // An error means the thread is gone, and the subscription with it.
            let _ = acked.recv();
        }
        self.thread.load.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Gives `subscription` to an intake thread with room (fewer than `per_thread`
/// subscriptions), starting a thread when none has.
pub(super) fn add(subscription: Subscription, per_thread: usize) -> std::io::Result<Placed> {
    let id = subscription.id;
    let thread = {
        // A poisoned lock only means a thread panicked while holding it; every change to the
        // list is one push.
        let mut all = THREADS.lock().unwrap_or_else(|p| p.into_inner());
        let loads: Vec<usize> = all.iter().map(|t| t.load.load(Ordering::Relaxed)).collect();
        let thread = match place(&loads, per_thread).and_then(|i| all.get(i)) {
            Some(t) => Arc::clone(t),
            None => {
                let t = IntakeThread::start(all.len())?;
                all.push(Arc::clone(&t));
                t
            }
        };
        thread.load.fetch_add(1, Ordering::Relaxed);
        thread
    };
    if !thread.send(Command::Add(Box::new(subscription))) {
        thread.load.fetch_sub(1, Ordering::Relaxed);
        return Err(std::io::Error::other("the kv-events intake thread is gone"));
    }
    Ok(Placed { id, thread })
}

/// A number for a new subscription.
pub(super) fn next_id() -> u64 {
    IDS.fetch_add(1, Ordering::Relaxed)
}

impl IntakeThread {
    fn start(n: usize) -> std::io::Result<Arc<IntakeThread>> {
        let zmq_err = |e: zmq::Error| std::io::Error::other(format!("kv-events intake: {e}"));
        // A context of its own: the wake-up PAIRs are `inproc`, which needs no I/O thread.
        let context = zmq::Context::new();
        let endpoint = format!("inproc://kv-intake-wake-{}", next_id());
        let wake = context.socket(zmq::PAIR).map_err(zmq_err)?;
        wake.set_linger(0).map_err(zmq_err)?;
        wake.bind(&endpoint).map_err(zmq_err)?;
        let waker = context.socket(zmq::PAIR).map_err(zmq_err)?;
        waker.set_linger(0).map_err(zmq_err)?;
        waker.connect(&endpoint).map_err(zmq_err)?;
        let (tx, rx) = mpsc::channel();
        let mut running = Running::new(&wake)?;
        std::thread::Builder::new()
            .name(format!("kv-intake-{n}"))
            .spawn(move || {
                let _context = context;
                running.run(&wake, &rx);
            })?;
        Ok(Arc::new(IntakeThread {
            commands: Mutex::new(tx),
            waker: Mutex::new(waker),
            load: AtomicUsize::new(0),
        }))
    }

    /// Queues `command` and wakes the thread; `false` if the thread is gone.
    fn send(&self, command: Command) -> bool {
        let sent = self
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(command)
            .is_ok();
        if sent {
            // A full wake-up queue means the thread has wake-ups pending already.
            let waker = self.waker.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = waker.send(&[][..], zmq::DONTWAIT)
                && e != zmq::Error::EAGAIN
            {
                tracing::warn!(error = %e, "cannot wake a kv-events intake thread");
            }
        }
        sent
    }
}

/// One subscription as its thread keeps it.
struct Entry {
    sub: Subscription,
    pending: Pending,
    /// The replay DEALER's descriptor last registered, while a replay runs.
    replay_fd: Option<RawFd>,
}

/// The thread's own state: its subscriptions and the readiness of their sockets.
struct Running {
    entries: Vec<Entry>,
    /// Subscription id → position in `entries`.
    slots: HashMap<u64, usize>,
    poll: mio::Poll,
    events: mio::Events,
}

impl Running {
    fn new(wake: &zmq::Socket) -> std::io::Result<Running> {
        let poll = mio::Poll::new()?;
        let fd = wake.get_fd().map_err(std::io::Error::other)?;
        poll.registry()
            .register(&mut SourceFd(&fd), Token(WAKE), Interest::READABLE)?;
        Ok(Running {
            entries: Vec::new(),
            slots: HashMap::new(),
            poll,
            events: mio::Events::with_capacity(1024),
        })
    }

    fn run(&mut self, wake: &zmq::Socket, commands: &mpsc::Receiver<Command>) {
        loop {
            let polled_at = std::time::Instant::now();
            let woken = match self.wait() {
                Ok(woken) => woken,
                Err(e) => {
                    tracing::warn!(error = %e, "kv-events intake poll failed");
                    std::thread::sleep(MAX_SLEEP);
                    true
                }
            };
            if woken {
                while wake.recv_bytes(zmq::DONTWAIT).is_ok() {}
                if !self.obey(commands) {
                    return;
                }
            }
            let read = self.serve();
            if read {
                let since = polled_at.elapsed();
                if since < PACE {
                    std::thread::sleep(PACE - since);
                }
            }
        }
    }

    /// Sleeps until a socket signals, a stream's interval passes, or at once when a socket is
    /// known to hold messages; marks what signalled. Whether the thread was woken.
    fn wait(&mut self) -> std::io::Result<bool> {
        let mut sleep = MAX_SLEEP;
        for e in &self.entries {
            let backlogged = e.sub.stream.is_backlogged();
            sleep = sleep.min(e.sub.stream.poll_interval());
            if e.pending.is_ready(backlogged) {
                sleep = Duration::ZERO;
            } else if backlogged {
                // Offer the backlog again soon.
                sleep = sleep.min(Duration::from_millis(1));
            }
        }
        match self.poll.poll(&mut self.events, Some(sleep)) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(false),
            polled => polled?,
        }
        let mut woken = false;
        for event in &self.events {
            let Token(token) = event.token();
            if token == WAKE {
                woken = true;
            } else if let Some((id, role)) = named(token)
                && let Some(&slot) = self.slots.get(&id)
                && let Some(e) = self.entries.get_mut(slot)
            {
                e.pending.signal(role);
            }
        }
        Ok(woken)
    }

    /// Runs the commands queued; `false` when the owners' side is gone (never, in a process
    /// that keeps its threads).
    fn obey(&mut self, commands: &mpsc::Receiver<Command>) -> bool {
        loop {
            match commands.try_recv() {
                Ok(Command::Add(s)) => self.add(*s),
                Ok(Command::Remove(id, ack)) => {
                    // Dropped here, before the acknowledgement: nothing is sent after it.
                    if let Some(slot) = self.slots.get(&id).copied() {
                        self.remove(slot);
                    }
                    let _ = ack.send(());
                }
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn add(&mut self, sub: Subscription) {
        let registry = self.poll.registry();
        for (socket, role) in [
            (sub.socket.sub(), Role::Data),
            (sub.socket.events(), Role::Events),
        ] {
            let registered = socket
                .get_fd()
                .map_err(std::io::Error::other)
                .and_then(|fd| {
                    registry.register(
                        &mut SourceFd(&fd),
                        Token(token(sub.id, role)),
                        Interest::READABLE,
                    )
                });
            if let Err(e) = registered {
                // Still read at every wake-up (its poll interval at least): late, never lost.
                tracing::warn!(error = %e, "kv-events socket not watched for readiness");
            }
        }
        self.slots.insert(sub.id, self.entries.len());
        self.entries.push(Entry {
            sub,
            // Whatever arrived before the thread watched the sockets is read at once.
            pending: Pending::all(),
            replay_fd: None,
        });
    }

    /// Removes the subscription at `slot`, its sockets no longer watched (they are open until
    /// it drops, so no other socket's descriptor is touched).
    fn remove(&mut self, slot: usize) -> Subscription {
        let e = self.entries.remove(slot);
        let registry = self.poll.registry();
        let fds = [e.sub.socket.sub().get_fd(), e.sub.socket.events().get_fd()];
        for fd in fds.into_iter().flatten().chain(e.replay_fd) {
            // A replay socket already closed left the set by itself.
            let _ = registry.deregister(&mut SourceFd(&fd));
        }
        self.slots = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.sub.id, i))
            .collect();
        e.sub
    }

    /// Steps every stream with a pending socket, a backlog, a replay in flight (its deadlines)
    /// or a consumer that is gone; removes the ones that ended. Whether any socket was read.
    fn serve(&mut self) -> bool {
        let mut ended = Vec::new();
        let mut read = false;
        for (slot, e) in self.entries.iter_mut().enumerate() {
            let stream = &mut e.sub.stream;
            if stream.is_closed() {
                ended.push(slot);
                continue;
            }
            let due = e
                .pending
                .due(stream.is_backlogged(), stream.replay_socket().is_some());
            let Some((data, events)) = due else { continue };
            read |= data || events;
            if stream.step(&e.sub.socket, data, events).is_err() {
                ended.push(slot);
                continue;
            }
            e.pending.stepped(data, stream.is_backlogged());
            Self::watch_replay(self.poll.registry(), e);
        }
        for slot in ended.into_iter().rev() {
            self.remove(slot).finished.store(true, Ordering::Relaxed);
        }
        read
    }

    /// Watches the replay DEALER a step started. One that ended was closed with its replay
    /// and left the readiness set by itself, so it is never deregistered by number (the
    /// number may already name another socket).
    fn watch_replay(registry: &mio::Registry, e: &mut Entry) {
        let fd = e.sub.stream.replay_socket().and_then(|s| s.get_fd().ok());
        if fd == e.replay_fd {
            return;
        }
        e.replay_fd = fd;
        if let Some(fd) = fd {
            let token = Token(token(e.sub.id, Role::Replay));
            if let Err(e) = registry.register(&mut SourceFd(&fd), token, Interest::READABLE) {
                // The stream steps at every wake-up while its replay runs: read late, not lost.
                tracing::debug!(error = %e, "kv-events replay socket not watched");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::sync::mpsc::{Receiver, channel};

    use super::super::{
        EventBatch, Publisher, PublisherConfig, Subscriber, SubscriberConfig, SubscriberEvent,
        WorkerEvent,
    };
    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    fn batch(n: u64) -> EventBatch {
        EventBatch {
            ts: n as f64,
            events: Vec::new(),
            dp_rank: None,
        }
    }

    /// The sequence numbers of the batches received so far.
    fn drain(rx: &mut Receiver<WorkerEvent>, into: &mut Vec<u64>) {
        while let Ok(msg) = rx.try_recv() {
            match msg.event {
                SubscriberEvent::Batch { seq, .. } => into.push(seq),
                other => panic!("{}: expected batches only, got {other:?}", msg.worker),
            }
        }
    }

    /// Two engines read by one intake thread; one consumer stops taking events. Its engine's
    /// batches wait (in ZeroMQ and the stream's outbox) while the other engine's keep
    /// arriving, and once it takes them again every one arrives, in order, none twice.
    #[test]
    fn a_consumer_that_falls_behind_holds_up_no_other_engine_and_loses_nothing() {
        let slow_pub = Publisher::bind(PublisherConfig::new("tcp://127.0.0.1:*")).expect("bind");
        let other_pub = Publisher::bind(PublisherConfig::new("tcp://127.0.0.1:*")).expect("bind");
        let (slow_tx, mut slow_rx) = channel(2);
        let (other_tx, mut other_rx) = channel(4096);
        let slow = Subscriber::spawn(SubscriberConfig::new("slow", slow_pub.endpoint()), slow_tx)
            .expect("subscribe");
        let other = Subscriber::spawn(
            SubscriberConfig::new("other", other_pub.endpoint()),
            other_tx,
        )
        .expect("subscribe");
        assert_eq!(
            THREADS.lock().map(|t| t.len()).unwrap_or(0),
            1,
            "both subscriptions on one intake thread"
        );
        // Until both are connected (a PUB drops what it sends before that).
        let (mut slow_got, mut other_got) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + WAIT;
        while slow_got.is_empty() || other_got.is_empty() {
            assert!(Instant::now() < deadline, "never connected");
            slow_pub.publish(&batch(0));
            other_pub.publish(&batch(0));
            std::thread::sleep(Duration::from_millis(20));
            drain(&mut slow_rx, &mut slow_got);
            drain(&mut other_rx, &mut other_got);
        }
        let slow_last = slow_pub.publish(&batch(1));
        // The slow consumer takes nothing from here on; the other engine publishes 500.
        let other_last = (0..500).map(|i| other_pub.publish(&batch(i))).last();
        for i in 0..500 {
            slow_pub.publish(&batch(i));
        }
        let slow_last = slow_last + 500;
        while other_got.last() != other_last.as_ref() {
            assert!(
                Instant::now() < deadline,
                "the other engine's batches are held up: got {} of them",
                other_got.len()
            );
            std::thread::sleep(Duration::from_millis(5));
            drain(&mut other_rx, &mut other_got);
        }
        assert!(
            slow.stats().batches.load(Ordering::Relaxed) < 500,
            "the slow consumer's engine was read on regardless"
        );
        while slow_got.last() != Some(&slow_last) {
            assert!(
                Instant::now() < deadline,
                "the slow consumer's batches never came"
            );
            std::thread::sleep(Duration::from_millis(1));
            drain(&mut slow_rx, &mut slow_got);
        }
        for got in [&slow_got, &other_got] {
            assert!(
                got.windows(2).all(|w| w[1] == w[0] + 1),
                "not every batch once and in order: {got:?}"
            );
        }
        for stats in [slow.stats(), other.stats()] {
            assert_eq!(stats.gaps.load(Ordering::Relaxed), 0);
            assert_eq!(stats.dropped.load(Ordering::Relaxed), 0);
        }
        drop(slow);
        // The other subscription is served on after one is removed.
        let last = other_pub.publish(&batch(7));
        while other_got.last() != Some(&last) {
            assert!(
                Instant::now() < deadline,
                "the other engine stopped after a removal"
            );
            std::thread::sleep(Duration::from_millis(5));
            drain(&mut other_rx, &mut other_got);
        }
    }
}
