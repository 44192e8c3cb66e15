//! Event-to-index lag at fleet scale: the time from an engine publishing a KV-event batch to
//! the router's lookups seeing it, with many engines publishing and lookups running.
//!
//! The router side is the real one: one `index::WorkerFeed` per worker (a ZeroMQ SUB on its
//! own thread, decoding, the tokio task that applies batches to the exact index), as
//! `serve` starts them. The engines are `common/fleet_engines.rs`: one PUB socket, port,
//! sequence and cache per engine, driven by a few publisher threads (see there why).
//!
//! A request's first batch is its tracer: the lookups thread asks `Holdings::lookup` for the
//! request's first block every 0.2 ms until the engine's worker holds it, and records the
//! time since the publish. The same thread looks up whole requests (recent ones, at
//! `--lookups-per-s`), as the request path does. Printed: lag percentiles, the publish rate
//! reached, lookup latency, and the CPU each kind of thread used (where the time goes).
//!
//! ```text
//! cargo bench --bench event_lag -- [--workers 1024] [--seconds 20] [--blocks-per-s 100]
//!     [--batches-per-s 10] [--capacity 4096] [--request-blocks 256] [--lookups-per-s 200]
//!     [--publisher-threads 4] [--engines-per-thread 256]
//! ```
//! `--engines-per-thread` is the subscriptions each of the router's intake threads polls
//! (`SubscriberConfig::engines_per_intake`); 1 gives every engine a thread of its own, as
//! before the intake threads.
//! `--blocks-per-s` and `--batches-per-s` are per engine; blocks are stored and removed half
//! and half once an engine's cache is full (a fill phase fills every cache first, untimed, in
//! batches of 64 blocks).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and bench code: a failed step should stop the run"
)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvroute::fleet::WorkerId;
use kvroute::index::{
    ApproxConfig, ApproxIndex, FeedModel, Holdings, IndexConfig, KvIndex, WorkerFeed, seeds_for,
};
use kvroute::kv_events::SubscriberConfig;

#[path = "common/fleet_engines.rs"]
mod fleet_engines;
#[path = "common/publisher_process.rs"]
mod publisher_process;
use fleet_engines::{Published, Shape, Tracer, unix_ns};
use publisher_process::{Plan, Publishers, cpu_by_kind, machine_ticks, process_ticks};

const MODEL: &str = "fleet";

struct Args {
    workers: u32,
    seconds: f64,
    blocks_per_s: f64,
    batches_per_s: f64,
    capacity: usize,
    request_blocks: usize,
    lookups_per_s: f64,
    publisher_threads: usize,
    engines_per_thread: usize,
}

impl Args {
    fn parse() -> Args {
        let argv: Vec<String> = std::env::args().collect();
        let get = |name: &str, default: f64| -> f64 {
            argv.iter()
                .position(|a| a == name)
                .and_then(|i| argv.get(i + 1))
                .map(|v| v.parse().expect("a number"))
                .unwrap_or(default)
        };
        Args {
            workers: get("--workers", 1024.0) as u32,
            seconds: get("--seconds", 20.0),
            blocks_per_s: get("--blocks-per-s", 100.0),
            batches_per_s: get("--batches-per-s", 10.0),
            capacity: get("--capacity", 4096.0) as usize,
            request_blocks: get("--request-blocks", 256.0) as usize,
            lookups_per_s: get("--lookups-per-s", 200.0),
            publisher_threads: get("--publisher-threads", 4.0) as usize,
            engines_per_thread: get(
                "--engines-per-thread",
                kvroute::kv_events::DEFAULT_ENGINES_PER_INTAKE as f64,
            ) as usize,
        }
    }

    fn plan(&self) -> Plan {
        Plan {
            workers: self.workers,
            threads: self.publisher_threads,
            shape: self.shape(),
            batches_per_s: self.batches_per_s,
            seconds: self.seconds,
        }
    }

    fn shape(&self) -> Shape {
        Shape {
            store: ((self.blocks_per_s / 2.0 / self.batches_per_s).round() as usize).max(1),
            request_blocks: self.request_blocks,
            capacity: self.capacity,
            block_size: 16,
        }
    }
}

