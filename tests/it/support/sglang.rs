//! Real SGLang engines (0.5.23, its CPU engine) as child processes, for the `real_sglang*`
//! tests.
//!
//! `scripts/real-engines/sglang-setup.sh` installs SGLang and builds the tiny model into a
//! cache outside the clone; [`SglangSetup::locate`] finds them there (and fails with what to
//! run when they are missing). The process handling is [`EngineProc`]'s; this file says how
//! `sglang.launch_server` is started: on the CPU engine, with the project's `sgl_kernel` shim
//! on `PYTHONPATH` (no CPU build of SGLang's kernels exists in the package registry; see
//! `scripts/real-engines/sgl_kernel_shim`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use super::real_engine::{EngineKind, EngineProc, engine_cache, require_setup};
use super::real_router::{MODEL, RouterModel};

/// SGLang's page size, its KV block: 16 works on CPU (vLLM's CPU build needs 32).
pub const SGLANG_PAGE: u32 = 16;

/// Where the setup script put SGLang and the model.
#[derive(Clone, Debug)]
pub struct SglangSetup {
    pub python: PathBuf,
    /// The directory holding the `sgl_kernel` shim package (put on `PYTHONPATH`).
    pub shim: PathBuf,
    pub model: PathBuf,
}

impl SglangSetup {
    /// Finds the installation under `${KVROUTE_ENGINE_CACHE:-$HOME/.cache/kvroute}`; panics
    /// with the command to run when it is missing.
    pub fn locate() -> SglangSetup {
        let root = engine_cache().join("sglang-0.5.23");
        require_setup(&root, "scripts/real-engines/sglang-setup.sh");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        SglangSetup {
            python: root.join("venv/bin/python"),
            shim: repo.join("scripts/real-engines/sgl_kernel_shim"),
            model: root.join("models/tiny-qwen3"),
        }
    }
}

impl RouterModel for SglangSetup {
    fn tokenizer_dir(&self) -> PathBuf {
        self.model.clone()
    }
    fn engine(&self) -> &'static str {
        "sglang"
    }
    fn block_size(&self) -> u32 {
        SGLANG_PAGE
    }
}

/// How an engine is started.
#[derive(Clone, Debug)]
pub struct SglangOptions {
    /// KV cache size in tokens (`--max-total-tokens`; pages = this / [`SGLANG_PAGE`]).
    pub max_total_tokens: usize,
    /// `--context-length` (must fit in the cache).
    pub context_length: usize,
}

impl Default for SglangOptions {
    fn default() -> Self {
        SglangOptions {
            max_total_tokens: 65536,
            context_length: 4096,
        }
    }
}

/// SGLang as the tests see it: worker ids `s0`, `s1`, …, and its prompt-token counters
/// (`sglang:cached_tokens_total` counts prompt tokens served from the radix cache).
pub static SGLANG: EngineKind = EngineKind {
    name: "SGLang",
    id_prefix: "s",
    hits_metric: "sglang:cached_tokens",
    queries_metric: "sglang:prompt_tokens",
};

/// Starts `sglang.launch_server` engines (HTTP server, scheduler and detokenizer processes).
pub struct SglangEngine;

impl SglangEngine {
    /// Starts `n` engines at once and waits until all answer `/health`.
    pub async fn start_all(
        setup: &SglangSetup,
        n: usize,
        options: &SglangOptions,
    ) -> Vec<EngineProc> {
        let (setup, options) = (setup.clone(), options.clone());
        EngineProc::start_all(&SGLANG, n, move |e| command(&setup, &options, e)).await
    }

    /// Starts one engine per entry of `options` at once (engine `i` with `options[i]`).
    pub async fn start_each(setup: &SglangSetup, options: &[SglangOptions]) -> Vec<EngineProc> {
        let (setup, options) = (setup.clone(), options.to_vec());
        let n = options.len();
        EngineProc::start_all(&SGLANG, n, move |e| command(&setup, &options[e.index], e)).await
    }
}

/// The command that starts `sglang.launch_server` on `e`'s ports.
fn command(setup: &SglangSetup, o: &SglangOptions, e: &EngineProc) -> Command {
    // `bind: true` makes SGLang bind the loopback address itself; without it, as in
    // vLLM, only wildcard (or ipc/inproc) endpoints are bound and any other is connected
    // to, publishing nothing.
    let events = json!({
        "publisher": "zmq",
        "endpoint": e.events_endpoint(),
        "bind": true,
        "replay_endpoint": e.replay_endpoint(),
        "buffer_steps": 10000,
    });
    let mut cmd = Command::new(&setup.python);
    cmd.args(["-m", "sglang.launch_server", "--model-path"])
        .arg(&setup.model)
        .args(["--served-model-name", MODEL])
        .args(["--host", "127.0.0.1", "--port", &e.http_port.to_string()])
        .args(["--device", "cpu", "--attention-backend", "torch_native"])
        .args(["--page-size", &SGLANG_PAGE.to_string()])
        .args(["--max-total-tokens", &o.max_total_tokens.to_string()])
        .args(["--context-length", &o.context_length.to_string()])
        .args(["--max-running-requests", "8", "--random-seed", "0"])
        .args(["--enable-cache-report", "--enable-metrics"])
        .arg("--skip-server-warmup")
        .args(["--kv-events-config", &events.to_string()]);
    let pythonpath = match std::env::var_os("PYTHONPATH") {
        Some(p) => {
            let mut paths = vec![setup.shim.clone()];
            paths.extend(std::env::split_paths(&p));
            std::env::join_paths(paths).expect("PYTHONPATH")
        }
        None => setup.shim.clone().into_os_string(),
    };
    cmd.env("PYTHONPATH", pythonpath);
    for (k, v) in [
        ("SGLANG_USE_CPU_ENGINE", "1"),
        ("OMP_NUM_THREADS", "1"),
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
    ] {
        cmd.env(k, v);
    }
    cmd
}
