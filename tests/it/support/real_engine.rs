//! What real engines (vLLM, SGLang) have in common as child processes of a test: the cache the
//! setup scripts fill, loopback ports that survive a restart, a process group per engine that
//! is stopped by id (also when a test panics, through `Drop`), readiness, logs, memory and
//! Prometheus readings. `vllm.rs` and `sglang.rs` only say how their engine is launched and
//! which of its metrics count prefix-cache hits, so every scenario runs on either engine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{quiet_port, quiet_ports};

/// How long one engine may take to answer `/health` (20–50 s measured; more on a busy machine).
const START_LIMIT: Duration = Duration::from_secs(600);

/// `${KVROUTE_ENGINE_CACHE:-$HOME/.cache/kvroute}`, where the setup scripts install engines.
pub fn engine_cache() -> PathBuf {
    std::env::var_os("KVROUTE_ENGINE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/kvroute")))
        .expect("neither KVROUTE_ENGINE_CACHE nor HOME is set")
}

/// Panics with the script to run when a setup's completion markers are missing: an ignored
/// test that is asked to run must never pass without an engine.
pub fn require_setup(root: &Path, script: &str) {
    let markers = [
        root.join("venv/.kvroute-complete"),
        root.join("models/.kvroute-complete"),
    ];
    if let Some(missing) = markers.iter().find(|m| !m.exists()) {
        panic!(
            "{} is not set up ({} is missing): run {script} first (it installs the engine and \
             builds the tiny model under {})",
            root.display(),
            missing.display(),
            engine_cache().display()
        );
    }
}

/// Builds the command that starts an engine on the given [`EngineProc`]'s ports.
pub type Launcher = Box<dyn Fn(&EngineProc) -> Command + Send + Sync>;

/// What differs between engines: their name, how one is launched, and the metric families
/// (prompt tokens served from the prefix cache, prompt tokens looked up) of its `/metrics`.
pub struct EngineKind {
    /// "vLLM" or "SGLang", for messages.
    pub name: &'static str,
    /// Worker ids are this prefix and a number.
    pub id_prefix: &'static str,
    pub hits_metric: &'static str,
    pub queries_metric: &'static str,
}

/// One engine's process group on loopback ports that survive a restart.
pub struct EngineProc {
    /// The worker id the router gives it.
    pub name: String,
    /// Its place among the engines started together (`name` is the kind's prefix and this).
    pub index: usize,
    kind: &'static EngineKind,
    pub http_port: u16,
    pub events_port: u16,
    replay_port: u16,
    /// A spare port for a side channel of the engine's own (vLLM's NIXL handshake listener).
    pub side_channel_port: u16,
    launcher: Launcher,
    child: Option<Child>,
    log: PathBuf,
}

impl EngineProc {
    /// Starts `n` engines of `kind` at once, each with the command `launcher` builds, and
    /// waits until all answer `/health`.
    pub async fn start_all(
        kind: &'static EngineKind,
        n: usize,
        launcher: impl Fn(&EngineProc) -> Command + Clone + Send + Sync + 'static,
    ) -> Vec<EngineProc> {
        let mut engines: Vec<EngineProc> = (0..n)
            .map(|i| {
                let mut e = EngineProc::new(kind, i, Box::new(launcher.clone()));
                e.launch();
                e
            })
            .collect();
        for e in &mut engines {
            e.ready().await;
        }
        engines
    }

    /// Picks the engine's ports; nothing runs until [`EngineProc::launch`].
    fn new(kind: &'static EngineKind, i: usize, launcher: Launcher) -> EngineProc {
        let name = format!("{}{i}", kind.id_prefix);
        let http_port = quiet_port();
        let log = std::env::temp_dir().join(format!(
            "kvroute-{}-{name}-{http_port}.log",
            kind.name.to_lowercase()
        ));
        // Room for two data-parallel ranks: an engine offsets rank N's event and replay ports
        // by N.
        let events_port = quiet_ports(4);
        EngineProc {
            name,
            index: i,
            kind,
            http_port,
            events_port,
            replay_port: events_port + 2,
            side_channel_port: quiet_port(),
            launcher,
            child: None,
            log,
        }
    }

