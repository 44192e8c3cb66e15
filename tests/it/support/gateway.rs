//! An Envoy stand-in for `kvroute epp`: speaks `ext_proc` as Envoy's filter does with
//! `request_body_mode` and `response_body_mode` `FULL_DUPLEX_STREAMED` — request headers (with
//! the subset hint in `metadata_context` when given), the body in chunks, then forwards the
//! request where the picker said (the `x-gateway-destination-endpoint` header, required to be
//! the same as the `envoy.lb` metadata) with the header mutations applied and the body the
//! picker streamed back, and reports the response phase: its headers with
//! `x-gateway-destination-endpoint-served` in `envoy.lb`, and each body chunk, forwarding what
//! the picker streams back to the client.

use std::collections::HashMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::Channel;

/// What the client of the gateway got.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// The response headers the client saw (the picker's added).
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// The endpoint the picker chose (`None`: it answered itself).
    pub destination: Option<String>,
    /// The endpoints it named after it, for the gateway to fall back on.
    pub fallbacks: Vec<String>,
    /// The body the engine received.
    pub sent_body: Vec<u8>,
    /// The request headers the engine received (picker's mutations applied).
    pub sent_headers: HashMap<String, String>,
}

/// The gateway: one gRPC connection to the picker, an HTTP client to the pods.
#[derive(Clone)]
pub struct Gateway {
    picker: ExternalProcessorClient<Channel>,
    http: reqwest::Client,
    /// Body chunk size sent to the picker.
    pub chunk: usize,
}

/// A request through the gateway.
pub struct Call<'a> {
    pub path: &'a str,
    pub body: &'a [u8],
    pub headers: Vec<(&'a str, String)>,
    /// The subset hint (`None`: no hint).
    pub subset: Option<Vec<String>>,
}

impl<'a> Call<'a> {
    pub fn post(path: &'a str, body: &'a [u8]) -> Call<'a> {
        Call {
            path,
            body,
            headers: vec![("content-type", "application/json".into())],
            subset: None,
        }
    }
}

pub fn hv(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        raw_value: value.as_bytes().to_vec(),
        ..HeaderValue::default()
    }
}

pub fn message(request: Request, metadata: Option<Metadata>) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(request),
        metadata_context: metadata,
        ..ProcessingRequest::default()
    }
}

pub fn lb(namespace: &str, key: &str, value: Value) -> Metadata {
    Metadata {
        filter_metadata: [(
            namespace.into(),
            Struct {
                fields: [(key.into(), value)].into(),
            },
        )]
        .into(),
        ..Metadata::default()
    }
}

/// One open ext_proc stream.
pub struct Stream {
    pub tx: mpsc::Sender<ProcessingRequest>,
    pub rx: Streaming<ProcessingResponse>,
}

impl Stream {
    pub async fn send(&self, m: ProcessingRequest) {
        self.tx.send(m).await.expect("the stream is open");
    }

    /// Sends `m` unless the picker has ended the stream (it answered early, as with an
    /// immediate response before the body's end: Envoy then stops sending); whether it went.
    pub async fn try_send(&self, m: ProcessingRequest) -> bool {
        self.tx.send(m).await.is_ok()
    }

    /// The picker's next answer.
    pub async fn next(&mut self) -> ProcessingResponse {
        match self.rx.message().await {
            Ok(Some(m)) => m,
            Ok(None) => panic!("the picker ended the stream without an answer"),
            Err(status) => panic!("the picker failed the stream: {status:?}"),
        }
    }
}

impl Gateway {
    pub async fn connect(addr: SocketAddr) -> Gateway {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .expect("the picker accepts gRPC");
        Gateway {
            picker: ExternalProcessorClient::new(channel),
            http: reqwest::Client::new(),
            chunk: 7,
        }
    }

