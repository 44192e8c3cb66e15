//! The lag bench's engines in a process of their own, so the router side's CPU is measured
//! without the publishers' (in one process they were short of CPU and sent late).
//!
//! `benches/event_lag.rs` re-executes itself with `--publish`; that process binds the
//! engines' PUB sockets (`fleet_engines.rs`) and talks over its stdin/stdout, one line each:
//! it prints `ep <endpoint>` per engine and `ready`; on `fill` it fills every cache and prints
//! `filled <batches> <blocks>`; on `run` it publishes for the measured phase, printing
//! `t <worker> <request> <unix ns>` for each tracer as it is sent, then `published <batches>
//! <blocks> <late>`, `cpu whole_process <ticks>`, and `end`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvroute::tokens::HashSeed;

use super::fleet_engines::{Engine, Published, Shape, Tracer, drive, request};

/// What the publisher process is to do.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub workers: u32,
    pub threads: usize,
    pub shape: Shape,
    pub batches_per_s: f64,
    pub seconds: f64,
}

impl Plan {
    /// The fill phase: batches of 64 blocks, 10 a second per engine, until every cache is full.
    fn fill(&self) -> (Shape, f64, Duration) {
        let shape = Shape {
            store: 64,
            ..self.shape
        };
        let batches = self.shape.capacity.div_ceil(shape.store) + 1;
        (shape, 10.0, Duration::from_secs_f64(batches as f64 / 10.0))
    }
}

/// CPU ticks (USER_HZ) of every thread of this process, by thread name with digits dropped
/// (`kv-intake-3` → `kv-intake-`), so the kinds of threads can be compared.
pub fn cpu_by_kind() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name: String = stat[open + 1..close]
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .collect();
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        *out.entry(name).or_default() += ticks;
    }
    out
}

/// CPU ticks of this whole process so far, ended threads included (`/proc/self/stat`).
pub fn process_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rfind(')').map_or("", |i| &stat[i + 2..]);
    let f: Vec<&str> = after.split(' ').collect();
    f.get(11).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)
}

/// The whole machine's (busy, all) CPU ticks so far, every core and process (`/proc/stat`).
pub fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let n: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let all: u64 = n.iter().sum();
    // idle and iowait
    let idle = n.get(3).copied().unwrap_or(0) + n.get(4).copied().unwrap_or(0);
    (all - idle, all)
}

/// Publishes from `threads` threads over the engines until `until`; returns the engines.
fn run_engines(
    engines: Vec<Vec<Engine>>,
    shape: Shape,
    seed: HashSeed,
    hz: f64,
    until: Instant,
    tracers: Option<&mpsc::Sender<Tracer>>,
) -> (Vec<Vec<Engine>>, Published) {
    let handles: Vec<_> = engines
        .into_iter()
        .enumerate()
        .map(|(i, slice)| {
            let tx = tracers.cloned();
            std::thread::Builder::new()
                .name(format!("engines-{i}"))
                .spawn(move || drive(slice, shape, seed, hz, until, tx))
                .unwrap()
        })
        .collect();
    let mut total = Published::default();
    let mut back = Vec::new();
    for h in handles {
        let (slice, p) = h.join().unwrap();
        total.batches += p.batches;
        total.blocks += p.blocks;
        total.late += p.late;
        back.push(slice);
    }
    (back, total)
}

