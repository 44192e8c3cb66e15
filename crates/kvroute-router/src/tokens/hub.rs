//! A model's tokenizer named by its Hugging Face id (`tokenizer = "meta-llama/Llama-3.1-8B"`),
//! fetched once into the standard Hugging Face cache through the `hf-hub` crate and read from
//! there on every later start.
//!
//! Why a cache and not a download per start: the files (an 11 MB `tokenizer.json` for
//! Llama 3) do not change under a revision, a router restarts often, and the hub may be out
//! of reach from the cluster later. The cache is the one `huggingface_hub` (and so vLLM and
//! SGLang) use — `$HF_HOME/hub`, by default `~/.cache/huggingface/hub` — so a machine or
//! volume that already served the model needs no download at all.
//!
//! The files: `tokenizer.json` (required), `tokenizer_config.json` and `chat_template.jinja`
//! (optional: the chat template and the special-token strings, read by
//! [`super::ModelTokens::from_hf_dir`]). An optional file the hub does not have is recorded
//! as `huggingface_hub` records it (an empty file under `.no_exist/<commit>/`), so a later
//! start does not ask again. A file already in the cache is never asked for again: a second
//! start works with the hub unreachable.
//!
//! The environment, as `huggingface_hub` reads it: `HF_ENDPOINT` (default
//! `https://huggingface.co`), `HF_HOME` (the cache's parent), `HF_TOKEN` (else the token file
//! `huggingface-cli login` wrote in `HF_HOME`), `HF_HUB_OFFLINE` (`1`: the cache only).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hf_hub::api::tokio::{ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};

use super::source::{ModelSource, TokenizerSource};

/// The public hub, when `HF_ENDPOINT` does not name another.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The file a tokenizer cannot do without.
const REQUIRED: &str = "tokenizer.json";
/// The files that carry the chat template, when the model has them.
const OPTIONAL: [&str; 2] = ["tokenizer_config.json", "chat_template.jinja"];
/// How long one file's download may take before the start gives up (an 11 MB file at
/// 1 Mbit/s takes 90 s); the hub's client has no timeout of its own.
const FILE_TIMEOUT: Duration = Duration::from_secs(300);
/// The revision fetched: the hub's default branch.
const REVISION: &str = "main";

/// Where and how tokenizers are fetched.
#[derive(Clone, Debug)]
pub struct Hub {
    endpoint: String,
    cache: PathBuf,
    token: Option<String>,
    offline: bool,
}

/// Why a model's tokenizer could not be had from the hub. Each names the id, the endpoint
/// and the fix.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The hub answered with an error status.
    #[error(
        "cannot fetch `{file}` of Hugging Face model `{id}` from {endpoint}: HTTP {status}; {fix}"
    )]
    Status {
        /// The model id.
        id: String,
        /// The file asked for.
        file: &'static str,
        /// `HF_ENDPOINT`.
        endpoint: String,
        /// The status the hub answered.
        status: http::StatusCode,
        /// What to do about it.
        fix: &'static str,
    },
    /// No answer: no connection, a broken one, or none within [`FILE_TIMEOUT`].
    #[error(
        "cannot fetch `{file}` of Hugging Face model `{id}` from {endpoint}: {reason}; set \
         HF_ENDPOINT to a reachable hub or mirror, or fill the cache ({cache}) where the hub is \
         reachable and start with HF_HUB_OFFLINE=1, or give a local directory holding \
         tokenizer.json"
    )]
    Unreachable {
        /// The model id.
        id: String,
        /// The file asked for.
        file: &'static str,
        /// `HF_ENDPOINT`.
        endpoint: String,
        /// The cache directory.
        cache: String,
        /// What the connection did.
        reason: String,
    },
    /// `HF_HUB_OFFLINE` is set and the cache does not hold the tokenizer.
    #[error(
        "Hugging Face model `{id}`: tokenizer.json is not in the cache ({cache}) and \
         HF_HUB_OFFLINE is set; fetch it once with the hub reachable (unset HF_HUB_OFFLINE), \
         point HF_HOME at a cache that holds it, or give a local directory"
    )]
    NotCached {
        /// The model id.
        id: String,
        /// The cache directory.
        cache: String,
    },
    /// Anything else: the cache cannot be written, the endpoint does not speak the hub's
    /// file API (a header missing), ...
    #[error("cannot fetch `{file}` of Hugging Face model `{id}` from {endpoint}: {reason}")]
    Other {
        /// The model id.
        id: String,
        /// The file asked for.
        file: &'static str,
        /// `HF_ENDPOINT`.
        endpoint: String,
        /// What went wrong.
        reason: String,
    },
}

impl HubError {
    /// Whether the hub said the file is not there (an optional file may be absent).
    fn is_not_found(&self) -> bool {
        matches!(self, HubError::Status { status, .. } if *status == http::StatusCode::NOT_FOUND)
    }
}

