//! Text → token ids, with a real Hugging Face tokenizer or the file-free `builtin` one.
//!
//! The router and the simulated engine tokenize through this same type, so a prompt costs the
//! same number of tokens on both sides and their block hashes line up.

use std::path::Path;

use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

/// Why text could not be tokenized.
#[derive(Debug, Error)]
pub enum TokenError {
    /// The tokenizer file could not be read or parsed.
    #[error("cannot load tokenizer from {path}: {reason}")]
    Load {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The tokenizer failed on this input.
    #[error("tokenization failed: {0}")]
    Encode(String),
    /// A model's chat template does not compile or is malformed (a configuration error).
    #[error("invalid chat template: {0}")]
    InvalidTemplate(String),
    /// Rendering the chat template failed on this request (including the template's own
    /// `raise_exception`): the client's fault, an HTTP 400 with this message.
    #[error("{0}")]
    Template(String),
}

impl TokenError {
    /// Whether the request caused the error (HTTP 400) rather than the router's setup.
    pub fn is_client_error(&self) -> bool {
        matches!(self, TokenError::Template(_) | TokenError::Encode(_))
    }
}

/// Size of the builtin tokenizer's vocabulary; ids are in `0..BUILTIN_VOCAB`.
pub const BUILTIN_VOCAB: u32 = 100_000;

/// A tokenizer for one model.
pub enum Tokenizer {
    /// Deterministic word-piece hashing, no files: about one token per word or punctuation mark,
    /// which is close to real BPE counts on English text.
    Builtin,
    /// A Hugging Face `tokenizer.json`.
    Hf(Box<tokenizers::Tokenizer>),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tokenizer::Builtin => f.write_str("Tokenizer::Builtin"),
            Tokenizer::Hf(_) => f.write_str("Tokenizer::Hf"),
        }
    }
}

impl Tokenizer {
    /// The builtin tokenizer.
    pub fn builtin() -> Self {
        Tokenizer::Builtin
    }

    /// Loads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, TokenError> {
        tokenizers::Tokenizer::from_file(path)
            .map(|t| Tokenizer::Hf(Box::new(t)))
            .map_err(|e| TokenError::Load {
                path: path.display().to_string(),
                reason: e.to_string(),
            })
    }

    /// Token ids of `text`, without adding special tokens (chat templates emit their own).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenError> {
        match self {
            Tokenizer::Builtin => Ok(builtin_encode(text)),
            Tokenizer::Hf(t) => t
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenError::Encode(e.to_string())),
        }
    }

    /// Token ids of `text` with the tokenizer's special tokens added (its post-processor: a BOS
    /// for Llama-style tokenizers, nothing for Qwen's), as transformers' `encode(text)` gives
    /// them and vLLM's `/tokenize` answers by default.
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>, TokenError> {
        match self {
            Tokenizer::Builtin => Ok(builtin_encode(text)),
            Tokenizer::Hf(t) => t
                .encode_fast(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenError::Encode(e.to_string())),
        }
    }

    /// Text of `ids`, where the tokenizer can decode (the builtin one cannot: it hashes).
    pub fn decode(&self, ids: &[u32]) -> Option<String> {
        match self {
            Tokenizer::Builtin => None,
            Tokenizer::Hf(t) => t.decode(ids, false).ok(),
        }
    }

    /// The vocabulary string of token `id` (transformers' `convert_ids_to_tokens`); `None` for
    /// an id outside the vocabulary and for every id of the builtin tokenizer, which has none.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match self {
            Tokenizer::Builtin => None,
            Tokenizer::Hf(t) => t.id_to_token(id),
        }
    }

    /// Whether the model is byte-pair encoding (transformers never cleans up a BPE tokenizer's
    /// decoded spaces).
    pub fn is_bpe(&self) -> bool {
        match self {
            Tokenizer::Builtin => false,
            Tokenizer::Hf(t) => matches!(t.get_model(), tokenizers::ModelWrapper::BPE(_)),
        }
    }
}

/// Splits text into pieces the way BPE pre-tokenizers roughly do (a word with its leading
/// space, a run of digits, a single punctuation mark, a run of whitespace) and hashes each
/// piece into the vocabulary.
fn builtin_encode(text: &str) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len() / 4 + 1);
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let c = char_at(text, i);
        if c == ' ' && i + 1 < bytes.len() && char_at(text, i + 1).is_alphanumeric() {
            i += 1;
            i = end_of_word(text, i);
        } else if c.is_alphanumeric() {
            i = end_of_word(text, i);
        } else if c.is_whitespace() {
            while i < bytes.len() && char_at(text, i).is_whitespace() {
                let w = char_at(text, i);
                // Leave a final space to lead the next word, as BPE does.
                if w == ' '
                    && i + 1 < bytes.len()
                    && char_at(text, i + 1).is_alphanumeric()
                    && i > start
                {
                    break;
                }
                i += w.len_utf8();
            }
        } else {
            i += c.len_utf8();
        }
        ids.push((xxh3_64(&bytes[start..i]) % BUILTIN_VOCAB as u64) as u32);
    }
    ids
}

fn char_at(text: &str, i: usize) -> char {
    text[i..].chars().next().unwrap_or('\0')
}

/// Words are cut at 8 bytes, like long words split into several BPE merges.
fn end_of_word(text: &str, mut i: usize) -> usize {
    let start = i;
    while i < text.len() {
        let c = char_at(text, i);
        if !c.is_alphanumeric() || i - start >= 8 {
            break;
        }
        i += c.len_utf8();
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_is_deterministic_and_word_sized() {
        let t = Tokenizer::builtin();
        let a = t.encode("Hello, world! How are you today?").unwrap();
        assert_eq!(a, t.encode("Hello, world! How are you today?").unwrap());
        // Hello , ␣world ! ␣How ␣are ␣you ␣today ?
        assert_eq!(a.len(), 9);
        assert!(a.iter().all(|&i| i < BUILTIN_VOCAB));
    }

    #[test]
    fn builtin_prefix_stability() {
        // Appending text never changes the ids of an earlier complete word.
        let t = Tokenizer::builtin();
        let a = t.encode("the quick brown fox").unwrap();
        let b = t.encode("the quick brown fox jumps over").unwrap();
        assert_eq!(&b[..a.len()], &a[..]);
    }

    #[test]
    fn builtin_handles_unicode_and_long_words() {
        let t = Tokenizer::builtin();
        let ids = t.encode("naïve 東京 supercalifragilistic\n\n  x").unwrap();
        assert!(ids.len() >= 6);
        assert!(t.encode("").unwrap().is_empty());
    }

    #[test]
    fn missing_file_is_a_load_error() {
        let e = Tokenizer::from_file(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
        assert!(matches!(e, TokenError::Load { .. }));
    }
}