/// The `--publish` role: the engines, driven as the parent says. Never returns.
pub fn serve(plan: Plan, seed: HashSeed) -> ! {
    let per = (plan.workers as usize).div_ceil(plan.threads);
    let contexts: Vec<zmq::Context> = (0..plan.threads).map(|_| zmq::Context::new()).collect();
    let mut slices: Vec<Vec<Engine>> = (0..plan.threads).map(|_| Vec::new()).collect();
    let mut out = std::io::stdout().lock();
    for w in 0..plan.workers {
        let i = w as usize / per;
        let e = Engine::bind(&contexts[i], w);
        writeln!(out, "ep {}", e.endpoint).unwrap();
        slices[i].push(e);
    }
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    drop(out);
    let mut lines = std::io::stdin().lock().lines();
    let mut next = move || lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(next(), "fill");
    let (fill, hz, lasts) = plan.fill();
    let (slices, filled) = run_engines(slices, fill, seed, hz, Instant::now() + lasts, None);
    println!("filled {} {}", filled.batches, filled.blocks);
    assert_eq!(next(), "run");
    let (tx, rx) = mpsc::channel::<Tracer>();
    let printer = std::thread::spawn(move || {
        let mut out = std::io::stdout();
        for t in rx {
            writeln!(out, "t {} {} {}", t.worker, t.counter, t.published).unwrap();
            out.flush().unwrap();
        }
    });
    let before = process_ticks();
    let until = Instant::now() + Duration::from_secs_f64(plan.seconds);
    let (_slices, p) = run_engines(
        slices,
        plan.shape,
        seed,
        plan.batches_per_s,
        until,
        Some(&tx),
    );
    let after = process_ticks();
    drop(tx);
    printer.join().unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "published {} {} {}", p.batches, p.blocks, p.late).unwrap();
    // Its publisher threads have ended: the process's total counts them.
    writeln!(out, "cpu whole_process {}", after.saturating_sub(before)).unwrap();
    writeln!(out, "end").unwrap();
    out.flush().unwrap();
    std::process::exit(0);
}

/// The parent's side: the publisher process and its output.
pub struct Publishers {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    /// The engines' endpoints, in worker order.
    pub endpoints: Vec<String>,
}

/// What the publisher process reported of the measured phase.
pub struct PhaseReport {
    pub published: Published,
    /// Its threads' CPU ticks by kind.
    pub cpu: BTreeMap<String, u64>,
}

impl Publishers {
    /// Starts this executable with `--publish` and the given arguments; waits for the engines.
    pub fn start(args: &[String]) -> Publishers {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args(args)
            .arg("--publish")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut endpoints = Vec::new();
        loop {
            let line = lines.next().unwrap().unwrap();
            match line.strip_prefix("ep ") {
                Some(ep) => endpoints.push(ep.to_string()),
                None if line == "ready" => break,
                None => panic!("publisher process said {line:?}"),
            }
        }
        Publishers {
            child,
            stdin,
            lines,
            endpoints,
        }
    }

    fn tell(&mut self, what: &str) {
        writeln!(self.stdin, "{what}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Fills every cache; returns (batches, blocks) published.
    pub fn fill(&mut self) -> (u64, u64) {
        self.tell("fill");
        let line = self.lines.next().unwrap().unwrap();
        let n: Vec<u64> = line
            .split(' ')
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect();
        (n[0], n[1])
    }

    /// Runs the measured phase: each tracer goes to `tracers` (its hashes rebuilt from its
    /// engine and request number) as the process reports it.
    pub fn run(
        mut self,
        shape: Shape,
        seed: HashSeed,
        tracers: mpsc::Sender<Tracer>,
    ) -> PhaseReport {
        self.tell("run");
        let mut report = PhaseReport {
            published: Published::default(),
            cpu: BTreeMap::new(),
        };
        for line in self.lines.by_ref() {
            let line = line.unwrap();
            let f: Vec<&str> = line.split(' ').collect();
            match f[0] {
                "t" => {
                    let (worker, counter) = (f[1].parse().unwrap(), f[2].parse().unwrap());
                    let (hashes, _) = request(worker, counter, shape, seed);
                    let _ = tracers.send(Tracer {
                        published: f[3].parse().unwrap(),
                        worker,
                        counter,
                        hashes: hashes.into(),
                    });
                }
                "published" => {
                    report.published = Published {
                        batches: f[1].parse().unwrap(),
                        blocks: f[2].parse().unwrap(),
                        late: f[3].parse().unwrap(),
                    };
                }
                "cpu" => {
                    report.cpu.insert(f[1].to_string(), f[2].parse().unwrap());
                }
                "end" => break,
                _ => panic!("publisher process said {line:?}"),
            }
        }
        let _ = self.child.wait();
        report
    }
}
