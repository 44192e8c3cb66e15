//! vLLM-style hand-off on the simulated engine, as vLLM 0.32.0's NixlConnector behaves where a
//! router can see it.
//!
//! A prefill asked for a remote decode (`kv_transfer_params.do_remote_decode`) runs one token,
//! keeps its blocks held, and answers with the parameters a decode engine needs to pull them
//! ([`Transfers::issue`]: `do_remote_prefill`, `remote_engine_id`, `remote_request_id`,
//! `remote_block_ids`, `remote_host`, `remote_port`, …). A decode given those parameters pulls
//! over real HTTP from the engine they name (`POST /kv_transfer/pull` on its HTTP port, which
//! stands in for NIXL's side channel): the prefill engine checks that the engine id is its own
//! and the request and block ids are ones it issued and still holds, releases the blocks, and
//! says how many tokens they hold; the decode then imports them after the engine's transfer
//! time. An unknown, expired or already pulled transfer fails the decode as the real one fails
//! (500, or a stream whose first event is the error).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::request::RequestId;

/// The path a decode engine pulls a prefill's KV from (the simulated side channel).
pub const PULL_PATH: &str = "/kv_transfer/pull";

/// What a request's `kv_transfer_params` ask of this engine.
#[derive(Clone, Debug, PartialEq)]
pub enum Remote {
    /// Prefill for a decode elsewhere (`do_remote_decode`).
    Decode,
    /// Decode a prompt prefilled elsewhere (`do_remote_prefill`), pulled from `Pull`.
    Prefill(Pull),
}

/// Where a decode pulls its prompt's KV from, as the prefill's parameters name it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pull {
    /// The prefill engine's id.
    pub engine_id: String,
    /// The prefill request's id there.
    pub request_id: String,
    /// The blocks it holds.
    pub block_ids: Vec<u64>,
    /// Its side channel's host and port.
    #[serde(skip)]
    pub host: String,
    #[serde(skip)]
    pub port: u16,
}

/// Reads a request's `kv_transfer_params` (`None`: absent, `null`, or asking nothing).
/// Parameters asking for a remote prefill without the fields to pull it are refused (vLLM's
/// NIXL scheduler dies on them; a simulated engine says what is missing).
pub fn read_params(body: &Value) -> Result<Option<Remote>, String> {
    let Some(p) = body.get("kv_transfer_params").filter(|p| !p.is_null()) else {
        return Ok(None);
    };
    let Some(p) = p.as_object() else {
        return Err("`kv_transfer_params` must be an object".into());
    };
    let yes = |k: &str| p.get(k).and_then(Value::as_bool) == Some(true);
    if yes("do_remote_decode") {
        return Ok(Some(Remote::Decode));
    }
    if !yes("do_remote_prefill") {
        return Ok(None);
    }
    let text = |k: &str| {
        p.get(k)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                format!("`kv_transfer_params.{k}` is missing: a remote prefill needs it")
            })
    };
    let port = p
        .get("remote_port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .ok_or("`kv_transfer_params.remote_port` is missing or not a port")?;
    let block_ids = p
        .get("remote_block_ids")
        .and_then(Value::as_array)
        .and_then(|groups| groups.first())
        .and_then(Value::as_array)
        .map(|ids| ids.iter().filter_map(Value::as_u64).collect())
        .ok_or("`kv_transfer_params.remote_block_ids` is missing: a remote prefill needs it")?;
    Ok(Some(Remote::Prefill(Pull {
        engine_id: text("remote_engine_id")?,
        request_id: text("remote_request_id")?,
        block_ids,
        host: text("remote_host")?,
        port,
    })))
}

/// A finished prefill whose blocks wait for their decode.
#[derive(Debug)]
struct Held {
    rank: usize,
    id: RequestId,
    tokens: usize,
    block_ids: Vec<u64>,
    until: Instant,
}