impl Hub {
    /// The hub and cache of the environment (`HF_ENDPOINT`, `HF_HOME`, `HF_TOKEN` or the
    /// token file, `HF_HUB_OFFLINE`).
    pub fn from_env() -> Hub {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let cache = Cache::from_env();
        let token = var("HF_TOKEN").or_else(|| cache.token());
        Hub {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned()),
            cache: cache.path().clone(),
            token,
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| is_true(&v)),
        }
    }

    /// A hub at `endpoint` with its cache in `cache` (the `hub` directory itself).
    pub fn new(endpoint: &str, cache: &Path, token: Option<String>, offline: bool) -> Hub {
        Hub {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            cache: cache.to_owned(),
            token,
            offline,
        }
    }

    /// The directory holding model `id`'s cached `tokenizer.json` (and the optional files
    /// it was fetched with), if the cache has it. Reads the disk only.
    pub fn cached(&self, id: &str) -> Option<PathBuf> {
        let file = self.cache_repo(id).get(REQUIRED)?;
        file.parent().map(Path::to_path_buf)
    }

    /// Model `id`'s tokenizer directory: from the cache when there, else fetched into it.
    pub async fn fetch(&self, id: &str) -> Result<PathBuf, HubError> {
        let api = self.api(id)?;
        let repo = api.repo(self.repo(id));
        let cached = self.cached(id);
        let fetched_before = cached.is_some();
        let dir = match cached {
            Some(dir) => {
                tracing::info!(model_id = id, path = %dir.display(), "tokenizer read from the Hugging Face cache");
                dir
            }
            None if self.offline => {
                return Err(HubError::NotCached {
                    id: id.to_owned(),
                    cache: self.cache.display().to_string(),
                });
            }
            None => {
                let file = self.download(&repo, id, REQUIRED).await?;
                tracing::info!(model_id = id, endpoint = %self.endpoint, path = %file.display(), "tokenizer fetched from the Hugging Face hub into its cache");
                file.parent().map(Path::to_path_buf).ok_or_else(|| {
                    self.other(id, REQUIRED, "the cache gave a path without a directory")
                })?
            }
        };
        for file in OPTIONAL {
            if dir.join(file).exists() || self.offline || self.known_absent(id, &dir, file) {
                continue;
            }
            match self.download(&repo, id, file).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => self.mark_absent(id, &dir, file),
                // A cache filled by another client may lack the record of an absent file:
                // with the hub out of reach, start on what the cache holds, saying so.
                Err(e @ HubError::Unreachable { .. }) if fetched_before => {
                    tracing::warn!(model_id = id, file, error = %e, "starting without this file: if the model has it, its chat template may be missing; set HF_HUB_OFFLINE=1 to start from the cache without asking the hub");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(dir)
    }

    fn repo(&self, id: &str) -> Repo {
        Repo::with_revision(id.to_owned(), RepoType::Model, REVISION.to_owned())
    }

    fn cache_repo(&self, id: &str) -> hf_hub::CacheRepo {
        Cache::new(self.cache.clone()).repo(self.repo(id))
    }

    fn api(&self, id: &str) -> Result<hf_hub::api::tokio::Api, HubError> {
        ApiBuilder::from_cache(Cache::new(self.cache.clone()))
            .with_endpoint(self.endpoint.clone())
            .with_token(self.token.clone())
            .with_progress(false)
            .with_user_agent("kvroute", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| self.other(id, REQUIRED, &e.to_string()))
    }

    /// Downloads `file` of `id` into the cache, within [`FILE_TIMEOUT`].
    async fn download(
        &self,
        repo: &hf_hub::api::tokio::ApiRepo,
        id: &str,
        file: &'static str,
    ) -> Result<PathBuf, HubError> {
        match tokio::time::timeout(FILE_TIMEOUT, repo.download(file)).await {
            Ok(Ok(path)) => Ok(path),
            Ok(Err(e)) => Err(self.explain(id, file, e)),
            Err(_) => Err(HubError::Unreachable {
                id: id.to_owned(),
                file,
                endpoint: self.endpoint.clone(),
                cache: self.cache.display().to_string(),
                reason: format!("no complete answer within {FILE_TIMEOUT:?}"),
            }),
        }
    }

    /// The hub client's error as what the operator must do.
    fn explain(&self, id: &str, file: &'static str, e: ApiError) -> HubError {
        match e {
            ApiError::RequestError(e) if e.status().is_some() => {
                let status = e.status().unwrap_or_default();
                HubError::Status {
                    id: id.to_owned(),
                    file,
                    endpoint: self.endpoint.clone(),
                    status,
                    fix: fix_for(status),
                }
            }
            ApiError::RequestError(e) if e.is_connect() || e.is_timeout() || e.is_request() => {
                HubError::Unreachable {
                    id: id.to_owned(),
                    file,
                    endpoint: self.endpoint.clone(),
                    cache: self.cache.display().to_string(),
                    reason: error_chain(&e),
                }
            }
            other => self.other(id, file, &error_chain(&other)),
        }
    }

    fn other(&self, id: &str, file: &'static str, reason: &str) -> HubError {
        HubError::Other {
            id: id.to_owned(),
            file,
            endpoint: self.endpoint.clone(),
            reason: reason.to_owned(),
        }
    }

    /// `huggingface_hub`'s record of a file the revision does not have:
    /// `<repo>/.no_exist/<commit>/<file>`, the commit being the snapshot `dir` names.
    fn absent_marker(&self, id: &str, dir: &Path, file: &str) -> Option<PathBuf> {
        let commit = dir.file_name()?;
        Some(
            self.cache
                .join(self.repo(id).folder_name())
                .join(".no_exist")
                .join(commit)
                .join(file),
        )
    }

    fn known_absent(&self, id: &str, dir: &Path, file: &str) -> bool {
        self.absent_marker(id, dir, file)
            .is_some_and(|m| m.exists())
    }

    /// Records that `file` is absent; a failure to record only costs a question next time.
    fn mark_absent(&self, id: &str, dir: &Path, file: &str) {
        let Some(marker) = self.absent_marker(id, dir, file) else {
            return;
        };
        let written = marker
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&marker, b""));
        if let Err(e) = written {
            tracing::debug!(model_id = id, file, error = %e, "cannot record an absent file in the cache");
        }
    }
}

