//! Which headers cross the proxy.
//!
//! Hop-by-hop headers describe one connection, not the message (RFC 9110 §7.6.1), so they are
//! dropped in both directions, along with any header the `Connection` header names. `Host` and
//! `Content-Length` are set afresh for the upstream request.

use http::HeaderMap;
use http::header::{self, HeaderName};

const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether `name` is hop-by-hop given the message's `Connection` header.
fn is_hop_by_hop(name: &HeaderName, connection_named: &[String]) -> bool {
    HOP_BY_HOP.contains(name)
        || name.as_str() == "keep-alive"
        || connection_named.iter().any(|c| c == name.as_str())
}

fn connection_named(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The end-to-end headers of a client request, without `Host` and `Content-Length`.
pub fn upstream_request_headers(client: &HeaderMap) -> HeaderMap {
    let named = connection_named(client);
    let mut out = HeaderMap::with_capacity(client.len());
    for (name, value) in client {
        if is_hop_by_hop(name, &named) || name == header::HOST || name == header::CONTENT_LENGTH {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// The end-to-end headers of an upstream response.
pub fn client_response_headers(upstream: &HeaderMap) -> HeaderMap {
    let named = connection_named(upstream);
    let mut out = HeaderMap::with_capacity(upstream.len() + 1);
    for (name, value) in upstream {
        if is_hop_by_hop(name, &named) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-secret-hop".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-secret-hop", "1".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("host", "router".parse().unwrap());
        h.insert("content-length", "12".parse().unwrap());
        h.insert("content-type", "application/json".parse().unwrap());
        h.append("x-custom", "a".parse().unwrap());
        h.append("x-custom", "b".parse().unwrap());
        let up = upstream_request_headers(&h);
        let names: Vec<_> = up.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "x-custom"]);
        assert_eq!(up.get_all("x-custom").iter().count(), 2);
        let down = client_response_headers(&h);
        assert!(down.get("content-length").is_some());
        assert!(down.get("transfer-encoding").is_none());
        assert!(down.get("x-secret-hop").is_none());
    }
}
