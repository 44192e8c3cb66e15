//! Simulated engines (`kvroute::engine`) in this process, publishing real KV events over
//! ZeroMQ with a replay endpoint, for the routing tests that need engines the router can see.

use std::net::SocketAddr;

use kvroute::engine::{EngineArgs, EngineCoreArgs, EngineHandle};
use kvroute::fleet::Role;
use kvroute::kv_events::{Publisher, PublisherConfig};
use tokio::net::TcpListener;

/// A running simulated engine and where it listens.
pub struct SimEngine {
    pub handle: EngineHandle,
    /// Its HTTP address.
    pub addr: SocketAddr,
    /// Its KV-event PUB endpoint.
    pub events: String,
    /// Its replay endpoint.
    pub replay: String,
}

impl SimEngine {
    /// Starts an engine serving `model` on ephemeral ports.
    pub async fn start(model: &str, seed: u64, speedup: f64) -> SimEngine {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        SimEngine::start_at(
            model,
            any,
            "tcp://127.0.0.1:*",
            "tcp://127.0.0.1:*",
            seed,
            speedup,
        )
        .await
    }

    /// Starts an engine serving `model` on the given HTTP address and event/replay endpoints
    /// (a port 0 or `*` picks a free one), e.g. to restart one where it was.
    pub async fn start_at(
        model: &str,
        addr: SocketAddr,
        events: &str,
        replay: &str,
        seed: u64,
        speedup: f64,
    ) -> SimEngine {
        let core = EngineCoreArgs {
            engine_speedup: speedup,
            ..EngineCoreArgs::default()
        };
        SimEngine::start_with(model, addr, events, replay, seed, core).await
    }

    /// Starts an engine serving `model` on ephemeral ports with the engine settings `core`.
    pub async fn start_with_core(model: &str, core: EngineCoreArgs) -> SimEngine {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        SimEngine::start_with(
            model,
            any,
            "tcp://127.0.0.1:*",
            "tcp://127.0.0.1:*",
            0,
            core,
        )
        .await
    }

    /// Starts an engine serving `model` on ephemeral ports with `block_size` tokens per KV block.
    pub async fn start_with_block_size(model: &str, block_size: usize) -> SimEngine {
        let core = EngineCoreArgs {
            block_size,
            ..EngineCoreArgs::default()
        };
        SimEngine::start_with_core(model, core).await
    }

    /// Starts an engine serving `model` on ephemeral ports that takes prompts and outputs of at
    /// most `max_model_len` tokens (and reports it in `/v1/models`).
    pub async fn start_with_context(model: &str, max_model_len: usize) -> SimEngine {
        let core = EngineCoreArgs {
            max_model_len: Some(max_model_len),
            ..EngineCoreArgs::default()
        };
        SimEngine::start_with_core(model, core).await
    }

    /// Starts an engine serving `model` on an ephemeral port without KV events, tokenizing with
    /// `tokenizer` (`builtin`, or a Hugging Face tokenizer directory).
    pub async fn start_plain(model: &str, tokenizer: &str) -> SimEngine {
        let args = EngineArgs {
            model: model.into(),
            kv_events_endpoint: "none".into(),
            tokenizer: tokenizer.into(),
            ..EngineArgs::default()
        };
        SimEngine::serve(args, "none".into(), "none".into()).await
    }

    /// [`SimEngine::start_plain`] with a context of `max_model_len` tokens (reported in
    /// `/v1/models`).
    pub async fn start_plain_with_context(
        model: &str,
        tokenizer: &str,
        max_model_len: usize,
    ) -> SimEngine {
        let args = EngineArgs {
            model: model.into(),
            kv_events_endpoint: "none".into(),
            tokenizer: tokenizer.into(),
            core: EngineCoreArgs {
                max_model_len: Some(max_model_len),
                ..EngineCoreArgs::default()
            },
            ..EngineArgs::default()
        };
        SimEngine::serve(args, "none".into(), "none".into()).await
    }

    /// Starts a simulated engine with `ranks` data-parallel ranks behind one ephemeral HTTP
    /// port: rank N publishes on `events` port + N and replays on `replay` port + N (the
    /// engine's `auto` replay port: the events port + `ranks`).
    pub async fn start_data_parallel(model: &str, ranks: u32) -> SimEngine {
        let base = crate::support::quiet_ports(2 * ranks as u16);
        let args = EngineArgs {
            model: model.into(),
            kv_events_endpoint: format!("tcp://127.0.0.1:{base}"),
            kv_replay_endpoint: "auto".into(),
            data_parallel_size: ranks,
            ..EngineArgs::default()
        };
        let replay = format!("tcp://127.0.0.1:{}", base + ranks as u16);
        SimEngine::serve(args, format!("tcp://127.0.0.1:{base}"), replay).await
    }