/// What to do about the hub's `status`.
fn fix_for(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        401 | 403 => {
            "the model is gated or private (or does not exist: the hub answers 401 for both): \
             set HF_TOKEN to a token that was granted access to it, or give a local directory \
             holding tokenizer.json"
        }
        404 => {
            "no such model or file on this hub: check the id (ORG/NAME as on the model's page) \
             and HF_ENDPOINT, or give a local directory holding tokenizer.json"
        }
        429 => "the hub limits the rate of requests: retry later, or set HF_TOKEN",
        _ => {
            "retry later, or set HF_ENDPOINT to a mirror, or give a local directory holding \
             tokenizer.json"
        }
    }
}

/// An error and its sources, one line (reqwest's own message hides the cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Whether `s` has the shape of a Hugging Face model id, `ORG/NAME`: one slash, each part of
/// letters, digits, `-`, `_` and `.`, not starting with `.` or `-`, no `..` or `--`, at most
/// 96 characters (the hub's own rule). Ids without an organisation (`gpt2`) are not
/// accepted: they read as a file name, and the hub now serves them under one.
pub fn is_model_id(s: &str) -> bool {
    let Some((org, name)) = s.split_once('/') else {
        return false;
    };
    let part = |p: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '-'])
            && !p.ends_with(['.', '-'])
            && !p.contains("..")
            && !p.contains("--")
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    s.len() <= 96 && part(org) && part(name) && !name.ends_with(".json")
}

/// `huggingface_hub`'s reading of a boolean variable.
fn is_true(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_uppercase().as_str(),
        "1" | "ON" | "YES" | "TRUE"
    )
}

/// A configured model whose tokenizer could not be had from the hub.
#[derive(Debug, thiserror::Error)]
#[error("model `{model}`: tokenizer: {error}")]
pub struct ModelFetchError {
    /// The model name as clients send it.
    pub model: String,
    /// Why (in the message already, so not a `source` printed twice).
    pub error: HubError,
}

/// Fetches (or finds in the cache) the tokenizer of every model configured with a Hugging
/// Face id, before the registry loads them ([`super::ModelRegistry::load`] reads the cache
/// only). Fails on the first model that cannot be had, naming it.
pub async fn fetch_all<'a>(
    hub: &Hub,
    models: impl IntoIterator<Item = ModelSource<'a>>,
) -> Result<(), ModelFetchError> {
    for m in models {
        if let TokenizerSource::Hub(id) = m.tokenizer {
            hub.fetch(id).await.map_err(|error| ModelFetchError {
                model: m.name.to_owned(),
                error,
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offline_reads_as_huggingface_hub_does() {
        for v in ["1", "true", "ON", " yes "] {
            assert!(is_true(v), "{v}");
        }
        for v in ["0", "false", "off", ""] {
            assert!(!is_true(v), "{v}");
        }
    }

    #[test]
    fn model_ids_are_org_slash_name() {
        for id in [
            "meta-llama/Llama-3.1-8B-Instruct",
            "Qwen/Qwen3-0.6B",
            "org_x/name.v2",
        ] {
            assert!(is_model_id(id), "{id}");
        }
        for not in [
            "gpt2",
            "/models/llama",
            "./llama/tokenizer",
            "../x/y",
            "a/b/c",
            "org/tokenizer.json",
            "org/",
            "/name",
            "org/na me",
            "org/a..b",
            "~/models",
        ] {
            assert!(!is_model_id(not), "{not}");
        }
    }

    #[test]
    fn each_status_has_its_fix() {
        assert!(fix_for(http::StatusCode::UNAUTHORIZED).contains("HF_TOKEN"));
        assert!(fix_for(http::StatusCode::NOT_FOUND).contains("check the id"));
        assert!(fix_for(http::StatusCode::BAD_GATEWAY).contains("retry later"));
    }

    #[test]
    fn an_empty_cache_has_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::new("http://127.0.0.1:9", dir.path(), None, true);
        assert_eq!(hub.cached("org/name"), None);
    }
}