/// The index as the router builds it (default `[index]` settings).
fn holdings() -> Holdings {
    let d = kvroute::config::IndexSettings::default();
    Holdings::new(
        KvIndex::new(IndexConfig {
            max_entries: d.max_entries,
        }),
        ApproxIndex::new(ApproxConfig {
            ttl: d.approx_ttl,
            capacity_per_worker: d.approx_capacity_blocks,
        }),
    )
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// What the lookups thread measured.
struct Lookups {
    lags_ms: Vec<f64>,
    unseen: usize,
    lookup_us: Vec<f64>,
}

/// Times tracers until they are seen (or 10 s pass) and runs background lookups of recent
/// requests at `rate` a second, until `done` is set and no tracer is pending.
fn lookups(
    holdings: Arc<Holdings>,
    rx: mpsc::Receiver<Tracer>,
    rate: f64,
    done: Arc<AtomicBool>,
) -> Lookups {
    let start = Instant::now();
    let mut pending: VecDeque<Tracer> = VecDeque::new();
    let mut recent: VecDeque<Arc<Vec<kvroute::tokens::BlockHash>>> = VecDeque::new();
    let mut out = Lookups {
        lags_ms: Vec::new(),
        unseen: 0,
        lookup_us: Vec::new(),
    };
    let mut issued = 0u64;
    let mut pick = 0x2545_F491_4F6C_DD1Du64;
    loop {
        while let Ok(t) = rx.try_recv() {
            pending.push_back(t);
        }
        let now = unix_ns();
        pending.retain(|t| {
            let o = holdings.lookup(&t.hashes[..1], start.elapsed());
            let waited_ms = now.saturating_sub(t.published) as f64 / 1e6;
            if o.get(WorkerId(t.worker)) >= 1 {
                out.lags_ms.push(waited_ms);
                if recent.len() == 4096 {
                    recent.pop_front();
                }
                recent.push_back(Arc::clone(&t.hashes));
                false
            } else if waited_ms > 10_000.0 {
                out.unseen += 1;
                false
            } else {
                true
            }
        });
        while !recent.is_empty() && (issued as f64) < start.elapsed().as_secs_f64() * rate {
            pick ^= pick << 13;
            pick ^= pick >> 7;
            pick ^= pick << 17;
            let q = &recent[(pick % recent.len() as u64) as usize];
            let t = Instant::now();
            std::hint::black_box(holdings.lookup(q, start.elapsed()));
            out.lookup_us.push(t.elapsed().as_secs_f64() * 1e6);
            issued += 1;
        }
        if done.load(Ordering::Relaxed) && pending.is_empty() {
            return out;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// One `WorkerFeed` per engine, worker ids in engine order; prints how many started.
fn start_feeds(
    endpoints: &[String],
    holdings: &Arc<Holdings>,
    args: &Args,
) -> HashMap<u32, WorkerFeed> {
    let mut feeds = HashMap::new();
    let mut failed = Vec::new();
    for (w, endpoint) in (0u32..).zip(endpoints) {
        let model = Box::new(|| {
            Some(FeedModel {
                name: MODEL.into(),
                block_size: 16,
            })
        });
        let mut config = SubscriberConfig::new(format!("w{w}"), endpoint.clone());
        config.engines_per_intake = args.engines_per_thread;
        match WorkerFeed::start(
            Arc::clone(holdings),
            WorkerId(w),
            model,
            Box::new(|_| {}),
            config,
        ) {
            Ok(f) => {
                feeds.insert(w, f);
            }
            Err(e) => failed.push(format!("w{w}: {e}")),
        }
    }
    println!(
        "{} workers: {} feeds started, {} failed{}",
        args.workers,
        feeds.len(),
        failed.len(),
        failed
            .first()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    );
    feeds
}

/// Has the publisher process fill every engine's cache (untimed) and waits until the index
/// holds them.
fn fill(
    publishers: &mut Publishers,
    args: &Args,
    holdings: &Holdings,
    feeds: &HashMap<u32, WorkerFeed>,
) {
    let t = Instant::now();
    let (batches, blocks) = publishers.fill();
    let connected = feeds
        .values()
        .filter(|f| {
            f.stats()
                .is_some_and(|s| s.batches.load(Ordering::Relaxed) > 0)
        })
        .count();
    // Until the caches are in the index, or it stops growing (batches published before a
    // subscriber connected are lost to it, as to a router that starts late without replay).
    let target = args.workers as usize * args.capacity;
    let mut last = (0, Instant::now());
    while holdings.exact.entries() < target * 99 / 100 && last.1.elapsed() < Duration::from_secs(3)
    {
        std::thread::sleep(Duration::from_millis(100));
        let now = holdings.exact.entries();
        if now > last.0 {
            last = (now, Instant::now());
        }
    }
    println!(
        "fill: {batches} batches, {blocks} blocks in {:.1} s; {connected} feeds received batches; index {} pairs",
        t.elapsed().as_secs_f64(),
        holdings.exact.entries()
    );
}

fn main() {
    let args = Args::parse();
    let shape = args.shape();
    let seed = seeds_for(MODEL)(None, None);
    if std::env::args().any(|a| a == "--publish") {
        publisher_process::serve(args.plan(), seed);
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let holdings = Arc::new(holdings());

    // The engines, in a process of their own.
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut publishers = Publishers::start(&argv);

    // The router's feeds, as `serve` starts them.
    let feeds = start_feeds(&publishers.endpoints, &holdings, &args);

    // Connect, then fill every cache (untimed).
    std::thread::sleep(Duration::from_secs(2));
    fill(&mut publishers, &args, &holdings, &feeds);

    // The measured phase.
    let (tx, rx) = mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let prober = {
        let (h, d, rate) = (Arc::clone(&holdings), Arc::clone(&done), args.lookups_per_s);
        std::thread::Builder::new()
            .name("lookups".into())
            .spawn(move || lookups(h, rx, rate, d))
            .unwrap()
    };
    let cpu_before = cpu_by_kind();
    let (own_before, machine_before) = (process_ticks(), machine_ticks());
    let t = Instant::now();
    let engines = publishers.run(shape, seed, tx);
    let elapsed = t.elapsed().as_secs_f64();
    let cpu_after = cpu_by_kind();
    let (own_after, machine_after) = (process_ticks(), machine_ticks());
    done.store(true, Ordering::Relaxed);
    let mut seen = prober.join().unwrap();
    report(
        &args,
        shape,
        &engines.published,
        elapsed,
        &mut seen,
        &cpu_before,
        &cpu_after,
    );
    print_cpu("publisher process", &BTreeMap::new(), &engines.cpu, elapsed);
    let cores = |ticks: u64| ticks as f64 / 100.0 / elapsed;
    let (busy, all) = (
        machine_after.0 - machine_before.0,
        machine_after.1 - machine_before.1,
    );
    println!(
        "router process in all: {:.2} cores; the machine: {:.2} of {:.2} cores busy (every process)",
        cores(own_after - own_before),
        cores(busy),
        cores(all)
    );
    let sum = |f: fn(&kvroute::kv_events::SubscriberStats) -> &std::sync::atomic::AtomicU64| {
        feeds
            .values()
            .filter_map(WorkerFeed::stats)
            .map(|s| f(s).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    println!(
        "feeds: {} batches, {} gaps, {} dropped, {} disconnects, {} restarts, {} duplicates",
        sum(|s| &s.batches),
        sum(|s| &s.gaps),
        sum(|s| &s.dropped),
        sum(|s| &s.disconnects),
        sum(|s| &s.restarts),
        sum(|s| &s.duplicates)
    );
    println!("index at the end: {} pairs", holdings.exact.entries());
    // Dropping 1,000 feeds removes their subscriptions one by one; the process ends instead.
    std::process::exit(0);
}

fn report(
    args: &Args,
    shape: Shape,
    published: &Published,
    elapsed: f64,
    seen: &mut Lookups,
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) {
    let w = f64::from(args.workers);
    println!(
        "target: {w} engines × {} batches/s × {} blocks/s ({} stored a batch) = {:.0} batches/s, {:.0} blocks/s",
        args.batches_per_s,
        args.blocks_per_s,
        shape.store,
        w * args.batches_per_s,
        w * args.blocks_per_s
    );
    println!(
        "published: {} batches, {} blocks in {elapsed:.1} s = {:.0} batches/s, {:.0} blocks/s; {} sends over 10 ms late",
        published.batches,
        published.blocks,
        published.batches as f64 / elapsed,
        published.blocks as f64 / elapsed,
        published.late
    );
    seen.lags_ms.sort_by(f64::total_cmp);
    let l = &seen.lags_ms;
    println!(
        "lag (publish → lookup sees it), {} tracers, {} unseen after 10 s: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        l.len(),
        seen.unseen,
        percentile(l, 0.5),
        percentile(l, 0.9),
        percentile(l, 0.99),
        percentile(l, 0.999),
        l.last().copied().unwrap_or(f64::NAN)
    );
    seen.lookup_us.sort_by(f64::total_cmp);
    let q = &seen.lookup_us;
    println!(
        "lookups of whole requests ({} blocks): {}, p50 {:.1} µs, p99 {:.1} µs",
        args.request_blocks,
        q.len(),
        percentile(q, 0.5),
        percentile(q, 0.99)
    );
    print_cpu("router side (this process)", before, after, elapsed);
}

/// CPU by thread kind between two readings, in cores over `elapsed` seconds.
fn print_cpu(
    what: &str,
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    elapsed: f64,
) {
    let hz = 100.0; // USER_HZ: /proc's ticks
    let mut total = 0.0;
    let mut rows = Vec::new();
    for (kind, &ticks) in after {
        let d = ticks.saturating_sub(before.get(kind).copied().unwrap_or(0)) as f64 / hz;
        total += d;
        if d > 0.0 {
            rows.push((kind.clone(), d));
        }
    }
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("{what} CPU: {:.2} cores over the phase", total / elapsed);
    for (kind, d) in rows {
        println!("  {kind:<24} {:.2} cores", d / elapsed);
    }
}
