//! Request ids: every request carries one, the client's `x-request-id` when it is usable, else
//! one made here. The id is put on the request before any handler runs (so the proxy forwards
//! it upstream: vLLM and SGLang take `X-Request-Id` as their own request id, which joins the
//! router's access log to the engine's), and on the response, errors included.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderMap, HeaderName, HeaderValue};

/// The request id header.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client id kept; a longer one is replaced.
const MAX_LEN: usize = 128;

/// Gives the request an id (see the module doc) and returns it on the response.
pub(super) async fn stamp(mut req: Request, next: Next) -> Response {
    let id = match req.headers().get(&REQUEST_ID) {
        Some(v)
            if usable(v.as_bytes()) && req.headers().get_all(&REQUEST_ID).iter().count() == 1 =>
        {
            v.clone()
        }
        _ => {
            let id = generate();
            req.headers_mut().insert(REQUEST_ID, id.clone());
            id
        }
    };
    let mut resp = next.run(req).await;
    resp.headers_mut().insert(REQUEST_ID, id);
    resp
}

/// The request's id (set by [`stamp`]), for logs.
pub(super) fn of(headers: &HeaderMap) -> &str {
    headers
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
}

/// Whether a client's id can be kept: 1 to 128 visible ASCII characters (no spaces, no
/// control characters: it goes into logs and upstream headers as is).
fn usable(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_LEN && id.iter().all(|b| b.is_ascii_graphic())
}

/// A fresh id: 128 random bits in hex, as unlikely to collide as a UUID.
fn generate() -> HeaderValue {
    let hex = format!("{:032x}", rand::random::<u128>());
    HeaderValue::from_str(&hex).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_kept_only_when_usable() {
        assert!(usable(b"abc-123_XYZ.~:/"));
        assert!(usable(&[b'a'; 128]));
        for bad in [
            &b""[..],
            &[b'a'; 129],
            b"has space",
            b"tab\there",
            b"\x7f",
            "é".as_bytes(),
        ] {
            assert!(!usable(bad), "{bad:?}");
        }
    }

    #[test]
    fn generated_ids_are_usable_and_differ() {
        let (a, b) = (generate(), generate());
        assert_eq!(a.len(), 32);
        assert!(usable(a.as_bytes()));
        assert_ne!(a, b);
    }
}
