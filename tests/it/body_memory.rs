//! Issue 14 item 2, memory: a tenant's 32 MiB body of token ids, forwarded, raises the router's
//! peak resident memory by about twice its size — the body, then either its token ids (while
//! routing reads them, kept compact: at most half the body) or the copy with the tenant's salt
//! written in (once they are gone), never all three at once. Measured on a real `kvroute serve` process from `/proc` (`VmHWM`), so
//! allocator behaviour counts too.

use std::time::Duration;

use crate::support::*;
use sha2::{Digest, Sha256};

/// Bytes of the body sent: the size the outside probe used.
const BODY_BYTES: usize = 32 << 20;

/// A completions body of about `size` bytes whose prompt is the token ids `id(0), id(1), …`.
fn token_body(size: usize, id: impl Fn(u64) -> u64) -> Vec<u8> {
    let mut body = br#"{"model":"m","max_tokens":1,"prompt":["#.to_vec();
    let mut i: u64 = 0;
    while body.len() + 16 < size {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(id(i).to_string().as_bytes());
        i += 1;
    }
    body.extend_from_slice(b"]}");
    body
}

/// Ids of five and six digits, as a real vocabulary's are: six to seven bytes of text each.
fn wide_id(i: u64) -> u64 {
    100 + (i * 7919) % 150_000
}

/// Ids of one digit: two bytes of text each, the most ids a body of this size can hold (as
/// `u32`s they would take twice the body).
fn one_digit_id(i: u64) -> u64 {
    i % 10
}

/// Sends a tenant's small body, then a `BODY_BYTES` one of `id`s, through a real `kvroute serve`
/// process; both must be forwarded with the tenant's salt. Returns how much the large one raised
/// the router's peak resident memory, as a multiple of its size.
async fn peak_rise(id: fn(u64) -> u64) -> f64 {
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
    let small_body = token_body(256, id);
    let small_len = small_body.len();
    let small = send(small_body).await.unwrap();
    assert_eq!(small.status(), 200);
    let (before, _) = rss_mib(Some(router.pid()));

    let body = token_body(BODY_BYTES, id);
    let sent = body.len();
    let after_brace = body[1..].to_vec();
    let resp = send(body).await.unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let (after, _) = rss_mib(Some(router.pid()));

    let forwarded = backend.received();
    assert_eq!(forwarded.len(), 2, "both requests reached the worker");
    assert!(
        forwarded[1].body.starts_with(b"{\"cache_salt\":"),
        "the tenant's salt was written into the forwarded body"
    );
    // Forwarded as sent, the salt's member apart (the same one in both requests).
    let salt_member = forwarded[0].body.len() - small_len;
    assert_eq!(forwarded[1].body.len(), sent + salt_member);
    assert!(forwarded[1].body[1 + salt_member..] == after_brace[..]);
    let rise = (after - before) * 1024.0 * 1024.0 / sent as f64;
    println!("peak RSS {before:.1} → {after:.1} MiB: +{rise:.2}× the {sent}-byte body");
    rise
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_large_token_body_costs_about_twice_its_size() {
    let rise = peak_rise(wide_id).await;
    // Original + ids + salted copy at once measured 2.64×; twice the body plus the parser's and
    // allocator's slack stays under 2.4× (issue target: 3×).
    assert!(
        rise <= 2.4,
        "peak RSS rose {rise:.2}× the body size (target ≤ 2.4×)"
    );
}

/// The worst case: one-digit ids are the most a body can hold (a million blocks). It measured
/// 3.25×: as `u32`s the ids took twice the body, and so did the approximate index, which
/// inserted every predicted block before trimming to its capacity. Kept compact, the ids take
/// half the body at most, and only the blocks the index keeps are inserted: 2.90–3.04×, the
/// rest being buffers glibc kept in its heap after its mmap threshold rose; with the threshold
/// fixed (`kvroute::heap`), 2.35×.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_large_body_of_one_digit_ids_costs_at_most_three_times_its_size() {
    let rise = peak_rise(one_digit_id).await;
    // Issue target: 3×. Measured 2.35× with the fixed threshold; 2.6× leaves the allocator's
    // slack and still fails if the dynamic threshold (2.9×) or a second copy came back.
    assert!(
        rise <= 2.6,
        "peak RSS rose {rise:.2}× the body size (target ≤ 2.6×)"
    );
}

/// A body of about `size` bytes: `head`, then a JSON array of one-digit numbers (the most
/// values a body of this size can hold), then `}`.
fn numbers_body(head: &str, size: usize) -> Vec<u8> {
    let mut body = head.as_bytes().to_vec();
    body.push(b'[');
    let mut i = 0u64;
    while body.len() + 4 < size {
        if i > 0 {
            body.push(b',');
        }
        body.push(b'0' + (i % 10) as u8);
        i += 1;
    }
    body.extend_from_slice(b"]}");
    body
}

/// How much a `BODY_BYTES` body of numbers sent to `path` raised a real `kvroute serve`
/// process's peak resident memory, as a multiple of its size (forwarded to a worker: the
/// router has no tokenizer of its own for `m`).
async fn endpoint_peak_rise(path: &str, head: &str) -> f64 {
    let backend = Backend::start("w0", &["m"]).await;
    let config = format!(
        "[server]\nmax_body_bytes = {}\n\n[[workers]]\nurl = \"{}\"\nmodels = [\"m\"]\n",
        2 * BODY_BYTES,
        backend.url()
    );
    let (router, _file) = RouterProcess::start(&config).await;
    let http = client();
    let url = format!("http://{}{path}", router.addr);
    let send = |body: Vec<u8>| {
        http.post(&url)
            .header("content-type", "application/json")
            .body(body)
            .timeout(Duration::from_secs(120))
            .send()
    };
    let small = send(numbers_body(head, 256)).await.unwrap();
    assert_eq!(small.status(), 200, "{path}: {:?}", small.text().await);
    let (before, _) = rss_mib(Some(router.pid()));
    let body = numbers_body(head, BODY_BYTES);
    let sent = body.len();
    let resp = send(body).await.unwrap();
    assert_eq!(resp.status(), 200, "{path}: {:?}", resp.text().await);
    let (after, _) = rss_mib(Some(router.pid()));
    assert_eq!(backend.received().len(), 2, "{path}: both forwarded");
    let rise = (after - before) * 1024.0 * 1024.0 / sent as f64;
    println!("{path}: peak RSS {before:.1} → {after:.1} MiB: +{rise:.2}× the {sent}-byte body");
    rise
}

/// Issue 35 item 3: `/v1/responses`, `/tokenize` and `/detokenize` parsed the whole body into a
/// `serde_json::Value` — a 32 MiB body of numbers cost about +1.2 GB (about 38× its size). Each
/// now reads only its members, each with a typed reader: the body costs about its own size.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_tokenize_and_detokenize_bodies_of_numbers_cost_about_their_size() {
    for (path, head) in [
        (
            "/v1/responses",
            r#"{"model":"m","input":"hi","metadata_blob":"#,
        ),
        ("/tokenize", r#"{"model":"m","prompt":"hi","extra":"#),
        ("/detokenize", r#"{"model":"m","tokens":"#),
    ] {
        let rise = endpoint_peak_rise(path, head).await;
        assert!(
            rise <= 2.0,
            "{path}: peak RSS rose {rise:.2}× the body size (target ≤ 2×)"
        );
    }
}
