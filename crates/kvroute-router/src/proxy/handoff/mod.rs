//! The KV hand-off between a disaggregated request's prefill and decode workers, as the
//! engines speak it: what the router adds to each body and reads from each answer.
//!
//! - **vLLM** (KV connectors such as NIXL; checked against vLLM 0.32.0's NixlConnector and its
//!   `toy_proxy_server.py`): the prefill worker gets the request with `kv_transfer_params`
//!   asking for a remote decode, one token, no stream ([`vllm::prefill_body`]); its answer's
//!   `kv_transfer_params` ([`vllm::transfer_params`]) go, verbatim, into the original request
//!   sent to the decode worker ([`vllm::decode_body`]), whose answer the client gets.
//! - **SGLang** (checked against SGLang 0.5.23 and its gateway's `pd_router`): both workers get
//!   the request at once, each with the prefill worker's bootstrap host and port and one shared
//!   random room ([`sglang::with_bootstrap`]); the client gets the decode worker's answer.
//!
//! Which one a model speaks is its `[[models]] disaggregation` (default: its `engine`).
//! These are pure functions of bytes; the flow that calls them is `proxy::dispatch` (`pair`, `vllm`, `sglang`).

pub mod first_token;
pub mod sglang;
pub mod vllm;

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use thiserror::Error;

use crate::proxy::members::{self, Edit, NotAnObject};

/// How a disaggregated model's prefill and decode workers hand the KV cache over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// Prefill first, then decode with the `kv_transfer_params` the prefill returned.
    #[default]
    Vllm,
    /// Prefill and decode at once, paired by a bootstrap room on the prefill worker.
    Sglang,
}

impl Protocol {
    /// Its name in config, metrics and `/debug/route`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Vllm => "vllm",
            Protocol::Sglang => "sglang",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A hand-off protocol name that is neither `vllm` nor `sglang`.
#[derive(Debug, Error, PartialEq)]
#[error("`{0}` is not a disaggregation protocol: write \"vllm\" or \"sglang\"")]
pub struct UnknownProtocol(pub String);

impl FromStr for Protocol {
    type Err = UnknownProtocol;

    fn from_str(s: &str) -> Result<Protocol, UnknownProtocol> {
        match s.trim().to_ascii_lowercase().as_str() {
            "vllm" => Ok(Protocol::Vllm),
            "sglang" => Ok(Protocol::Sglang),
            _ => Err(UnknownProtocol(s.to_owned())),
        }
    }
}

/// A request body the hand-off cannot be written into.
#[derive(Debug, Error, PartialEq)]
pub enum BodyError {
    /// Not a JSON object (the endpoint's reader accepted it, so this is unexpected).
    #[error("the request body is not a JSON object")]
    NotAnObject,
    /// The prefill worker's answer has no readable `kv_transfer_params`.
    #[error("the prefill worker's answer is not a completion with kv_transfer_params: {0}")]
    Answer(String),
}

impl From<NotAnObject> for BodyError {
    fn from(_: NotAnObject) -> BodyError {
        BodyError::NotAnObject
    }
}

/// The name of vLLM's hand-off field, in requests and answers.
pub const KV_TRANSFER_PARAMS: &str = "kv_transfer_params";

/// The body without a client's own top-level `kv_transfer_params`: those are the router's to
/// give. A decode engine given `do_remote_prefill` without the fields its connector needs dies
/// (vLLM 0.32.0's NIXL scheduler asserts, measured), so a client must never reach an engine
/// with them. Only that member goes ([`members`]: nothing else is re-encoded); a body without
/// it is returned as it is, not copied; one that is not an object is left to the engine.
pub fn without_client_params(body: Bytes) -> Bytes {
    members::edit(&body, &[(KV_TRANSFER_PARAMS, Edit::Remove)]).unwrap_or(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_parse() {
        assert_eq!("vLLM".parse(), Ok(Protocol::Vllm));
        assert_eq!("sglang".parse(), Ok(Protocol::Sglang));
        assert!("nixl".parse::<Protocol>().is_err());
    }

    #[test]
    fn a_clients_own_transfer_params_never_pass() {
        let body = Bytes::from_static(
            br#"{"model":"m","kv_transfer_params":{"do_remote_prefill":true},"prompt":"x"}"#,
        );
        assert_eq!(
            &without_client_params(body)[..],
            br#"{"model":"m","prompt":"x"}"#
        );
        let body = Bytes::from_static(br#"{"model":"m", "prompt":"x"}"#);
        assert_eq!(without_client_params(body.clone()).as_ptr(), body.as_ptr());
        // Nothing else is re-encoded.
        let body = Bytes::from_static(
            br#"{"n":12345678901234567890123, "kv_transfer_params":null,"t":1E2,"t":3}"#,
        );
        assert_eq!(
            &without_client_params(body)[..],
            br#"{"n":12345678901234567890123,"t":1E2,"t":3}"#
        );
        // The word in a prompt is not the field.
        let body = Bytes::from_static(br#"{"model":"m","prompt":"kv_transfer_params"}"#);
        assert_eq!(without_client_params(body.clone()), body);
    }
}
