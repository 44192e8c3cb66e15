//! `kvroute demo`: a whole serving stack in one process, for trying kvroute without GPUs.
//!
//! N simulated engines (each a vLLM-like replica with its own KV cache and a KV-event
//! publisher on loopback) and a router in front of them, wired exactly as an operator would
//! wire real replicas: the router learns each engine's URL, model and event endpoints.

use std::net::SocketAddr;
use std::path::Path;

use clap::Args;
use tokio::net::TcpListener;

use crate::config::{Config, ConfigError};
use crate::fleet::{BaseUrl, WorkerSpec};
use crate::kv_events::{Publisher, PublisherConfig};
use crate::policy::PolicyKind;
use crate::server::RouterHandle;
use kvroute_lab::engine::{EngineArgs, EngineCoreArgs, EngineHandle};

/// `kvroute demo` flags.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Number of simulated engines.
    #[arg(long, default_value_t = 4)]
    pub engines: usize,
    /// Router address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// First engine HTTP port; engine i listens on this + i (0: any free port).
    #[arg(long, default_value_t = 8101)]
    pub engine_base_port: u16,
    /// Model name the engines serve.
    #[arg(long, default_value = "kvroute/sim")]
    pub model: String,
    /// Routing policy.
    #[arg(long, value_enum, default_value_t = PolicyKind::DEFAULT)]
    pub policy: PolicyKind,
    /// Every engine's KV cache shape, scheduler limits and step time (as `kvroute engine`).
    #[command(flatten)]
    pub core: EngineCoreArgs,
    /// `builtin`, or a Hugging Face tokenizer directory / tokenizer.json used by the engines and
    /// the router alike.
    #[arg(long, default_value = "builtin")]
    pub tokenizer: String,
}

impl Default for DemoArgs {
    fn default() -> Self {
        DemoArgs {
            engines: 4,
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            engine_base_port: 8101,
            model: "kvroute/sim".into(),
            policy: PolicyKind::DEFAULT,
            core: EngineCoreArgs::default(),
            tokenizer: "builtin".into(),
        }
    }
}

/// A running demo stack.
pub struct Demo {
    /// The router.
    pub router: RouterHandle,
    /// The engines, in worker order.
    pub engines: Vec<EngineHandle>,
}

impl Demo {
    /// Stops the router, then the engines.
    pub async fn shutdown(self) {
        self.router.shutdown().await;
        for e in self.engines {
            if let Err(err) = e.shutdown().await {
                tracing::warn!(error = %err, "engine did not stop cleanly");
            }
        }
    }
}

/// Starts the engines and the router; returns once all listen.
pub async fn start(args: &DemoArgs) -> anyhow::Result<Demo> {
    if args.engines == 0 {
        anyhow::bail!("--engines must be at least 1");
    }
    let mut engines = Vec::new();
    let mut workers = Vec::new();
    for i in 0..args.engines {
        let engine_args = EngineArgs {
            model: args.model.clone(),
            kv_events_endpoint: "none".into(),
            core: args.core.clone(),
            seed: i as u64,
            tokenizer: args.tokenizer.clone(),
            ..EngineArgs::default()
        };
        let mut serve = engine_args.serve_config()?;
        let publisher = Publisher::bind(
            PublisherConfig::new("tcp://127.0.0.1:*").with_replay("tcp://127.0.0.1:*"),
        )?;
        let events = publisher.endpoint().to_string();
        let replay = publisher.replay_endpoint().map(str::to_owned);
        serve.events = Box::new(publisher);
        let port = match args.engine_base_port {
            0 => 0,
            p => p
                .checked_add(i as u16)
                .ok_or_else(|| anyhow::anyhow!("engine port out of range"))?,
        };
        let listener = TcpListener::bind((args.listen.ip(), port))
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "engine {i}: cannot listen on port {port}: {e} (choose other ports with \
                     --engine-base-port N, or --engine-base-port 0 for any free ports)"
                )
            })?;
        let engine = kvroute_lab::engine::start(serve, listener).await?;
        let addr = engine.local_addr();
        workers.push(WorkerSpec {
            id: format!("engine-{i}"),
            url: BaseUrl::parse(&format!("http://{addr}")).map_err(anyhow::Error::msg)?,
            models: vec![args.model.clone()],
            kv_events: Some(events),
            kv_replay: replay,
            kv_blocks: None,
            data_parallel_size: 1,
            role: crate::fleet::Role::Both,
            bootstrap_port: None,
        });
        engines.push(engine);
    }
    let config = demo_config(args, workers)?;
    let listener = TcpListener::bind(args.listen).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on {}: {e} (choose another address with --listen HOST:PORT)",
            args.listen
        )
    })?;
    let router = crate::server::start(&config, listener)?;
    Ok(Demo { router, engines })
}