    /// Opens a stream and sends the request headers.
    pub async fn open(&self, call: &Call<'_>) -> Stream {
        let (tx, rx) = mpsc::channel(64);
        let outbound = futures_util::stream::unfold(
            rx,
            |mut rx: mpsc::Receiver<ProcessingRequest>| async move { rx.recv().await.map(|m| (m, rx)) },
        );
        let rx = self
            .picker
            .clone()
            .process(outbound)
            .await
            .expect("the stream opens")
            .into_inner();
        let stream = Stream { tx, rx };
        let mut headers = vec![
            hv(":method", "POST"),
            hv(":path", call.path),
            hv(":authority", "gateway"),
            hv("content-length", &call.body.len().to_string()),
        ];
        headers.extend(call.headers.iter().map(|(k, v)| hv(k, v)));
        let subset = call.subset.as_ref().map(|s| {
            let values = s
                .iter()
                .map(|e| Value {
                    kind: Some(Kind::StringValue(e.clone())),
                })
                .collect();
            let list = Value {
                kind: Some(Kind::ListValue(ListValue { values })),
            };
            lb(
                "envoy.lb.subset_hint",
                "x-gateway-destination-endpoint-subset",
                list,
            )
        });
        let duplex = BodySendMode::FullDuplexStreamed as i32;
        let mut first = message(
            Request::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap { headers }),
                end_of_stream: call.body.is_empty(),
                ..HttpHeaders::default()
            }),
            subset,
        );
        first.protocol_config = Some(ProtocolConfiguration {
            request_body_mode: duplex,
            response_body_mode: duplex,
            ..ProtocolConfiguration::default()
        });
        stream.send(first).await;
        stream
    }

    /// Sends the body in chunks, the last one ending it, until the picker ends the stream.
    pub async fn send_body(&self, stream: &Stream, body: &[u8]) {
        let chunks: Vec<&[u8]> = body.chunks(self.chunk.max(1)).collect();
        for (i, c) in chunks.iter().enumerate() {
            let part = HttpBody {
                body: c.to_vec(),
                end_of_stream: i + 1 == chunks.len(),
                ..HttpBody::default()
            };
            if !stream
                .try_send(message(Request::RequestBody(part), None))
                .await
            {
                return;
            }
        }
    }

    /// A whole request through the gateway, as Envoy runs it.
    pub async fn request(&self, call: Call<'_>) -> Answer {
        let mut stream = self.open(&call).await;
        if !call.body.is_empty() {
            self.send_body(&stream, call.body).await;
        }
        let first = stream.next().await;
        let (list, set, remove) = match first.response {
            Some(Response::ImmediateResponse(i)) => return immediate(i),
            Some(Response::RequestHeaders(h)) => {
                pick_of(&first.dynamic_metadata, h.response.unwrap())
            }
            other => panic!("expected the headers answer, got {other:?}"),
        };
        let mut endpoints = list.split(',').map(str::to_owned);
        let destination = endpoints.next().unwrap_or_default();
        let fallbacks: Vec<String> = endpoints.collect();
        let mut sent_body = Vec::new();
        if !call.body.is_empty() {
            loop {
                let (bytes, end) = streamed(stream.next().await, true);
                sent_body.extend_from_slice(&bytes);
                if end {
                    break;
                }
            }
        }
        let mut sent_headers: HashMap<String, String> = call
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        for r in &remove {
            sent_headers.remove(r);
        }
        sent_headers.extend(set);
        let mut answer = self
            .forward(
                &mut stream,
                call.path,
                &destination,
                sent_headers,
                sent_body,
            )
            .await;
        answer.fallbacks = fallbacks;
        answer
    }

    async fn forward(
        &self,
        stream: &mut Stream,
        path: &str,
        destination: &str,
        sent_headers: HashMap<String, String>,
        sent_body: Vec<u8>,
    ) -> Answer {
        let mut req = self.http.post(format!("http://{destination}{path}"));
        for (k, v) in &sent_headers {
            if k != "content-length" && !k.starts_with(':') {
                req = req.header(k, v);
            }
        }
        let resp = req
            .body(sent_body.clone())
            .send()
            .await
            .expect("the pod answers");
        let status = resp.status().as_u16();
        let mut headers: Vec<HeaderValue> = vec![hv(":status", &status.to_string())];
        for (k, v) in resp.headers() {
            headers.push(hv(k.as_str(), v.to_str().unwrap_or("")));
        }
        let served = lb(
            "envoy.lb",
            "x-gateway-destination-endpoint-served",
            Value {
                kind: Some(Kind::StringValue(destination.into())),
            },
        );
        let head = HttpHeaders {
            headers: Some(HeaderMap { headers }),
            ..HttpHeaders::default()
        };
        stream
            .send(message(Request::ResponseHeaders(head), Some(served)))
            .await;
        let mut client_headers: HashMap<String, String> = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        match stream.next().await.response {
            Some(Response::ResponseHeaders(h)) => {
                let set = h
                    .response
                    .and_then(|c| c.header_mutation)
                    .map(|m| m.set_headers);
                for o in set.unwrap_or_default() {
                    let h = o.header.unwrap();
                    client_headers.insert(h.key, String::from_utf8(h.raw_value).unwrap());
                }
            }
            other => panic!("expected the response headers answer, got {other:?}"),
        }
        let mut body = Vec::new();
        let mut upstream = resp.bytes_stream();
        while let Some(chunk) = upstream.next().await {
            let chunk = chunk.expect("the pod's body");
            let part = HttpBody {
                body: chunk.to_vec(),
                ..HttpBody::default()
            };
            stream
                .send(message(Request::ResponseBody(part), None))
                .await;
            let (bytes, _) = streamed(stream.next().await, false);
            body.extend_from_slice(&bytes);
        }
        let last = HttpBody {
            end_of_stream: true,
            ..HttpBody::default()
        };
        stream
            .send(message(Request::ResponseBody(last), None))
            .await;
        let (bytes, end) = streamed(stream.next().await, false);
        assert!(end, "the last chunk ends the body");
        body.extend_from_slice(&bytes);
        Answer {
            status,
            headers: client_headers,
            body,
            destination: Some(destination.to_owned()),
            fallbacks: Vec::new(),
            sent_body,
            sent_headers,
        }
    }
}

