//! A worker's data-parallel ranks: the routing targets behind one endpoint.
//!
//! A vLLM server started with `--data-parallel-size N` (SGLang: `--dp-size N`) runs N engine
//! cores behind one HTTP port, each with its own KV cache and scheduler. A request reaches the
//! rank named by its `X-data-parallel-rank` header (vLLM 0.32 `_get_data_parallel_rank`,
//! SGLang 0.5.23 `extract_routed_dp_rank_from_header`), or the server's own choice without one;
//! each rank publishes its KV events on the configured port plus its rank. So each rank is its
//! own target for routing — its own index entries, load and calibration, hence its own
//! [`WorkerId`] — while health, drain, the circuit and removal stay the worker's: the ranks
//! share one process and one front door.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::load::Load;
use super::worker_id::WorkerId;

/// The request header naming the rank that serves a request (both engines read it without
/// regard to case; vLLM spells it this way).
pub const DP_RANK_HEADER: &str = "x-data-parallel-rank";

/// Most ranks one worker may have: each is a routing target with its own metric series, so
/// the number is bounded (vLLM's largest published deployments run 32–64 ranks per server).
pub const MAX_DATA_PARALLEL_SIZE: u32 = 256;

/// One rank's live state.
#[derive(Debug)]
pub struct Rank {
    /// Its number, `0..data_parallel_size`.
    pub index: u32,
    /// Its identity in the index, load and calibration.
    pub key: WorkerId,
    /// Its name: the worker's id, or `id/dpN` when the worker has several ranks.
    pub label: Arc<str>,
    /// Router-side load of this rank.
    pub load: Arc<Load>,
    kv_warming: AtomicBool,
}

impl Rank {
    /// Rank `index` of the worker `id` with `size` ranks, known as `key`.
    pub(super) fn new(id: &str, size: u32, index: u32, key: WorkerId, load: Arc<Load>) -> Rank {
        Rank {
            index,
            key,
            label: rank_label(id, size, index).into(),
            load,
            kv_warming: AtomicBool::new(false),
        }
    }

    /// Whether its KV-event feed's warm-up replay runs.
    pub fn is_kv_warming(&self) -> bool {
        self.kv_warming.load(Ordering::Relaxed)
    }

    /// Records whether its warm-up replay runs.
    pub fn set_kv_warming(&self, warming: bool) {
        self.kv_warming.store(warming, Ordering::Relaxed);
    }
}

/// The name of rank `index` of worker `id` with `size` ranks: the id itself for a worker
/// without data parallelism (so its metric series and headers are what they always were),
/// else `id/dpN` — one series per rank, bounded by [`MAX_DATA_PARALLEL_SIZE`] per worker.
pub fn rank_label(id: &str, size: u32, index: u32) -> String {
    if size <= 1 {
        id.to_owned()
    } else {
        format!("{id}/dp{index}")
    }
}

/// The KV-event endpoint rank `rank` publishes on, given the worker's configured one: vLLM
/// and SGLang both offset a `tcp://` port by the rank (vLLM 0.32
/// `ZmqEventPublisher.offset_endpoint_port`) and leave rank 0's as configured. `None` when the
/// endpoint has no port to offset (an `ipc://` path: vLLM refuses one for ranks above 0).
pub fn rank_endpoint(endpoint: &str, rank: u32) -> Option<String> {
    if rank == 0 {
        return Some(endpoint.to_owned());
    }
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let port: u32 = port.parse().ok()?;
    let shifted = port
        .checked_add(rank)
        .filter(|p| *p <= u32::from(u16::MAX))?;
    (port != 0).then(|| format!("tcp://{host}:{shifted}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_keep_plain_workers_unchanged() {
        assert_eq!(rank_label("w1", 1, 0), "w1");
        assert_eq!(rank_label("w1", 2, 1), "w1/dp1");
    }

    #[test]
    fn endpoints_shift_by_rank_like_the_engines() {
        assert_eq!(
            rank_endpoint("tcp://*:5557", 0).as_deref(),
            Some("tcp://*:5557")
        );
        assert_eq!(
            rank_endpoint("tcp://10.0.0.1:5557", 3).as_deref(),
            Some("tcp://10.0.0.1:5560")
        );
        assert_eq!(
            rank_endpoint("tcp://[::1]:5557", 1).as_deref(),
            Some("tcp://[::1]:5558")
        );
        assert_eq!(rank_endpoint("ipc:///tmp/kv", 1), None);
        assert_eq!(
            rank_endpoint("ipc:///tmp/kv", 0).as_deref(),
            Some("ipc:///tmp/kv")
        );
        assert_eq!(rank_endpoint("tcp://h:65535", 1), None);
        assert_eq!(rank_endpoint("tcp://h:0", 1), None);
    }
}
