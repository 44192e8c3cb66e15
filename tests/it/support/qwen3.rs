//! The Qwen3 tokenizer and chat template from `tests/fixtures/tokenizers/qwen3`, loaded once per
//! test binary, for the token tests that compare against transformers' own output.

use std::sync::OnceLock;

use kvroute::tokens::ModelTokens;
use kvroute::tokens::model::DEFAULT_CACHE_UNITS;

use super::fixtures;

/// Qwen3's tokens with block size 16 and the default segment cache.
pub fn qwen3() -> &'static ModelTokens {
    static MODEL: OnceLock<ModelTokens> = OnceLock::new();
    MODEL.get_or_init(|| {
        ModelTokens::from_hf_dir(
            &fixtures().join("tokenizers/qwen3"),
            16,
            DEFAULT_CACHE_UNITS,
        )
        .unwrap()
    })
}
