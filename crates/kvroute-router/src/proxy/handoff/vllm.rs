//! vLLM's hand-off (KV connectors; checked against vLLM 0.32.0: the OpenAI completion and chat
//! protocols' `kv_transfer_params` request and response field, NixlConnector's
//! `request_finished`, and vLLM's own `tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`).

use bytes::Bytes;
use serde_json::Value;

use super::{BodyError, KV_TRANSFER_PARAMS};
use crate::proxy::members::{self, Edit};

/// The prefill request: the client's body asking the connector to keep the prompt's KV cache
/// for a remote decode (`do_remote_decode`), for one token (`max_tokens`, and
/// `max_completion_tokens` when the client used it), answered whole (`stream` false, no
/// `stream_options`: only a plain answer carries `kv_transfer_params`). `min_tokens` is
/// dropped: it would conflict with one token (the decode request keeps it). Written into the
/// client's bytes ([`members`]): nothing else changes.
pub fn prefill_body(body: &Bytes) -> Result<Bytes, BodyError> {
    Ok(members::edit(
        body,
        &[
            (KV_TRANSFER_PARAMS, Edit::Set(PREFILL_PARAMS.as_bytes())),
            ("stream", Edit::Set(b"false")),
            ("stream_options", Edit::Remove),
            ("max_tokens", Edit::Set(b"1")),
            ("max_completion_tokens", Edit::Replace(b"1")),
            ("min_tokens", Edit::Remove),
            ("min_completion_tokens", Edit::Remove),
        ],
    )?)
}

/// What the prefill request asks of vLLM's connector (the fields its `toy_proxy_server.py`
/// sends).
const PREFILL_PARAMS: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

/// The `kv_transfer_params` of a prefill worker's answer (a completion or chat completion):
/// `Some` object to hand to the decode worker, `None` when the answer has none (`null`: a
/// connector that needs no parameters, such as vLLM's ExampleConnector, answers so).
pub fn transfer_params(answer: &[u8]) -> Result<Option<Value>, BodyError> {
    let map = match serde_json::from_slice::<Value>(answer) {
        Ok(Value::Object(map)) => map,
        _ => return Err(BodyError::Answer("not a JSON object".into())),
    };
    match map.get(KV_TRANSFER_PARAMS) {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(v.clone())),
        Some(other) => Err(BodyError::Answer(format!(
            "`{KV_TRANSFER_PARAMS}` is {other}, not an object"
        ))),
    }
}

/// The decode request: the client's body as it came (its own `stream`, `max_tokens`, …) with
/// the prefill's `params`, verbatim; without any when the prefill returned none. Only that
/// member is written ([`members`]).
pub fn decode_body(body: &Bytes, params: Option<&Value>) -> Result<Bytes, BodyError> {
    let encoded = params.map(Value::to_string);
    let edit = match &encoded {
        Some(p) => Edit::Set(p.as_bytes()),
        None => Edit::Remove,
    };
    Ok(members::edit(body, &[(KV_TRANSFER_PARAMS, edit)])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_asks_for_one_unstreamed_token_and_a_remote_decode() {
        let body = br#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":50,"min_tokens":3}"#;
        let out: Value =
            serde_json::from_slice(&prefill_body(&Bytes::from_static(body)).unwrap()).unwrap();
        assert_eq!(out["stream"], false);
        assert_eq!(out["max_tokens"], 1);
        assert_eq!(out["max_completion_tokens"], 1);
        assert!(out.get("stream_options").is_none() && out.get("min_tokens").is_none());
        assert_eq!(out[KV_TRANSFER_PARAMS]["do_remote_decode"], true);
        assert_eq!(out[KV_TRANSFER_PARAMS]["do_remote_prefill"], false);
        assert_eq!(out["model"], "m");
        let plain: Value = serde_json::from_slice(
            &prefill_body(&Bytes::from_static(br#"{"prompt":"x"}"#)).unwrap(),
        )
        .unwrap();
        assert!(plain.get("max_completion_tokens").is_none());
        assert_eq!(
            prefill_body(&Bytes::from_static(b"[1]")),
            Err(BodyError::NotAnObject)
        );
        // The client's bytes, edited only where the hand-off needs it.
        let body = Bytes::from_static(
            br#"{"model":"m","prompt":[1E2,12345678901234567890123],"max_tokens":9,"x":1,"x":2}"#,
        );
        assert_eq!(
            &prefill_body(&body).unwrap()[..],
            format!(
                r#"{{"kv_transfer_params":{PREFILL_PARAMS},"stream":false,"model":"m","prompt":[1E2,12345678901234567890123],"max_tokens":1,"x":1,"x":2}}"#
            )
            .as_bytes()
        );
        assert_eq!(
            &decode_body(&body, Some(&serde_json::json!({"a": 1}))).unwrap()[..],
            br#"{"kv_transfer_params":{"a":1},"model":"m","prompt":[1E2,12345678901234567890123],"max_tokens":9,"x":1,"x":2}"#
        );
    }

    #[test]
    fn the_decode_gets_the_original_with_the_prefills_params() {
        let answer = br#"{"id":"c","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[1,2]],"remote_engine_id":"e"}}"#;
        let params = transfer_params(answer).unwrap().unwrap();
        let body = br#"{"model":"m","prompt":"x","stream":true,"max_tokens":20}"#;
        let out: Value =
            serde_json::from_slice(&decode_body(&Bytes::from_static(body), Some(&params)).unwrap())
                .unwrap();
        assert_eq!(out["stream"], true);
        assert_eq!(out["max_tokens"], 20);
        assert_eq!(out[KV_TRANSFER_PARAMS], params);
        assert_eq!(transfer_params(br#"{"kv_transfer_params":null}"#), Ok(None));
        assert_eq!(transfer_params(br#"{"choices":[]}"#), Ok(None));
        assert!(transfer_params(br#"{"kv_transfer_params":3}"#).is_err());
        assert!(transfer_params(b"oops").is_err());
        let out: Value =
            serde_json::from_slice(&decode_body(&Bytes::from_static(body), None).unwrap()).unwrap();
        assert!(out.get(KV_TRANSFER_PARAMS).is_none());
    }
}
