//! SGLang-style hand-off on the simulated engine, as SGLang 0.5.23's disaggregation pairs a
//! prefill and a decode server.
//!
//! Both engines get the same request with `bootstrap_host`, `bootstrap_port` and
//! `bootstrap_room`. The prefill engine runs it for one token, keeps the blocks, and marks the
//! room ready on its bootstrap server (a listener of its own, on `--bootstrap-port`, as
//! SGLang's). The decode engine asks that server — real TCP, at the host and port the request
//! names — for the room: the server waits until the room's prefill is done (within the wait
//! SGLang bounds by `SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`), releases its blocks and says how
//! many tokens they hold; the decode then imports them after the engine's transfer time. A room
//! no prefill ever opens, or a server that is not there, fails the decode.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;
use tokio::sync::Notify;

use super::kv_transfer::tokens_of;
use super::request::RequestId;

/// A request's bootstrap fields: where its prefill's bootstrap server is, and the room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bootstrap {
    /// The prefill engine's host.
    pub host: String,
    /// Its bootstrap port.
    pub port: u16,
    /// The room both requests name.
    pub room: u64,
}

/// Reads `bootstrap_host`, `bootstrap_port` and `bootstrap_room` (`None` without a room).
pub fn read_bootstrap(body: &Value) -> Result<Option<Bootstrap>, String> {
    let Some(room) = body.get("bootstrap_room").filter(|r| !r.is_null()) else {
        return Ok(None);
    };
    let room = room
        .as_u64()
        .filter(|r| *r <= i64::MAX as u64)
        .ok_or("`bootstrap_room` must be an integer from 0 to 2^63 - 1")?;
    let host = body
        .get("bootstrap_host")
        .and_then(Value::as_str)
        .ok_or("`bootstrap_host` is missing: it names the prefill server")?
        .to_owned();
    let port = body
        .get("bootstrap_port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .ok_or("`bootstrap_port` is missing or not a port")?;
    Ok(Some(Bootstrap { host, port, room }))
}

/// A room on the prefill engine.
#[derive(Clone, Copy, Debug)]
enum Room {
    /// Its prefill runs.
    Open { since: Instant },
    /// Its prefill is done; its blocks are held for the decode.
    Ready {
        rank: usize,
        id: RequestId,
        tokens: usize,
        since: Instant,
    },
}

/// The rooms of this (prefill) engine, and the client a decode engine joins rooms with.
pub struct Rooms {
    rooms: Mutex<HashMap<u64, Room>>,
    changed: Notify,
    /// How long a room waits for its other side.
    pub wait: Duration,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Rooms {
    /// Rooms that wait `wait` for their other side.
    pub fn new(wait: Duration) -> Rooms {
        Rooms {
            rooms: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            wait,
            client: Client::builder(hyper_util::rt::TokioExecutor::new()).build_http(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Room>> {
        self.rooms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A prefill for `room` started.
    pub fn open(&self, room: u64) {
        let now = Instant::now();
        let mut rooms = self.lock();
        let stale = self.wait * 2;
        rooms.retain(|_, r| match r {
            Room::Open { since } | Room::Ready { since, .. } => now.duration_since(*since) < stale,
        });
        rooms.insert(room, Room::Open { since: now });
        drop(rooms);
        self.changed.notify_waiters();
    }

    /// `room`'s prefill finished as request `id` on `rank`, its `tokens` held.
    pub fn ready(&self, room: u64, rank: usize, id: RequestId, tokens: usize) {
        self.lock().insert(
            room,
            Room::Ready {
                rank,
                id,
                tokens,
                since: Instant::now(),
            },
        );
        self.changed.notify_waiters();
    }

    /// `room`'s prefill failed: its decode must not wait for it.
    pub fn close(&self, room: u64) {
        self.lock().remove(&room);
        self.changed.notify_waiters();
    }

    /// Waits until `room` is ready, then takes it.
    pub async fn take(&self, room: u64) -> Option<(usize, RequestId, usize)> {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut rooms = self.lock();
                if let Some(Room::Ready {
                    rank, id, tokens, ..
                }) = rooms.get(&room).copied()
                {
                    rooms.remove(&room);
                    return Some((rank, id, tokens));
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Joins `bootstrap`'s room on its prefill engine (real HTTP to its bootstrap server): the
    /// prompt tokens its blocks hold, or why not.
    pub async fn join(&self, bootstrap: &Bootstrap) -> Result<usize, String> {
        let uri = format!(
            "http://{}:{}/rooms/{}",
            bootstrap.host, bootstrap.port, bootstrap.room
        );
        let req = http::Request::get(&uri)
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let wait = self.wait + Duration::from_secs(1);
        let resp = tokio::time::timeout(wait, self.client.request(req))
            .await
            .map_err(|_| format!("the bootstrap server at {uri} did not answer within {wait:?}"))?
            .map_err(|e| format!("cannot reach the bootstrap server at {uri}: {e}"))?;
        let refusal = format!("bootstrap room {} failed", bootstrap.room);
        tokens_of(resp, &refusal, "the bootstrap server").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    #[test]
    fn bootstrap_fields_are_read() {
        assert_eq!(read_bootstrap(&json!({"prompt": "x"})), Ok(None));
        let b = json!({"bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 5});
        assert_eq!(
            read_bootstrap(&b),
            Ok(Some(Bootstrap {
                host: "10.0.0.1".into(),
                port: 8998,
                room: 5
            }))
        );
        assert!(read_bootstrap(&json!({"bootstrap_room": 5})).is_err());
        assert!(
            read_bootstrap(
                &json!({"bootstrap_room": -1, "bootstrap_host": "h", "bootstrap_port": 1})
            )
            .is_err()
        );
    }

    #[tokio::test]
    async fn a_room_is_taken_once_its_prefill_is_ready() {
        let rooms = Arc::new(Rooms::new(Duration::from_secs(5)));
        rooms.open(9);
        let waiter = tokio::spawn({
            let rooms = Arc::clone(&rooms);
            async move { rooms.take(9).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        rooms.ready(9, 0, RequestId(3), 64);
        assert_eq!(waiter.await.unwrap(), Some((0, RequestId(3), 64)));
        let short = Rooms::new(Duration::from_millis(30));
        assert_eq!(short.take(1).await, None);
    }
}
