//! One ext_proc stream's two directions as both of its phases see them: the body modes the
//! gateway announced on the first message, and the way answers go back.
//!
//! The conversation runs inside the gRPC response stream itself ([`Answers`]): hyper polls
//! that stream on the HTTP/2 stream's own task, the stream polls the conversation, and each
//! answer the conversation sends is handed straight out. No task is spawned and no channel
//! crosses threads per stream (each was a wake-up and a hop between the runtime's threads on
//! every request); a stream the gateway resets is dropped by hyper, and with it the
//! conversation, whose drop releases the request's admission and load.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use tonic::Status;

use crate::server::repoll::Repolled;

/// One answer on the gRPC stream.
type Answer = Result<ProcessingResponse, Status>;

/// The answer handed from the conversation to the stream that drives it: at most one at a
/// time (a send waits until the stream took it).
type Slot = Arc<Mutex<Option<Answer>>>;

fn take(slot: &Slot) -> Option<Answer> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// The stream's answers to the gateway.
pub(super) struct Out(Slot);

impl Out {
    /// Sends `answer`: it goes out before the conversation goes on. (A gateway that has gone
    /// drops the whole stream, this conversation with it.)
    pub(super) async fn send(&self, answer: ProcessingResponse) {
        self.put(Ok(answer)).await;
    }

    async fn put(&self, answer: Answer) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
        Taken(&self.0).await;
    }
}

/// Ready once the driving stream has taken the answer in the slot. No waker is kept: the
/// stream takes the answer and polls the conversation again on its next poll, without being
/// woken.
struct Taken<'a>(&'a Slot);

impl Future for Taken<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        let full = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        if full { Poll::Pending } else { Poll::Ready(()) }
    }
}

type Conversation = Pin<Box<dyn Future<Output = Result<(), Status>> + Send>>;

/// The gRPC response stream of one ext_proc stream, driving its conversation: the answers it
/// sends, then the `Status` it ended with, if it failed.
pub struct Answers {
    slot: Slot,
    /// `None` once it ended. Polled again at once when it wakes itself (a body chunk handed
    /// from the stream's reader to the pick: both futures of this task), not requeued behind
    /// a wake of another worker thread (`server::repoll`).
    conversation: Option<Repolled<Conversation>>,
}

impl Answers {
    /// The answers of the conversation `converse` makes with an [`Out`] of its own.
    pub(super) fn new<F, C>(converse: C) -> Answers
    where
        C: FnOnce(Out) -> F,
        F: Future<Output = Result<(), Status>> + Send + 'static,
    {
        let slot = Slot::default();
        let conversation = Box::pin(converse(Out(Arc::clone(&slot))));
        Answers {
            slot,
            conversation: Some(Repolled::new(conversation)),
        }
    }
}

impl Stream for Answers {
    type Item = Answer;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Answer>> {
        loop {
            if let Some(answer) = take(&self.slot) {
                return Poll::Ready(Some(answer));
            }
            let Some(conversation) = self.conversation.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(conversation).poll(cx) {
                Poll::Ready(ended) => {
                    self.conversation = None;
                    if let Err(status) = ended {
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                // Pending with an answer to hand out: the loop takes it.
                Poll::Pending if self.slot_full() => {}
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Answers {
    fn slot_full(&self) -> bool {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    /// An answer told apart by `n` (its destination metadata).
    fn answer(n: i32) -> ProcessingResponse {
        let endpoints = n.to_string();
        ProcessingResponse {
            dynamic_metadata: Some(super::super::protocol::destination_metadata(&endpoints)),
            ..ProcessingResponse::default()
        }
    }

    fn mark(a: &Answer) -> String {
        format!("{:?}", a.as_ref().unwrap().dynamic_metadata)
    }

    #[tokio::test]
    async fn the_answers_come_in_the_order_sent_then_the_failure_then_the_end() {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<i32>(4);
        let answers = Answers::new(|out| async move {
            out.send(answer(1)).await;
            // Waiting on something else in between.
            let n = rx.recv().await.unwrap_or_default();
            out.send(answer(n)).await;
            out.send(answer(n + 1)).await;
            Err(Status::invalid_argument("done"))
        });
        tx.send(7).await.unwrap();
        let got: Vec<Answer> = answers.collect().await;
        let marks: Vec<String> = got[..3].iter().map(mark).collect();
        let sent: Vec<String> = [1, 7, 8].map(|n| mark(&Ok(answer(n)))).into();
        assert_eq!(marks, sent);
        assert_eq!(got.len(), 4);
        assert_eq!(
            got[3].as_ref().unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[tokio::test]
    async fn a_dropped_stream_drops_its_conversation() {
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let flag = Flag(Arc::clone(&dropped));
        let mut answers = Answers::new(|out| async move {
            let _flag = flag;
            out.send(answer(1)).await;
            std::future::pending::<()>().await;
            Ok(())
        });
        assert!(answers.next().await.is_some());
        assert!(!dropped.load(std::sync::atomic::Ordering::SeqCst));
        drop(answers);
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
    }
}
