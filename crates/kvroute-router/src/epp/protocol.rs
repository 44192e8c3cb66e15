//! The Endpoint Picker Protocol's wire vocabulary (Gateway API Inference Extension, proposal
//! 004) over Envoy's `ext_proc`: the names a gateway reads and writes, and the
//! `ProcessingResponse`s this picker sends. Pure: no I/O, no routing.
//!
//! - The pick goes back twice, with the same value: as the request header
//!   `x-gateway-destination-endpoint` and in the response's `dynamic_metadata` under
//!   `envoy.lb` → `x-gateway-destination-endpoint` (a gateway may read either; the protocol
//!   forbids them to differ), with `clear_route_cache` so the route is chosen anew.
//! - In `FULL_DUPLEX_STREAMED` body mode the gateway forwards only the body chunks the picker
//!   streams back (`StreamedBodyResponse`, at most 62,000 bytes each: some gateways cap a chunk
//!   at 64 KiB), the last one with `end_of_stream`.
//! - A request that cannot be served is answered by the gateway on the picker's behalf
//!   (`ImmediateResponse`): 503 when no endpoint may take it, 429 (with `Retry-After`) when it
//!   is shed; kvroute's own OpenAI-shaped error is the body.

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

use crate::openai::ApiError;

/// The metadata namespace of the pick (request phase) and of the endpoint that served
/// (response phase).
pub const LB_NAMESPACE: &str = "envoy.lb";
/// Header and `envoy.lb` metadata key of the pick: `ip:port[,ip:port…]`.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// `envoy.lb` metadata key, in the response phase, of the endpoint that served.
pub const DESTINATION_SERVED: &str = "x-gateway-destination-endpoint-served";
/// The namespace of the subset hint (the endpoints the gateway allows for this request).
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The subset hint's key: a list of `ip:port` (or bare `ip`) strings.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The prefill endpoint of a disaggregated request, read by llm-d's decode sidecar.
pub const PREFILLER: &str = "x-prefiller-host-port";
/// The data-parallel rank a worker of several ranks behind one port runs the request on
/// (vLLM's header; `fleet::DP_RANK_HEADER`).
pub const RANK: &str = "x-data-parallel-rank";

/// Largest body chunk sent back in one message.
pub const CHUNK_BYTES: usize = 62_000;

/// Headers a client must not set for the engine: the gateway's own routing words, which only
/// the picker may write (a client's `x-prefiller-host-port` would send its prompt's prefill
/// anywhere).
pub const CLIENT_MAY_NOT_SET: [&str; 4] = [SUBSET_KEY, DESTINATION_SERVED, PREFILLER, RANK];

/// A header replacing any value the request has.
pub fn header(key: &str, value: &[u8]) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            raw_value: value.to_vec(),
            ..HeaderValue::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd.into(),
        ..HeaderValueOption::default()
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": endpoints}}`.
pub fn destination_metadata(endpoints: &str) -> Struct {
    let inner = Struct {
        fields: [(DESTINATION.to_owned(), string_value(endpoints))].into(),
    };
    Struct {
        fields: [(
            LB_NAMESPACE.to_owned(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into(),
    }
}

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// The request-headers answer carrying the pick: `set` (the destination first) replaces what
/// the request has, `remove` goes.
pub fn pick(
    endpoints: &str,
    set: Vec<HeaderValueOption>,
    remove: Vec<String>,
) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                clear_route_cache: true,
                header_mutation: Some(HeaderMutation {
                    set_headers: set,
                    remove_headers: remove,
                }),
                ..CommonResponse::default()
            }),
        })),
        dynamic_metadata: Some(destination_metadata(endpoints)),
        ..ProcessingResponse::default()
    }
}

/// `body` streamed back in chunks of at most [`CHUNK_BYTES`]; the last carries `end` (an empty
/// body is one empty chunk). `request` picks the request or the response phase.
pub fn body_chunks(body: &[u8], end: bool, request: bool) -> Vec<ProcessingResponse> {
    let mut chunks: Vec<&[u8]> = body.chunks(CHUNK_BYTES).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let last = chunks.len() - 1;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let common = CommonResponse {
                body_mutation: Some(BodyMutation {
                    mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                        body: chunk.to_vec(),
                        end_of_stream: end && i == last,
                        ..StreamedBodyResponse::default()
                    })),
                }),
                ..CommonResponse::default()
            };
            body_response(common, request)
        })
        .collect()
}

/// A body answer that changes nothing (a gateway that streams the body without waiting for it).
pub fn body_unchanged(request: bool) -> ProcessingResponse {
    body_response(CommonResponse::default(), request)
}