fn demo_config(args: &DemoArgs, workers: Vec<WorkerSpec>) -> Result<Config, ConfigError> {
    let tokenizer = if args.tokenizer == "builtin" {
        "builtin".to_string()
    } else {
        args.tokenizer.replace('\\', "\\\\").replace('"', "\\\"")
    };
    let text = format!(
        "policy = \"{}\"\n[server]\nlisten = \"{}\"\nshutdown_grace_s = 5.0\n[health]\ninterval_s = 1.0\n[[models]]\nname = \"{}\"\ntokenizer = \"{}\"\nblock_size = {}\n",
        args.policy, args.listen, args.model, tokenizer, args.core.block_size
    );
    let mut config = Config::from_toml(&text, Path::new("demo"))?;
    config.workers = workers;
    // The router's prior for a load from the engines' host-memory tier is their own link, as
    // an operator would set `[kv_aware.tiers]` to match the engines.
    if let Some(tier) = args.core.engine_config(0).cpu_tier {
        let tiers = &mut config.kv_aware.tiers;
        tiers.kv_bytes_per_token = tier.bytes_per_token;
        tiers.cpu.bandwidth_bytes_per_s = tier.read_bytes_per_s;
        tiers.cpu.latency_s = tier.latency_s;
    }
    Ok(config)
}

/// `kvroute demo`: runs until ctrl-c or SIGTERM.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let demo = start(&args).await?;
    let addr = demo.router.addr;
    println!(
        "kvroute demo: {} simulated engines behind the router",
        demo.engines.len()
    );
    for (i, e) in demo.engines.iter().enumerate() {
        println!("  engine-{i}: http://{}", e.local_addr());
    }
    println!("router: http://{addr}  (policy {})", args.policy);
    println!();
    println!("Send a request:");
    println!(
        "  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\": \"{}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 16}}'",
        args.model
    );
    println!("Read metrics:   curl -s http://{addr}/metrics | grep kvroute_");
    println!(
        "Explain a route: curl -s http://{addr}/debug/route -d '{{\"model\": \"{}\", \"prompt\": \"Hello\"}}'",
        args.model
    );
    println!("Stop with ctrl-c.");
    crate::server::shutdown_signal().await;
    println!("stopping…");
    demo.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_config_uses_current_keys() {
        let c = demo_config(&DemoArgs::default(), Vec::new()).unwrap();
        assert_eq!(c.policy, PolicyKind::DEFAULT);
        assert_eq!(c.listen, DemoArgs::default().listen);
        assert!(c.deprecations.is_empty(), "{:?}", c.deprecations);
    }

    /// `kvroute demo --cpu-tier-ratio R` gives every engine a host-memory tier, and the
    /// router the tier's link as the prior of its load price.
    #[test]
    fn a_tiered_demo_prices_loads_at_the_engines_link() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            demo: DemoArgs,
        }
        let args = Cli::try_parse_from([
            "demo",
            "--num-blocks",
            "100",
            "--cpu-tier-ratio",
            "2",
            "--cpu-tier-read-gbps",
            "20",
            "--cpu-tier-latency-ms",
            "3",
        ])
        .unwrap()
        .demo;
        let tier = args.core.engine_config(0).cpu_tier.unwrap();
        assert_eq!(tier.blocks, 200);
        let c = demo_config(&args, Vec::new()).unwrap();
        assert_eq!(c.kv_aware.tiers.cpu.bandwidth_bytes_per_s, 20e9);
        assert_eq!(c.kv_aware.tiers.cpu.latency_s, 0.003);
        assert_eq!(c.kv_aware.tiers.kv_bytes_per_token, tier.bytes_per_token);
        let untiered = demo_config(&DemoArgs::default(), Vec::new()).unwrap();
        let prior = crate::policy::KvAwareConfig::default().tiers;
        assert_eq!(untiered.kv_aware.tiers, prior);
    }
}
