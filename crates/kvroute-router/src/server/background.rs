//! The tasks behind every face of the router: what keeps the fleet known and current.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::AppState;
use crate::config::Config;
use crate::fleet::{health, load_poller};

/// Starts what keeps the fleet known and current, whatever face the router shows (`serve`'s
/// HTTP front door or `epp`'s gRPC): the workers' lifecycle, health checks, discovery and the
/// load poller. The tasks are returned to be aborted when the face stops.
pub fn start_background(
    state: &Arc<AppState>,
    config: &Config,
    stop: &CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    state.lifecycle.start();
    let mut tasks = vec![
        health::spawn(
            Arc::clone(&state.fleet),
            config.health.clone(),
            &config.proxy.tls,
            health::EngineHooks {
                capacity: Some(state.lifecycle.capacity_hook()),
                block_size: Some(state.lifecycle.block_size_hook()),
            },
            stop.clone(),
        )
        .map_err(|e| anyhow::anyhow!("proxy.tls: {e}"))?,
    ];
    tasks.extend(crate::discovery::spawn(
        &config.discovery,
        &state.lifecycle,
        &state.metrics,
        config.health.timeout,
        state.own_addrs(),
        stop,
    ));
    if let Some(bus) = &config.replica_bus {
        tasks.push(crate::replica_bus::spawn(
            bus.clone(),
            crate::replica_bus::Replica {
                fleet: Arc::clone(&state.fleet),
                holdings: Arc::clone(&state.holdings),
                clock: state.started,
            },
            state.metrics.replica_bus.clone(),
            stop.clone(),
        ));
    }
    if !config.health.load_interval.is_zero() {
        tasks.push(
            load_poller::spawn(
                Arc::clone(&state.fleet),
                config.health.load_interval,
                &config.proxy.tls,
                stop.clone(),
            )
            .map_err(|e| anyhow::anyhow!("proxy.tls: {e}"))?,
        );
    }
    Ok(tasks)
}
