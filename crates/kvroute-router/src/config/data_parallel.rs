//! A data-parallel worker's description: its size, and event endpoints each of its ranks can
//! be found at. vLLM (`ZmqEventPublisher.offset_endpoint_port`) and SGLang offset a rank's
//! event and replay ports by the rank, so the endpoints must be `tcp://` with room above them,
//! and the events and replay port ranges must not overlap. Shared by `[[workers]]`, the admin
//! API (through `check_worker`) and `[discovery.dns]`.

use thiserror::Error;

use crate::fleet::MAX_DATA_PARALLEL_SIZE;
use crate::fleet::rank::rank_endpoint;

/// What is wrong with a data-parallel description, and in which field.
#[derive(Debug, Error, PartialEq)]
#[error("{message}")]
pub struct DataParallelError {
    /// `data_parallel_size`, `kv_events` or `kv_replay`.
    pub field: &'static str,
    /// What is wrong and what to write instead.
    pub message: String,
}

fn error(field: &'static str, message: String) -> DataParallelError {
    DataParallelError { field, message }
}

/// The data-parallel size as given (a `[[workers]]` entry, an admin API body, `[discovery.dns]`):
/// absent means 1.
pub fn data_parallel_size(value: Option<i64>) -> Result<u32, DataParallelError> {
    match value {
        None => Ok(1),
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_DATA_PARALLEL_SIZE).contains(n))
            .ok_or_else(|| {
                error(
                    "data_parallel_size",
                    format!(
                        "{n} is not a data-parallel size: give the engine's --data-parallel-size, \
                         from 1 to {MAX_DATA_PARALLEL_SIZE}"
                    ),
                )
            }),
    }
}

/// Whether `size` ranks can be reached at `kv_events` and `kv_replay` (rank N at each port
/// plus N): a size within bounds, endpoints that can be offset (vLLM refuses an `ipc://` one
/// for ranks above 0), and port ranges that do not overlap on one host.
pub fn check_ranks(
    size: u32,
    kv_events: Option<&str>,
    kv_replay: Option<&str>,
) -> Result<(), DataParallelError> {
    if !(1..=MAX_DATA_PARALLEL_SIZE).contains(&size) {
        return Err(error(
            "data_parallel_size",
            format!(
                "must be from 1 to {MAX_DATA_PARALLEL_SIZE} (the engine's --data-parallel-size)"
            ),
        ));
    }
    for (field, ep) in [("kv_events", kv_events), ("kv_replay", kv_replay)] {
        if let Some(ep) = ep
            && rank_endpoint(ep, size - 1).is_none()
        {
            return Err(error(
                field,
                format!(
                    "`{ep}` cannot give each of {size} data-parallel ranks its own endpoint: \
                     rank N publishes on the port plus N, so write a tcp:// endpoint with a \
                     port of at most {}",
                    u32::from(u16::MAX).saturating_sub(size - 1)
                ),
            ));
        }
    }
    if let (Some(events), Some(replay)) = (kv_events, kv_replay)
        && size > 1
        && let (Some((eh, ep)), Some((rh, rp))) = (tcp_port(events), tcp_port(replay))
        && (eh == rh || eh == "*" || rh == "*")
        && ep.abs_diff(rp) < size
    {
        return Err(error(
            "kv_replay",
            format!(
                "`{replay}` overlaps the events ports of {size} data-parallel ranks ({events} \
                 plus 0..{size}): put the replay port at least {size} away from the events port"
            ),
        ));
    }
    Ok(())
}

/// The host and port of a `tcp://host:port` endpoint.
fn tcp_port(endpoint: &str) -> Option<(&str, u32)> {
    let (host, port) = endpoint.strip_prefix("tcp://")?.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}
