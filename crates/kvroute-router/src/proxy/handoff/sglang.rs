//! SGLang's hand-off (checked against SGLang 0.5.23: `bootstrap_host`, `bootstrap_port` and
//! `bootstrap_room` of its OpenAI and `/generate` request protocols, and its gateway's
//! `pd_router`, which sends both requests at once and answers with the decode's).

use bytes::Bytes;
use serde_json::Value;

use super::BodyError;
use crate::proxy::members::{self, Edit};

/// Where a prefill worker's bootstrap server pairs it with the decode worker, and the room
/// (a random 63-bit id) both requests name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bootstrap {
    /// The prefill worker's host, as the decode worker reaches it.
    pub host: String,
    /// Its `--disaggregation-bootstrap-port`.
    pub port: u16,
    /// The room both requests name.
    pub room: u64,
}

/// A fresh room id: random in `0..2^63` (SGLang reads it as a signed 64-bit integer).
pub fn random_room() -> u64 {
    rand::random::<u64>() & (i64::MAX as u64)
}

/// The request as both workers get it: the client's body with the bootstrap fields set (a
/// client's own are replaced: the pairing is the router's), written into its bytes
/// ([`members`]): nothing else changes.
pub fn with_bootstrap(body: &Bytes, bootstrap: &Bootstrap) -> Result<Bytes, BodyError> {
    let host = Value::String(bootstrap.host.clone()).to_string();
    let port = bootstrap.port.to_string();
    let room = bootstrap.room.to_string();
    Ok(members::edit(
        body,
        &[
            ("bootstrap_host", Edit::Set(host.as_bytes())),
            ("bootstrap_port", Edit::Set(port.as_bytes())),
            ("bootstrap_room", Edit::Set(room.as_bytes())),
        ],
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_requests_name_the_prefill_and_one_room() {
        let b = Bootstrap {
            host: "10.0.0.7".into(),
            port: 8998,
            room: random_room(),
        };
        assert!(b.room <= i64::MAX as u64);
        let out: Value = serde_json::from_slice(
            &with_bootstrap(
                &Bytes::from_static(br#"{"model":"m","bootstrap_room":1,"stream":true}"#),
                &b,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(out["bootstrap_host"], "10.0.0.7");
        assert_eq!(out["bootstrap_port"], 8998);
        assert_eq!(out["bootstrap_room"], b.room);
        assert_eq!(out["stream"], true);
    }
}
