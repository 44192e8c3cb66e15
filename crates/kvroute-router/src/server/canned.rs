//! OpenAI-shaped bodies for the answers hyper writes by itself.
//!
//! When an HTTP/1 request cannot be parsed (a malformed request line or header, a URI too long,
//! headers too large or too many), hyper answers 400, 414 or 431 on its own, before any
//! service sees a request, with an empty body, and no option changes that. Clients (and the
//! OpenAI SDKs) then report an empty error. This wrapper sits between hyper and the socket and
//! replaces exactly that answer with the same status and an `{"error": …}` body; every other
//! byte passes through untouched. HTTP/2 rejects malformed requests with stream or connection
//! errors, which have no body to give.
//!
//! hyper's own answer is recognised by its shape and its moment: written while no request of
//! the connection is in progress (so it is not a response of ours), an `HTTP/1.1 4xx` head
//! whose only headers are `content-length: 0` and `date`, and nothing after it. Responses of
//! the router always carry a `content-type` (errors) or `x-kvroute-worker` (proxied).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use hyper::rt::{Read, ReadBufCursor, Write};

use super::connection::Activity;
use crate::openai::ApiError;

/// A connection's socket, with hyper's bodiless error answers given a body.
pub(super) struct CannedErrors<T> {
    inner: T,
    activity: Arc<Activity>,
    /// The replacement answer still to be written.
    pending: Bytes,
}

impl<T> CannedErrors<T> {
    pub(super) fn new(inner: T, activity: Arc<Activity>) -> CannedErrors<T> {
        CannedErrors {
            inner,
            activity,
            pending: Bytes::new(),
        }
    }
}

impl<T: Write + Unpin> CannedErrors<T> {
    /// Writes what is left of a replacement answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let n = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending.advance(n);
        }
        Poll::Ready(Ok(()))
    }

    /// Whether `buf` is hyper's own error answer; if so, queues its replacement.
    fn replaced(&mut self, buf: &[u8]) -> bool {
        if self.activity.in_flight() > 0 || !buf.starts_with(b"HTTP/1.1 4") {
            return false;
        }
        match replacement(buf) {
            Some(answer) => {
                self.pending = answer;
                true
            }
            None => false,
        }
    }
}

/// The answer that replaces `head`, if `head` is hyper's bodiless 400, 414 or 431.
fn replacement(head: &[u8]) -> Option<Bytes> {
    let text = std::str::from_utf8(head).ok()?;
    let rest = text.strip_suffix("\r\n\r\n")?;
    let mut lines = rest.split("\r\n");
    let status_line = lines.next()?;
    let code: u16 = status_line.get(9..12)?.parse().ok()?;
    let mut date = None;
    let mut empty = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" if value.trim() == "0" => empty = true,
            "date" => date = Some(line),
            "connection" => {}
            _ => return None,
        }
    }
    if !empty {
        return None;
    }
    let error = match code {
        400 => ApiError::invalid(
            "the request could not be parsed as HTTP/1.1: malformed request line or header",
            None,
        ),
        414 => ApiError::new(
            http::StatusCode::URI_TOO_LONG,
            "invalid_request_error",
            Some("uri_too_long"),
            "the request URI is too long",
        ),
        431 => ApiError::new(
            http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
            Some("request_header_fields_too_large"),
            "the request headers are too large, or too many",
        ),
        _ => return None,
    };
    let body = error.body();
    let date = date.map(|d| format!("{d}\r\n")).unwrap_or_default();
    Some(Bytes::from(format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n{date}\r\n{body}",
        body.len()
    )))
}

impl<T: Read + Unpin> Read for CannedErrors<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for CannedErrors<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_pending(cx))?;
        if self.replaced(buf) {
            // hyper's answer counts as written; the replacement goes out in its place.
            let _ = self.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_pending(cx))?;
        // hyper's answer is one buffer (a head with no body).
        let only = match bufs.iter().filter(|b| !b.is_empty()).count() {
            1 => bufs.iter().find(|b| !b.is_empty()),
            _ => None,
        };
        if let Some(head) = only
            && self.replaced(head)
        {
            let _ = self.poll_pending(cx)?;
            return Poll::Ready(Ok(head.len()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_bodiless_errors_get_a_body() {
        for code in [400u16, 414, 431] {
            let head = format!(
                "HTTP/1.1 {code} Whatever\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 17:00:00 GMT\r\n\r\n"
            );
            let out = replacement(head.as_bytes()).expect("replaced");
            let text = std::str::from_utf8(&out).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(
                head.starts_with(&format!("HTTP/1.1 {code} Whatever\r\n")),
                "{head}"
            );
            assert!(
                head.contains(&format!("content-length: {}", body.len())),
                "{head}"
            );
            assert!(head.contains("date: Tue"), "{head}");
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert!(v["error"]["message"].is_string(), "{v}");
        }
    }

    #[test]
    fn other_answers_pass_through() {
        for head in [
            // A body follows (ours always have one).
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 5\r\ndate: x\r\n\r\n",
            // A header hyper does not add by itself.
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nx-kvroute-worker: w0\r\n\r\n",
            // Not one of hyper's statuses.
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\ndate: x\r\n\r\n",
            // More than the head.
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\nHTTP/1.1 200 OK\r\n",
        ] {
            assert!(replacement(head.as_bytes()).is_none(), "{head}");
        }
    }
}