fn immediate(i: envoy_types::pb::envoy::service::ext_proc::v3::ImmediateResponse) -> Answer {
    let headers = i
        .headers
        .map(|m| m.set_headers)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|o| o.header)
        .map(|h| (h.key, String::from_utf8(h.raw_value).unwrap()))
        .collect();
    Answer {
        status: i.status.map_or(200, |s| s.code as u16),
        headers,
        body: i.body,
        destination: None,
        fallbacks: Vec::new(),
        sent_body: Vec::new(),
        sent_headers: HashMap::new(),
    }
}

/// The destination list (header and metadata, required equal), the headers set and removed.
fn pick_of(
    metadata: &Option<Struct>,
    common: CommonResponse,
) -> (String, HashMap<String, String>, Vec<String>) {
    assert!(common.clear_route_cache, "the route is chosen anew");
    let mutation = common.header_mutation.expect("headers are set");
    let set: HashMap<String, String> = mutation
        .set_headers
        .into_iter()
        .filter_map(|o| o.header)
        .map(|h| (h.key, String::from_utf8(h.raw_value).unwrap()))
        .collect();
    let header = set["x-gateway-destination-endpoint"].clone();
    let lb = &metadata.as_ref().expect("dynamic metadata").fields["envoy.lb"];
    let Some(Kind::StructValue(inner)) = &lb.kind else {
        panic!("envoy.lb is a struct: {lb:?}");
    };
    let Some(Kind::StringValue(meta)) = &inner.fields["x-gateway-destination-endpoint"].kind else {
        panic!("the metadata names the endpoint");
    };
    assert_eq!(&header, meta, "the header and the metadata must not differ");
    (header, set, mutation.remove_headers)
}

/// A streamed body chunk of the request (`request`) or response phase, and whether it ends.
pub fn streamed(r: ProcessingResponse, request: bool) -> (Vec<u8>, bool) {
    let body = match (r.response, request) {
        (Some(Response::RequestBody(b)), true) | (Some(Response::ResponseBody(b)), false) => b,
        (other, _) => panic!("expected a body answer, got {other:?}"),
    };
    match body
        .response
        .and_then(|c| c.body_mutation)
        .and_then(|m| m.mutation)
    {
        Some(Mutation::StreamedResponse(s)) => (s.body, s.end_of_stream),
        other => panic!("expected a streamed body, got {other:?}"),
    }
}

/// The endpoints a headers answer names (`x-gateway-destination-endpoint`, split at commas):
/// the pick, then the fallbacks.
pub fn endpoints_of(r: &ProcessingResponse) -> Vec<String> {
    let Some(Response::RequestHeaders(h)) = &r.response else {
        panic!("expected the headers answer, got {r:?}");
    };
    let common = h.response.clone().expect("a common response");
    let (list, _, _) = pick_of(&r.dynamic_metadata, common);
    list.split(',').map(str::to_owned).collect()
}

impl Stream {
    /// Reads the body the picker streams back, to its end.
    pub async fn body_back(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let (bytes, end) = streamed(self.next().await, true);
            body.extend_from_slice(&bytes);
            if end {
                return body;
            }
        }
    }

    /// Reports the response's head as Envoy does, `served` naming the endpoint that answered,
    /// and waits for the picker's answer to it.
    pub async fn report_head(&mut self, status: u16, served: &str) {
        let head = HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    hv(":status", &status.to_string()),
                    hv("content-type", "application/json"),
                ],
            }),
            ..HttpHeaders::default()
        };
        let served = lb(
            "envoy.lb",
            "x-gateway-destination-endpoint-served",
            Value {
                kind: Some(Kind::StringValue(served.into())),
            },
        );
        self.send(message(Request::ResponseHeaders(head), Some(served)))
            .await;
        match self.next().await.response {
            Some(Response::ResponseHeaders(_)) => {}
            other => panic!("expected the response headers answer, got {other:?}"),
        }
    }

    /// Reports the response's whole body in one last chunk and reads what the picker streams
    /// back.
    pub async fn report_body(&mut self, body: &[u8]) -> Vec<u8> {
        let last = HttpBody {
            body: body.to_vec(),
            end_of_stream: true,
            ..HttpBody::default()
        };
        self.send(message(Request::ResponseBody(last), None)).await;
        let mut back = Vec::new();
        loop {
            let (bytes, end) = streamed(self.next().await, false);
            back.extend_from_slice(&bytes);
            if end {
                return back;
            }
        }
    }
}