    /// Starts an engine serving `model` on ephemeral ports, publishing KV events, as a `role`
    /// engine of a disaggregated fleet; with `bootstrap`, it runs a bootstrap server (SGLang
    /// style) on an ephemeral port ([`SimEngine::bootstrap_port`]).
    pub async fn start_role(model: &str, role: Role, bootstrap: bool) -> SimEngine {
        let args = EngineArgs {
            model: model.into(),
            kv_events_endpoint: "none".into(),
            role,
            bootstrap_port: bootstrap.then_some(0),
            bootstrap_wait_s: 5.0,
            ..EngineArgs::default()
        };
        let mut serve = args.serve_config().unwrap();
        let publisher = Publisher::bind(
            PublisherConfig::new("tcp://127.0.0.1:*").with_replay("tcp://127.0.0.1:*"),
        )
        .unwrap();
        let events = publisher.endpoint().to_string();
        let replay = publisher.replay_endpoint().unwrap().to_string();
        serve.events = Box::new(publisher);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = kvroute::engine::start(serve, listener).await.unwrap();
        SimEngine {
            handle,
            addr,
            events,
            replay,
        }
    }

    /// The port of its bootstrap server (an engine started with one).
    pub fn bootstrap_port(&self) -> u16 {
        self.handle
            .bootstrap_addr()
            .expect("a bootstrap server")
            .port()
    }

    /// Serves `args` on an ephemeral loopback port; `events` and `replay` are the endpoints
    /// the router is told.
    async fn serve(args: EngineArgs, events: String, replay: String) -> SimEngine {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = kvroute::engine::start(args.serve_config().unwrap(), listener)
            .await
            .unwrap();
        SimEngine {
            handle,
            addr,
            events,
            replay,
        }
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The worker `id` serving `model` on this engine, with its KV events and replay.
    pub fn worker(&self, id: &str, model: &str) -> kvroute::fleet::WorkerSpec {
        kvroute::fleet::WorkerSpec {
            id: id.into(),
            url: kvroute::fleet::BaseUrl::parse(&self.url()).expect("an engine's own address"),
            models: vec![model.into()],
            kv_events: Some(self.events.clone()),
            kv_replay: Some(self.replay.clone()),
            kv_blocks: None,
            data_parallel_size: 1,
            role: Role::Both,
            bootstrap_port: None,
        }
    }

    /// [`SimEngine::worker`] without its KV events: the router predicts what it routed there.
    pub fn worker_without_events(&self, id: &str, model: &str) -> kvroute::fleet::WorkerSpec {
        kvroute::fleet::WorkerSpec {
            kv_events: None,
            kv_replay: None,
            ..self.worker(id, model)
        }
    }

    /// A router configuration from TOML `text` routing `model` over `engines` (workers `e0`,
    /// `e1`, … in order, each with its KV events and replay).
    pub fn config_over(text: &str, engines: &[SimEngine], model: &str) -> kvroute::config::Config {
        let mut config = kvroute::config::Config::from_toml(text, std::path::Path::new("test"))
            .expect("a valid test configuration");
        config.workers = engines
            .iter()
            .enumerate()
            .map(|(i, e)| e.worker(&format!("e{i}"), model))
            .collect();
        config
    }

    async fn start_with(
        model: &str,
        addr: SocketAddr,
        events: &str,
        replay: &str,
        seed: u64,
        core: EngineCoreArgs,
    ) -> SimEngine {
        let args = EngineArgs {
            model: model.into(),
            kv_events_endpoint: "none".into(),
            core,
            seed,
            ..EngineArgs::default()
        };
        let mut serve = args.serve_config().unwrap();
        let publisher = Publisher::bind(PublisherConfig::new(events).with_replay(replay)).unwrap();
        let events = publisher.endpoint().to_string();
        let replay = publisher.replay_endpoint().unwrap().to_string();
        serve.events = Box::new(publisher);
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = kvroute::engine::start(serve, listener).await.unwrap();
        SimEngine {
            handle,
            addr,
            events,
            replay,
        }
    }
}