fn body_response(common: CommonResponse, request: bool) -> ProcessingResponse {
    let body = BodyResponse {
        response: Some(common),
    };
    ProcessingResponse {
        response: Some(if request {
            Response::RequestBody(body)
        } else {
            Response::ResponseBody(body)
        }),
        ..ProcessingResponse::default()
    }
}

/// The response-headers answer: `set` added to the client's response.
pub fn response_headers(set: Vec<HeaderValueOption>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers: set,
                    remove_headers: Vec::new(),
                }),
                ..CommonResponse::default()
            }),
        })),
        ..ProcessingResponse::default()
    }
}

/// A trailers answer that changes nothing.
pub fn trailers_unchanged(request: bool) -> ProcessingResponse {
    let t = TrailersResponse::default();
    ProcessingResponse {
        response: Some(if request {
            Response::RequestTrailers(t)
        } else {
            Response::ResponseTrailers(t)
        }),
        ..ProcessingResponse::default()
    }
}

/// The gateway answers the client with `error` (its status, OpenAI-shaped JSON body and
/// `Retry-After` when it has one) and never forwards the request.
pub fn immediate(error: &ApiError) -> ProcessingResponse {
    let mut set = vec![header("content-type", b"application/json")];
    if let Some(s) = error.retry_after_s {
        set.push(header("retry-after", s.to_string().as_bytes()));
    }
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(error.status.as_u16()),
            }),
            headers: Some(HeaderMutation {
                set_headers: set,
                remove_headers: Vec::new(),
            }),
            body: error.body().into_bytes(),
            details: error.code.unwrap_or("kvroute").to_owned(),
            ..ImmediateResponse::default()
        })),
        ..ProcessingResponse::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn streamed(r: &ProcessingResponse) -> (&[u8], bool) {
        let Some(Response::RequestBody(b)) = &r.response else {
            panic!("not a request body answer: {r:?}");
        };
        let m = b.response.as_ref().and_then(|c| c.body_mutation.as_ref());
        let Some(BodyMutation {
            mutation: Some(Mutation::StreamedResponse(s)),
        }) = m
        else {
            panic!("not streamed: {r:?}");
        };
        (&s.body, s.end_of_stream)
    }

    #[test]
    fn a_body_goes_back_whole_in_capped_chunks_the_last_one_ending_it() {
        let body: Vec<u8> = (0..(2 * CHUNK_BYTES + 5)).map(|i| i as u8).collect();
        let chunks = body_chunks(&body, true, true);
        assert_eq!(chunks.len(), 3);
        let mut joined = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let (bytes, end) = streamed(c);
            assert!(bytes.len() <= CHUNK_BYTES);
            assert_eq!(end, i == 2);
            joined.extend_from_slice(bytes);
        }
        assert_eq!(joined, body);
        let empty = body_chunks(&[], true, true);
        assert_eq!(empty.len(), 1);
        assert_eq!(streamed(&empty[0]), (&[][..], true));
    }

    #[test]
    fn the_pick_is_the_same_in_the_header_and_the_metadata() {
        let r = pick(
            "10.0.0.1:8000",
            vec![header(DESTINATION, b"10.0.0.1:8000")],
            vec![],
        );
        let Some(Response::RequestHeaders(h)) = &r.response else {
            panic!("{r:?}");
        };
        let common = h.response.as_ref().unwrap();
        assert!(common.clear_route_cache);
        let set = &common.header_mutation.as_ref().unwrap().set_headers[0];
        assert_eq!(set.header.as_ref().unwrap().raw_value, b"10.0.0.1:8000");
        let lb = &r.dynamic_metadata.as_ref().unwrap().fields[LB_NAMESPACE];
        let Some(Kind::StructValue(inner)) = &lb.kind else {
            panic!("{lb:?}");
        };
        assert_eq!(
            inner.fields[DESTINATION].kind,
            Some(Kind::StringValue("10.0.0.1:8000".into()))
        );
    }

    #[test]
    fn a_shed_request_is_a_429_with_retry_after_and_an_openai_body() {
        let e = ApiError {
            retry_after_s: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit",
                Some("busy"),
                "x",
            )
        };
        let Some(Response::ImmediateResponse(i)) = immediate(&e).response else {
            panic!()
        };
        assert_eq!(i.status.unwrap().code, 429);
        let set = i.headers.unwrap().set_headers;
        assert!(set.iter().any(|h| {
            let h = h.header.as_ref().unwrap();
            h.key == "retry-after" && h.raw_value == b"1"
        }));
        let body: serde_json::Value = serde_json::from_slice(&i.body).unwrap();
        assert_eq!(body["error"]["code"], "busy");
    }
}