    /// Starts the engine in a process group of its own, its output going to the engine's log.
    fn launch(&mut self) {
        use std::os::unix::process::CommandExt;
        let mut cmd = (self.launcher)(self);
        let log = std::fs::File::create(&self.log).expect("engine log file");
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("engine log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{} engine {} does not start: {e}",
                    self.kind.name, self.name
                )
            });
        self.child = Some(child);
    }

    /// Stops the engine and starts it again on the same ports (an empty cache).
    pub async fn restart(&mut self) {
        self.stop();
        self.launch();
        self.ready().await;
    }

    /// The engine's own counters: (prompt tokens served from its prefix cache, prompt tokens
    /// it looked up).
    pub async fn prefix_cache(&self) -> (f64, f64) {
        let text = self.metrics().await;
        (
            metric_sum(&text, self.kind.hits_metric),
            metric_sum(&text, self.kind.queries_metric),
        )
    }

    /// Waits until `/health` answers 200; panics with the log's tail if the engine exits or
    /// takes longer than [`START_LIMIT`].
    async fn ready(&mut self) {
        let http = reqwest::Client::new();
        let url = format!("{}/health", self.url());
        let end = Instant::now() + START_LIMIT;
        while Instant::now() < end {
            if let Ok(r) = http.get(&url).send().await
                && r.status().is_success()
            {
                return;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!(
                    "{} engine {} exited ({status}) before it was ready:\n{}",
                    self.kind.name,
                    self.name,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!(
            "{} engine {} was not ready within {START_LIMIT:?}:\n{}",
            self.kind.name,
            self.name,
            self.log_tail()
        );
    }

    /// The last lines of the engine's output, after the first lines that name an error
    /// (a Python engine's root cause is often far above its last traceback).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail_from = lines.len().saturating_sub(40);
        let causes: Vec<&str> = lines[..tail_from]
            .iter()
            .filter(|l| l.contains("Error:") || l.contains("error:"))
            .take(5)
            .copied()
            .collect();
        let mut out = String::new();
        if !causes.is_empty() {
            out.push_str("first errors in the log:\n");
            out.push_str(&causes.join("\n"));
            out.push_str("\n…\n");
        }
        out.push_str(&lines[tail_from..].join("\n"));
        out
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// Where the router subscribes to the engine's events (loopback).
    pub fn events_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.events_port)
    }

    pub fn replay_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.replay_port)
    }

    /// The engine's Prometheus text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.url()))
            .await
            .and_then(|r| r.error_for_status())
            .unwrap_or_else(|e| panic!("{} /metrics answers: {e}", self.kind.name))
            .text()
            .await
            .expect("/metrics body")
    }

    /// Resident memory of all the engine's processes, in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.child
            .as_ref()
            .map(|c| group_members(c.id()).iter().map(|&(_, rss)| rss).sum())
            .unwrap_or(0.0)
    }

    /// CPU seconds the engine has used so far: the process it was started as (vLLM's API
    /// server, which answers `/metrics`), and its whole process group (with the engine core).
    pub fn cpu_seconds(&self) -> (f64, f64) {
        let Some(leader) = self.child.as_ref().map(Child::id) else {
            return (0.0, 0.0);
        };
        let group: f64 = group_members(leader)
            .iter()
            .map(|&(pid, _)| cpu_seconds(pid))
            .sum();
        (cpu_seconds(leader), group)
    }

    /// SIGTERM to the engine's process group, SIGKILL after 30 s; returns when every process
    /// of the group is gone.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        stop_group(&mut child);
    }
}

/// SIGTERM to the process group `child` leads (one it was started as, with `process_group(0)`),
/// SIGKILL after 30 s; returns when every process of the group is gone.
pub fn stop_group(child: &mut Child) {
    let group = child.id();
    signal_group(group, "TERM");
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end && !group_members(group).is_empty() {
        let _ = child.try_wait();
        std::thread::sleep(Duration::from_millis(100));
    }
    if !group_members(group).is_empty() {
        signal_group(group, "KILL");
    }
    let _ = child.wait();
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && !group_members(group).is_empty() {
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for EngineProc {
    /// Stops the engine; keeps its log only when the test failed, and says where.
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "{} engine {} log: {}",
                self.kind.name,
                self.name,
                self.log.display()
            );
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// Sends `SIG<signal>` to every process of the group `group` (a group this module created).
fn signal_group(group: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}"), "--".into(), format!("-{group}")])
        .stderr(Stdio::null())
        .status();
}

/// The live (not zombie) processes of group `group` with their resident memory in MiB.
/// User + system CPU seconds of process `pid` (0 when it is gone).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    // After `)`: state is field 3, utime 14, stime 15 (in clock ticks, 100 a second).
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn group_members(group: u32) -> Vec<(u32, f64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp …`; comm may hold spaces, so split after its `)`.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(state), Some(pgrp)) = (fields.first(), fields.get(2)) else {
            continue;
        };
        if *state == "Z" || pgrp.parse::<u32>().ok() != Some(group) {
            continue;
        }
        found.push((pid, super::rss_mib(Some(pid)).1));
    }
    found
}

/// The sum of every sample of the metric family `name` (any labels).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let rest = rest.strip_prefix("_total").unwrap_or(rest);
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            l.rsplit_once(' ')?.1.trim().parse::<f64>().ok()
        })
        .sum()
}
