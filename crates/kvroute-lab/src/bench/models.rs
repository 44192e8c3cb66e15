//! Asking the target which model to send when the operator did not say.
//!
//! Sending a made-up name (`"default"`) used to get a 404 for every request and a run that
//! "succeeded"; an OpenAI server lists what it serves at `/v1/models`, so the first entry is
//! the model a bare `kvroute bench --target URL` means.

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
}

/// `/v1/models` on the server of `completions` (the URL requests go to).
pub fn models_url(completions: &Uri) -> anyhow::Result<Uri> {
    let authority = completions
        .authority()
        .context("the target URL has no host")?
        .clone();
    Uri::builder()
        .scheme(completions.scheme_str().unwrap_or("http"))
        .authority(authority)
        .path_and_query("/v1/models")
        .build()
        .context("cannot build the /v1/models URL")
}

/// The first model the server at `completions` lists, with what went wrong in words.
pub async fn first_model(completions: &Uri, timeout: Duration) -> anyhow::Result<String> {
    let url = models_url(completions)?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = Request::get(url.clone())
        .header(header::ACCEPT, "application/json")
        .body(Empty::new())
        .context("cannot build the /v1/models request")?;
    let response = tokio::time::timeout(timeout, client.request(request))
        .await
        .with_context(|| format!("no answer from {url} within {timeout:?}"))?
        .with_context(|| format!("cannot reach {url}"))?;
    let status = response.status();
    let body = tokio::time::timeout(timeout, response.into_body().collect())
        .await
        .with_context(|| format!("{url} did not finish its answer within {timeout:?}"))?
        .with_context(|| format!("cannot read the answer of {url}"))?
        .to_bytes();
    if !status.is_success() {
        bail!(
            "{url} answered {status}; give the model with --model ({})",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        );
    }
    parse_first(&body).with_context(|| format!("{url}: give the model with --model"))
}

fn parse_first(body: &[u8]) -> anyhow::Result<String> {
    let list: ModelList =
        serde_json::from_slice(body).context("the answer is not an OpenAI model list")?;
    match list.data.into_iter().next() {
        Some(m) => Ok(m.id),
        None => bail!("the server lists no model"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_listed_model_is_taken() {
        let body = br#"{"object":"list","data":[{"id":"qwen","object":"model"},{"id":"b"}]}"#;
        assert_eq!(parse_first(body).unwrap(), "qwen");
        assert!(parse_first(br#"{"object":"list","data":[]}"#).is_err());
        assert!(parse_first(b"not json").is_err());
    }

    #[test]
    fn the_models_url_is_on_the_targets_server() {
        let u: Uri = "http://h:9/v1/completions".parse().unwrap();
        assert_eq!(models_url(&u).unwrap().to_string(), "http://h:9/v1/models");
    }
}
