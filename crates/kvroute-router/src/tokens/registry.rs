//! The tokenization settings of every model the router serves.
//!
//! Configured models are loaded once at start (a Hugging Face tokenizer takes ~0.4 s to
//! load, and a broken file must stop the router at deploy time, not fail requests later).
//! A model nobody configured — discovered from a worker at run time — gets the builtin
//! tokenizer with the default block size on first use.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use super::hub::Hub;
use super::model::ModelTokens;
use super::source::{ModelSource, TokenizerSource};
use super::tokenizer::{TokenError, Tokenizer};

/// Per-model [`ModelTokens`], shared by all requests.
#[derive(Debug)]
pub struct ModelRegistry {
    models: RwLock<HashMap<String, Arc<ModelTokens>>>,
    default_block_size: usize,
}

impl ModelRegistry {
    /// Loads every configured model; a model not among them gets the builtin tokenizer with
    /// `default_block_size`. `token_cache_bytes` bounds each model's cache of repeated prompt
    /// segments. A model named by its Hugging Face id is read from the cache of the
    /// environment's hub ([`Hub::from_env`]), where the start fetched it.
    pub fn load<'a>(
        configured: impl IntoIterator<Item = ModelSource<'a>>,
        token_cache_bytes: u64,
        default_block_size: usize,
    ) -> Result<ModelRegistry, TokenError> {
        let cache_units = usize::try_from(token_cache_bytes / 4).unwrap_or(usize::MAX);
        let mut models = HashMap::new();
        let hub = Hub::from_env();
        for m in configured {
            let bs = m.block_size;
            let tokens = match &m.tokenizer {
                TokenizerSource::Builtin => ModelTokens::builtin(bs),
                TokenizerSource::Path(p) if p.is_dir() => {
                    ModelTokens::from_hf_dir(p, bs, cache_units)?
                }
                TokenizerSource::Path(p) => from_tokenizer_file(p, bs, cache_units)?,
                TokenizerSource::Hub(id) => {
                    let dir = hub.cached(id).ok_or_else(|| TokenError::Load {
                        path: format!("Hugging Face model `{id}`"),
                        reason: "not in the Hugging Face cache: `kvroute serve` fetches it at \
                                 start (tokens::hub::fetch_all)"
                            .into(),
                    })?;
                    ModelTokens::from_hf_dir(&dir, bs, cache_units)?
                }
            }
            .served_by(m.engine);
            if let Err(why) = tokens.segmenting() {
                tracing::info!(model = %m.name, reason = %why.0, "repeated prompt segments are not cached");
            }
            models.insert(m.name.to_owned(), Arc::new(tokens));
        }
        Ok(ModelRegistry {
            models: RwLock::new(models),
            default_block_size,
        })
    }

    /// The settings of `model` (builtin ones for a model not configured).
    pub fn get(&self, model: &str) -> Arc<ModelTokens> {
        if let Ok(m) = self.models.read()
            && let Some(t) = m.get(model)
        {
            return Arc::clone(t);
        }
        let builtin = Arc::new(ModelTokens::builtin(self.default_block_size));
        match self.models.write() {
            Ok(mut m) => Arc::clone(m.entry(model.to_string()).or_insert(builtin)),
            Err(_) => builtin,
        }
    }
}

/// A bare `tokenizer.json`, with a `tokenizer_config.json` beside it used for the chat
/// template when present.
fn from_tokenizer_file(
    path: &Path,
    bs: usize,
    cache_units: usize,
) -> Result<ModelTokens, TokenError> {
    match path.parent() {
        Some(dir)
            if dir.join("tokenizer_config.json").exists() && path.ends_with("tokenizer.json") =>
        {
            ModelTokens::from_hf_dir(dir, bs, cache_units)
        }
        _ => Ok(ModelTokens::new(
            Tokenizer::from_file(path)?,
            None,
            bs,
            cache_units,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::EngineKind;

    #[test]
    fn configured_and_unconfigured_models() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/tokenizers/qwen3"
        );
        let qwen = ModelSource {
            name: "qwen",
            tokenizer: &TokenizerSource::Path(dir.into()),
            block_size: 16,
            engine: EngineKind::Vllm,
        };
        let r = ModelRegistry::load([qwen], 32 << 20, 32).unwrap();
        let q = r.get("qwen");
        assert_eq!(q.block_size(), 16);
        assert!(matches!(q.tokenizer(), Tokenizer::Hf(_)));
        assert!(q.template().is_some());
        let other = r.get("other");
        assert_eq!(other.block_size(), 32);
        assert!(matches!(other.tokenizer(), Tokenizer::Builtin));
        assert!(Arc::ptr_eq(&other, &r.get("other")));
    }
}