/// This engine's held prefills and its way to pull from others.
pub struct Transfers {
    /// The engine's id (vLLM's `engine_id`, a uuid per engine).
    pub engine_id: String,
    /// The host and port decode engines reach this one at.
    pub host: String,
    pub port: u16,
    /// How long a prefill's blocks wait for their decode (the engine core releases them then).
    pub hold: Duration,
    held: Mutex<HashMap<String, Held>>,
    next_block: AtomicU64,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Transfers {
    /// The transfers of an engine reached at `host:port`, holding prefills for `hold`.
    pub fn new(host: String, port: u16, hold: Duration) -> Transfers {
        Transfers {
            engine_id: format!("sim-{:016x}", rand::random::<u64>()),
            host,
            port,
            hold,
            held: Mutex::new(HashMap::new()),
            next_block: AtomicU64::new(1),
            client: Client::builder(hyper_util::rt::TokioExecutor::new()).build_http(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers finished prefill `id` on `rank` (`tokens` prompt tokens in `block_size`-token
    /// blocks) and returns the `kv_transfer_params` its answer carries.
    pub fn issue(&self, rank: usize, id: RequestId, tokens: usize, block_size: usize) -> Value {
        let blocks = tokens.div_ceil(block_size.max(1)) as u64;
        let first = self.next_block.fetch_add(blocks, Ordering::Relaxed);
        let block_ids: Vec<u64> = (first..first + blocks).collect();
        let request_id = format!("cmpl-{}-{rank}-{}", self.engine_id, id.0);
        let now = Instant::now();
        let mut held = self.lock();
        held.retain(|_, h| h.until > now);
        held.insert(
            request_id.clone(),
            Held {
                rank,
                id,
                tokens,
                block_ids: block_ids.clone(),
                until: now + self.hold,
            },
        );
        json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": [block_ids],
            "remote_engine_id": self.engine_id,
            "remote_request_id": request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": tokens,
            "remote_blocks_expiry_time": null,
            "transfer_mode": "pull",
        })
    }

    /// Pulls `pull` from the engine it names: the prompt tokens its blocks hold, or why not.
    pub async fn pull(&self, pull: &Pull, wait: Duration) -> Result<usize, String> {
        let uri = format!("http://{}:{}{PULL_PATH}", pull.host, pull.port);
        let body = serde_json::to_vec(pull).map_err(|e| e.to_string())?;
        let req = http::Request::post(&uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(wait, self.client.request(req))
            .await
            .map_err(|_| format!("the prefill engine at {uri} did not answer within {wait:?}"))?
            .map_err(|e| format!("cannot reach the prefill engine at {uri}: {e}"))?;
        tokens_of(
            resp,
            "the prefill engine refused the transfer",
            "the prefill engine",
        )
        .await
    }
}

impl Transfers {
    /// Takes the held prefill `pull` names: its rank, engine request id and prompt tokens, or
    /// the status and reason of a refusal (another engine's id: 409; unknown, expired or
    /// pulled already: 404; other blocks: 409).
    pub fn take(&self, pull: &Pull) -> Result<(usize, RequestId, usize), (StatusCode, String)> {
        if pull.engine_id != self.engine_id {
            return Err((
                StatusCode::CONFLICT,
                format!(
                    "engine `{}` was asked for a transfer of engine `{}`",
                    self.engine_id, pull.engine_id
                ),
            ));
        }
        let mut map = self.lock();
        let held = match map.get(&pull.request_id) {
            Some(h) if h.until <= Instant::now() => {
                map.remove(&pull.request_id);
                None
            }
            Some(h) if h.block_ids != pull.block_ids => {
                return Err((
                    StatusCode::CONFLICT,
                    format!("request `{}` holds other blocks", pull.request_id),
                ));
            }
            Some(_) => map.remove(&pull.request_id),
            None => None,
        };
        held.map(|h| (h.rank, h.id, h.tokens)).ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!(
                    "no held prefill `{}`: unknown, expired or already pulled",
                    pull.request_id
                ),
            )
        })
    }
}

/// The prompt tokens a prefill engine answered a hand-off with (`{"tokens": N}`), or why it
/// refused (`refusal` and its error message). Shared by vLLM's pull and SGLang's bootstrap
/// room, which answer alike.
pub(super) async fn tokens_of(
    resp: http::Response<hyper::body::Incoming>,
    refusal: &str,
    peer: &str,
) -> Result<usize, String> {
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if !status.is_success() {
        let why = answer["error"]["message"]
            .as_str()
            .unwrap_or("no reason given");
        return Err(format!("{refusal} ({status}): {why}"));
    }
    answer["tokens"]
        .as_u64()
        .map(|t| t as usize)
        .ok_or_else(|| format!("{peer}'s answer names no tokens"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_read_as_the_connector_reads_them() {
        assert_eq!(read_params(&json!({"prompt": "x"})), Ok(None));
        assert_eq!(read_params(&json!({"kv_transfer_params": null})), Ok(None));
        assert_eq!(
            read_params(&json!({"kv_transfer_params": {"do_remote_decode": true}})),
            Ok(Some(Remote::Decode))
        );
        let t = Transfers::new("127.0.0.1".into(), 9, Duration::from_secs(30));
        let issued = t.issue(0, RequestId(7), 40, 16);
        assert_eq!(issued["remote_block_ids"][0].as_array().unwrap().len(), 3);
        match read_params(&json!({"kv_transfer_params": issued})) {
            Ok(Some(Remote::Prefill(p))) => {
                assert_eq!((p.engine_id, p.port), (t.engine_id.clone(), 9));
                assert_eq!(p.block_ids, [1, 2, 3]);
            }
            other => panic!("{other:?}"),
        }
        let e = read_params(&json!({"kv_transfer_params": {"do_remote_prefill": true}}));
        assert!(e.unwrap_err().contains("remote_port"));
    }
}
