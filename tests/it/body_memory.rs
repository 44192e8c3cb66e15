//! Issue 14 item 2, memory: a tenant's 32 MiB body of token ids, forwarded, raises the router's
//! peak resident memory by about twice its size — the body, then either its token ids (while
//! routing reads them) or the copy with the tenant's salt written in (once they are gone), never
//! all three at once. Measured on a real `kvroute serve` process from `/proc` (`VmHWM`), so
//! allocator behaviour counts too.

use std::time::Duration;

use crate::support::*;
use sha2::{Digest, Sha256};

/// Bytes of the body sent: the size the outside probe used.
const BODY_BYTES: usize = 32 << 20;

/// A completions body of about `size` bytes whose prompt is token ids (the shape routing turns
/// into the largest parsed form: four bytes per id of five to seven bytes of text).
fn token_body(size: usize) -> Vec<u8> {
    let mut body = br#"{"model":"m","max_tokens":1,"prompt":["#.to_vec();
    let mut i: u64 = 0;
    while body.len() + 16 < size {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice((100 + (i * 7919) % 150_000).to_string().as_bytes());
        i += 1;
    }
    body.extend_from_slice(b"]}");
    body
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_large_token_body_costs_about_twice_its_size() {
    let backend = Backend::start("w0", &["m"]).await;
    let digest: String = Sha256::digest(b"acme-key")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let config = format!(
        "[server]\nmax_body_bytes = {}\n\n[[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{digest}\"\nmodels = [\"*\"]\n\n[[workers]]\nurl = \"{}\"\nmodels = [\"m\"]\n",
        2 * BODY_BYTES,
        backend.url()
    );
    let (router, _file) = RouterProcess::start(&config).await;
    let http = client();
    let url = format!("http://{}/v1/completions", router.addr);
    let send = |body: Vec<u8>| {
        http.post(&url)
            .bearer_auth("acme-key")
            .header("content-type", "application/json")
            .body(body)
            .timeout(Duration::from_secs(120))
            .send()
    };
    // Warm up: a small request brings the connection pools, tokenizer and index to their
    // resting size, so the reading after the large one is the large one's cost.
    let small = send(token_body(256)).await.unwrap();
    assert_eq!(small.status(), 200);
    let (before, _) = rss_mib(Some(router.pid()));

    let body = token_body(BODY_BYTES);
    let sent = body.len();
    let resp = send(body).await.unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let (after, _) = rss_mib(Some(router.pid()));

    let forwarded = backend.received();
    assert_eq!(forwarded.len(), 2, "both requests reached the worker");
    assert!(
        forwarded[1].body.starts_with(b"{\"cache_salt\":"),
        "the tenant's salt was written into the forwarded body"
    );
    let rise = (after - before) * 1024.0 * 1024.0 / sent as f64;
    println!("peak RSS {before:.1} → {after:.1} MiB: +{rise:.2}× the {sent}-byte body");
    // Original + ids + salted copy at once measured 2.64×; twice the body plus the parser's and
    // allocator's slack stays under 2.4× (issue target: 3×).
    assert!(
        rise <= 2.4,
        "peak RSS rose {rise:.2}× the body size (target ≤ 2.4×)"
    );
}
