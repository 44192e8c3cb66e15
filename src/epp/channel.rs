//! One ext_proc stream's two directions as both of its phases see them: the body modes the
//! gateway announced on the first message, and the channel answers go back on.

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio::sync::mpsc;
use tonic::Status;

/// The stream's answers to the gateway.
pub(super) struct Out(pub(super) mpsc::Sender<Result<ProcessingResponse, Status>>);

impl Out {
    /// Sends `answer`; `false` when the gateway has gone.
    pub(super) async fn send(&self, answer: ProcessingResponse) -> bool {
        self.0.send(Ok(answer)).await.is_ok()
    }
}

/// The body modes the gateway announced on the stream's first message.
#[derive(Clone, Copy, Debug)]
pub(super) struct Modes {
    /// The response body comes chunk by chunk and must be streamed back.
    pub(super) response_full_duplex: bool,
}

/// The modes announced on the stream's first message; a request body mode kvroute cannot pick
/// from is refused.
pub(super) fn modes(first: &ProcessingRequest) -> Result<Modes, Status> {
    let (request, response) = first.protocol_config.as_ref().map_or(
        (
            BodySendMode::FullDuplexStreamed as i32,
            BodySendMode::None as i32,
        ),
        |p| (p.request_body_mode, p.response_body_mode),
    );
    let duplex = BodySendMode::FullDuplexStreamed as i32;
    if request != duplex && request != BodySendMode::None as i32 {
        return Err(Status::failed_precondition(
            "kvroute epp picks after the whole request body: configure the gateway's ext_proc \
             with request_body_mode FULL_DUPLEX_STREAMED",
        ));
    }
    Ok(Modes {
        response_full_duplex: response == duplex,
    })
}
