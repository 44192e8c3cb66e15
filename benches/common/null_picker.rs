//! The floor under `kvroute epp`'s decision latency: an ext_proc server that decides nothing.
//!
//! It answers as the picker does — the same messages (`kvroute::epp::protocol`), the pick
//! when the request's body ends, then the body back, then the response phase's answers — but
//! picks a fixed endpoint without reading the body. It runs on a runtime of its own (two
//! worker threads, as the picker's process has on this machine), served by tonic's own
//! server, and its answers are polled from the gRPC response stream itself (no task or channel
//! of its own per stream). What the bench times through it is the ext_proc exchange alone:
//! the Envoy stand-in, HTTP/2 and gRPC both ways; the picker's figure less this one is what
//! the picker's own work adds.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use kvroute::epp::protocol;
use tonic::{Status, Streaming};

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

/// Names `endpoint` for every request.
struct NullPicker {
    endpoint: String,
}

/// One stream's state: what the gateway sent, the body so far, the answers not yet sent.
struct Conversation {
    inbound: Streaming<ProcessingRequest>,
    endpoint: String,
    body: Vec<u8>,
    ready: VecDeque<ProcessingResponse>,
}

impl Conversation {
    /// The answers to one message, in order.
    fn answer(&mut self, message: ProcessingRequest) {
        match message.request {
            Some(Request::RequestHeaders(h)) if h.end_of_stream => self.pick(),
            Some(Request::RequestBody(b)) => {
                self.body.extend_from_slice(&b.body);
                if b.end_of_stream {
                    self.pick();
                    let body = std::mem::take(&mut self.body);
                    self.ready.extend(protocol::body_chunks(&body, true, true));
                }
            }
            Some(Request::ResponseHeaders(_)) => {
                self.ready.push_back(protocol::response_headers(Vec::new()));
            }
            Some(Request::ResponseBody(b)) => {
                self.ready
                    .extend(protocol::body_chunks(&b.body, b.end_of_stream, false));
            }
            _ => {}
        }
    }

    fn pick(&mut self) {
        let set = vec![protocol::header(
            protocol::DESTINATION,
            self.endpoint.as_bytes(),
        )];
        self.ready
            .push_back(protocol::pick(&self.endpoint, set, Vec::new()));
    }
}

#[tonic::async_trait]
impl ExternalProcessor for NullPicker {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Answers>, Status> {
        let conversation = Conversation {
            inbound: request.into_inner(),
            endpoint: self.endpoint.clone(),
            body: Vec::new(),
            ready: VecDeque::new(),
        };
        let answers = futures_util::stream::unfold(conversation, |mut c| async move {
            loop {
                if let Some(a) = c.ready.pop_front() {
                    return Some((Ok(a), c));
                }
                match c.inbound.message().await {
                    Ok(Some(m)) => c.answer(m),
                    Ok(None) | Err(_) => return None,
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(answers)))
    }
}

/// Set (to `LISTEN ENDPOINT`) in the child process that runs a null picker ([`start_process`]).
pub const ENV: &str = "KVROUTE_BENCH_NULL_PICKER";

/// Serves a null picker naming `endpoint` on `addr` on a two-worker runtime, until the
/// process ends.
fn serve(addr: SocketAddr, endpoint: SocketAddr) {
    let picker = NullPicker {
        endpoint: endpoint.to_string(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(
        tonic::transport::Server::builder()
            .add_service(ExternalProcessorServer::new(picker))
            .serve(addr),
    )
    .expect("the null picker serves");
}

/// Starts a null picker naming `endpoint` on a runtime of its own (a thread of this process
/// that lives as long as the bench); its gRPC address.
pub fn start(endpoint: SocketAddr) -> SocketAddr {
    let addr = crate::fake_backend::free_addr();
    std::thread::spawn(move || serve(addr, endpoint));
    addr
}

/// Starts a null picker naming `endpoint` in a process of its own (this bench binary re-run
/// with [`ENV`]), as `kvroute epp` runs: the exchange's floor with the process boundary the
/// picker pays. Its process and gRPC address.
pub fn start_process(endpoint: SocketAddr) -> (crate::fake_backend::Process, SocketAddr) {
    let addr = crate::fake_backend::free_addr();
    let child = crate::fake_backend::spawn_quiet(
        std::process::Command::new(std::env::current_exe().expect("this bench"))
            .env(ENV, format!("{addr} {endpoint}")),
        "null picker",
    );
    (child, addr)
}

/// Runs the null picker and never returns when this process is the child [`start_process`]
/// started; `false` otherwise.
pub fn serve_if_child() -> bool {
    let Ok(spec) = std::env::var(ENV) else {
        return false;
    };
    let mut parts = spec.split_whitespace().map(|p| p.parse::<SocketAddr>());
    let (Some(Ok(addr)), Some(Ok(endpoint))) = (parts.next(), parts.next()) else {
        panic!("{ENV} must be `LISTEN ENDPOINT`");
    };
    serve(addr, endpoint);
    true
}
