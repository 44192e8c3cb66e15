//! Everything kvroute knows about one model's tokens: its tokenizer, chat template, block size
//! and the cache of already-tokenized pieces — and the one call the request path needs, from a
//! request to token ids.
//!
//! A `ModelTokens` is built once per served model and shared behind an `Arc` by every request
//! (it is `Send + Sync`; the piece cache locks one of 16 shards for a few hundred
//! nanoseconds per piece). Tokenizing is CPU work of up to milliseconds: callers on an async
//! runtime should run [`ModelTokens::prompt_ids`] on a blocking thread.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value as Json;

use super::builtin_chat;
use super::byte_bpe::ByteBpe;
use super::chat_template::{ChatRequest, ChatTemplate};
use super::engine_tools::EngineKind;
use super::hash::{BlockHash, HashSeed, block_hashes};
use super::media::{self, MediaMark};
use super::segment::{CacheStats, Piece, SegmentCache, Segmenter, Unsegmentable};
use super::tokenizer::{TokenError, Tokenizer};
use crate::openai::{Input, Prompt, RequestView, TokenIds};

/// Default bound of the piece cache, in 4-byte units (≈ 32 MB, ≈ 4 M tokens of text).
pub const DEFAULT_CACHE_UNITS: usize = 8 << 20;

/// A model's tokenizer, chat template and block size.
pub struct ModelTokens {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    block_size: usize,
    /// Which engine serves the model: which tools it renders into a chat prompt.
    engine: EngineKind,
    pieces: Result<Pieces, Unsegmentable>,
    /// Whether decoding cleans up spaces before punctuation (`tokenizer_config.json`'s
    /// `clean_up_tokenization_spaces`, which transformers applies to non-BPE tokenizers only,
    /// unless `clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output`).
    clean_up_spaces: bool,
}

/// Segmenting and its cache, when the tokenizer allows it.
struct Pieces {
    segmenter: Segmenter,
    cache: SegmentCache,
    /// The exact byte-level BPE fast path for pieces, when the tokenizer has one.
    fast: Option<ByteBpe>,
}

impl std::fmt::Debug for ModelTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokens")
            .field("tokenizer", &self.tokenizer)
            .field("template", &self.template.is_some())
            .field("block_size", &self.block_size)
            .field("engine", &self.engine)
            .field("segmenting", &self.pieces.as_ref().map(|_| ()))
            .finish()
    }
}

impl ModelTokens {
    /// The file-free `builtin` tokenizer with the builtin chat format.
    pub fn builtin(block_size: usize) -> ModelTokens {
        ModelTokens {
            tokenizer: Tokenizer::builtin(),
            template: None,
            block_size,
            engine: EngineKind::default(),
            // The builtin tokenizer is cheaper than a cache lookup.
            pieces: Err(Unsegmentable("the builtin tokenizer needs no cache".into())),
            clean_up_spaces: false,
        }
    }

    /// A model from a tokenizer and an optional chat template (the builtin chat format is
    /// used without one). For a Hugging Face tokenizer, segmenting with a cache of
    /// `cache_units` (see [`SegmentCache`]) is enabled when it is provably exact;
    /// [`ModelTokens::segmenting`] tells why not otherwise.
    pub fn new(
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        block_size: usize,
        cache_units: usize,
    ) -> ModelTokens {
        let pieces = match &tokenizer {
            Tokenizer::Builtin => Err(Unsegmentable("the builtin tokenizer needs no cache".into())),
            Tokenizer::Hf(_) if cache_units == 0 => {
                Err(Unsegmentable("the piece cache is disabled".into()))
            }
            Tokenizer::Hf(t) => Segmenter::for_tokenizer(t).map(|segmenter| Pieces {
                segmenter,
                cache: SegmentCache::new(cache_units),
                fast: ByteBpe::for_tokenizer(t)
                    .inspect_err(
                        |e| tracing::debug!(reason = %e, "tokenizing without the fast path"),
                    )
                    .ok(),
            }),
        };
        ModelTokens {
            tokenizer,
            template,
            block_size,
            engine: EngineKind::default(),
            pieces,
            clean_up_spaces: false,
        }
    }

    /// The same model, served by `engine` (which tools its chat prompts render).
    pub fn served_by(mut self, engine: EngineKind) -> ModelTokens {
        self.engine = engine;
        self
    }

    /// Loads a Hugging Face model directory: `tokenizer.json`, the chat template from
    /// `chat_template.jinja` (transformers 5's layout) or else from `tokenizer_config.json`,
    /// and the special tokens from `tokenizer_config.json`. Missing template files mean the
    /// builtin chat format.
    pub fn from_hf_dir(
        dir: &Path,
        block_size: usize,
        cache_units: usize,
    ) -> Result<ModelTokens, TokenError> {
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let config_path = dir.join("tokenizer_config.json");
        let config: Json = if config_path.exists() {
            read_json(&config_path)?
        } else {
            Json::Null
        };
        let jinja_path = dir.join("chat_template.jinja");
        let template = if jinja_path.exists() {
            let source = std::fs::read_to_string(&jinja_path).map_err(|e| TokenError::Load {
                path: jinja_path.display().to_string(),
                reason: e.to_string(),
            })?;
            Some(ChatTemplate::from_source(&source, &config)?)
        } else {
            ChatTemplate::from_tokenizer_config(&config)?
        };
        let flag = |key: &str| config.get(key).and_then(Json::as_bool) == Some(true);
        let mut tokens = ModelTokens::new(tokenizer, template, block_size, cache_units);
        tokens.clean_up_spaces = flag("clean_up_tokenization_spaces")
            && (!tokens.tokenizer.is_bpe()
                || flag("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"));
        Ok(tokens)
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template, if the model has one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// The engine's KV block size in tokens.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// `Ok` when texts are cut at added tokens and pieces cached; otherwise why every text is
    /// encoded whole (worth a log line at startup).
    pub fn segmenting(&self) -> Result<(), &Unsegmentable> {
        self.pieces.as_ref().map(|_| ())
    }

    /// The same model with pieces encoded by `tokenizers` only, to measure the fast path
    /// against it.
    #[cfg(feature = "testing")]
    pub fn without_fast_path(mut self) -> ModelTokens {
        if let Ok(p) = &mut self.pieces {
            p.fast = None;
        }
        self
    }

    /// Whether pieces are encoded by the byte-level BPE fast path ([`ByteBpe`]).
    pub fn fast_path(&self) -> bool {
        self.pieces.as_ref().is_ok_and(|p| p.fast.is_some())
    }

    /// Statistics of the piece cache, when segmenting.
    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.pieces.as_ref().ok().map(|p| p.cache.stats())
    }

    /// The prompt text of a chat request, as the engine renders it.
    pub fn render_chat(&self, req: &ChatRequest<'_>) -> Result<String, TokenError> {
        match &self.template {
            Some(t) => t.render(req),
            None => Ok(builtin_chat::render(req)),
        }
    }

    /// Token ids of `text` without special tokens added — identical to
    /// [`Tokenizer::encode`], but pieces between added tokens seen before cost a lookup.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenError> {
        let Ok(pieces) = &self.pieces else {
            return self.tokenizer.encode(text);
        };
        let mut ids = Vec::with_capacity(text.len() / 3 + 8);
        for piece in pieces.segmenter.split(text) {
            match piece {
                Piece::Marker(id) => ids.push(id),
                Piece::Text(t) => match pieces.cache.get(t) {
                    Some(cached) => ids.extend_from_slice(&cached),
                    None => {
                        let fresh = match pieces.fast.as_ref().and_then(|f| f.encode(t)) {
                            Some(ids) => ids,
                            None => self.tokenizer.encode(t)?,
                        };
                        let fresh: Arc<[u32]> = fresh.into();
                        ids.extend_from_slice(&fresh);
                        pieces.cache.insert(t, fresh);
                    }
                },
            }
        }
        Ok(ids)
    }

    /// Token ids of `text` with the tokenizer's special tokens added (see
    /// [`Tokenizer::encode_with_special_tokens`]); not cached.
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>, TokenError> {
        self.tokenizer.encode_with_special_tokens(text)
    }

    /// The text of `ids` as transformers' `decode(ids)` gives it (special tokens kept, spaces
    /// cleaned up when the tokenizer's configuration asks for it); `None` when the tokenizer
    /// cannot decode (the builtin one).
    pub fn decode(&self, ids: &[u32]) -> Option<String> {
        let text = self.tokenizer.decode(ids)?;
        Some(if self.clean_up_spaces {
            clean_up_tokenization(&text)
        } else {
            text
        })
    }

    /// The vocabulary strings of `ids` (transformers' `convert_ids_to_tokens`); `None` when one
    /// is not in the vocabulary, or the tokenizer has none (the builtin one).
    pub fn token_strs(&self, ids: &[u32]) -> Option<Vec<String>> {
        ids.iter()
            .map(|&id| self.tokenizer.id_to_token(id))
            .collect()
    }

    /// The token ids routing uses for a request.
    ///
    /// - completion text: encoded; a batch of texts (or of token lists): the **first** prompt
    ///   only — a batch is routed as a whole to one worker, and its first prompt's prefix is
    ///   what that worker will look up first;
    /// - completion token ids: as given;
    /// - chat: rendered with the chat template, then encoded without adding special tokens
    ///   (templates emit their own BOS).
    pub fn prompt_ids(&self, view: &RequestView) -> Result<Vec<u32>, TokenError> {
        match &view.input {
            Input::Prompt(Prompt::Text(text)) => self.encode(text),
            Input::Prompt(Prompt::Texts(texts)) => match texts.first() {
                Some(text) => self.encode(text),
                None => Ok(Vec::new()),
            },
            Input::Prompt(Prompt::Tokens(ids)) => Ok(ids.to_vec()),
            Input::Prompt(Prompt::TokenBatches(batches)) => {
                Ok(batches.first().map(TokenIds::to_vec).unwrap_or_default())
            }
            Input::Messages(messages) => self.chat_ids(view, messages),
        }
    }

    /// `messages` rendered with `view`'s chat settings, then encoded.
    fn chat_ids(&self, view: &RequestView, messages: &[Json]) -> Result<Vec<u32>, TokenError> {
        let tools = self
            .engine
            .template_tools(view.tools.as_ref(), view.tool_choice.as_ref());
        let text = self.render_chat(&ChatRequest {
            messages,
            tools: tools.as_deref(),
            add_generation_prompt: view.add_generation_prompt,
            kwargs: view.chat_template_kwargs.as_ref(),
        })?;
        self.encode(&text)
    }

    /// [`Self::prompt_ids`], and for a chat with media (images, audio, video) where they begin
    /// in those ids and what they are ([`super::media`]): routing hashes the blocks from there
    /// on with the media, as the engine keys them. A chat whose media cannot be placed (its
    /// marked rendering fails) is marked from its first token: never credited for another
    /// request's media.
    pub fn prompt_ids_marked(
        &self,
        view: &RequestView,
    ) -> Result<(Vec<u32>, Option<MediaMark>), TokenError> {
        let ids = self.prompt_ids(view)?;
        let Input::Messages(messages) = &view.input else {
            return Ok((ids, None));
        };
        // A Responses input's media were flattened out of its messages' text; a chat's are
        // parts of them.
        let (digest, marked) = match view.flattened_media {
            Some(m) => (m.digest, media::marked_from(messages, m.message)),
            None => match media::digest(messages) {
                Some(digest) => (digest, media::marked(messages)),
                None => return Ok((ids, None)),
            },
        };
        let mark = match self.chat_ids(view, &marked) {
            Ok(marked_ids) => media::mark(&ids, &marked_ids, digest),
            Err(_) => MediaMark { at: 0, digest },
        };
        Ok((ids, Some(mark)))
    }

    /// The length of the longest prompt a request carries: for a batch, of any of its
    /// prompts, where [`Self::prompt_ids`] takes the first. An engine runs each prompt of a
    /// batch as a request of its own and refuses the batch when one of them does not fit its
    /// context, so a batch goes only where its longest prompt fits.
    pub fn longest_prompt_len(&self, view: &RequestView) -> Result<usize, TokenError> {
        match &view.input {
            Input::Prompt(Prompt::Texts(texts)) => texts
                .iter()
                .try_fold(0, |longest, text| Ok(longest.max(self.encode(text)?.len()))),
            Input::Prompt(Prompt::TokenBatches(batches)) => {
                Ok(batches.iter().map(TokenIds::len).max().unwrap_or(0))
            }
            _ => Ok(self.prompt_ids(view)?.len()),
        }
    }

    /// Chained hashes of the full blocks of `ids`.
    pub fn block_hashes(&self, ids: &[u32], seed: HashSeed) -> Vec<BlockHash> {
        block_hashes(seed, ids, self.block_size)
    }
}

/// The hash seed of a request: the served model's name, the LoRA adapter (if the request
/// names one) and the tenant-namespaced cache salt. Empty strings count as absent, so
/// `"cache_salt": ""` shares the unsalted cache just as the engine treats it.
pub fn hash_seed(model: &str, lora: Option<&str>, cache_salt: Option<&str>) -> HashSeed {
    HashSeed::new(
        model,
        lora.filter(|s| !s.is_empty()),
        cache_salt.filter(|s| !s.is_empty()),
    )
}

/// The name an engine's KV events give the LoRA adapter a client requested as `model`, running
/// on `base`: the model name itself (vLLM: clients send the adapter's name), or what follows
/// `BASE:` when the client used SGLang's `"model": "BASE:ADAPTER"` form (SGLang's events name
/// the adapter alone, `lora_name = ADAPTER`).
pub fn adapter_name<'a>(model: &'a str, base: &str) -> &'a str {
    model
        .strip_prefix(base)
        .and_then(|rest| rest.strip_prefix(':'))
        .filter(|adapter| !adapter.is_empty())
        .unwrap_or(model)
}

/// transformers' `clean_up_tokenization`: spaces before punctuation and English contractions
/// removed.
fn clean_up_tokenization(text: &str) -> String {
    text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

fn read_json(path: &Path) -> Result<Json, TokenError> {
    let err = |reason: String| TokenError::Load {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::Endpoint;
    use serde_json::json;

    #[test]
    fn an_adapter_is_named_as_the_engines_events_name_it() {
        // vLLM: the adapter's own name; SGLang: `BASE:ADAPTER`, whose events say `ADAPTER`.
        assert_eq!(adapter_name("sql-lora", "qwen"), "sql-lora");
        assert_eq!(adapter_name("qwen:sql-lora", "qwen"), "sql-lora");
        assert_eq!(adapter_name("qwen:", "qwen"), "qwen:");
        assert_eq!(adapter_name("qwen2:sql", "qwen"), "qwen2:sql");
        assert_eq!(
            hash_seed("qwen", Some(adapter_name("qwen:sql-lora", "qwen")), None),
            hash_seed("qwen", Some("sql-lora"), None)
        );
    }

    fn view(endpoint: Endpoint, body: Json) -> RequestView {
        RequestView::parse(endpoint, &body).unwrap()
    }

    #[test]
    fn builtin_prompt_shapes() {
        let m = ModelTokens::builtin(4);
        let text = m
            .prompt_ids(&view(
                Endpoint::Completions,
                json!({"model": "m", "prompt": "a b c"}),
            ))
            .unwrap();
        assert_eq!(text, m.tokenizer().encode("a b c").unwrap());
        let batch = m
            .prompt_ids(&view(
                Endpoint::Completions,
                json!({"model": "m", "prompt": ["a b c", "z"]}),
            ))
            .unwrap();
        assert_eq!(batch, text);
        let ids = m
            .prompt_ids(&view(
                Endpoint::Completions,
                json!({"model": "m", "prompt": [5, 6, 7]}),
            ))
            .unwrap();
        assert_eq!(ids, vec![5, 6, 7]);
        let first = m
            .prompt_ids(&view(
                Endpoint::Completions,
                json!({"model": "m", "prompt": [[1, 2], [3]]}),
            ))
            .unwrap();
        assert_eq!(first, vec![1, 2]);
        assert!(m.segmenting().is_err());
    }

    #[test]
    fn a_chats_media_are_marked_where_they_begin() {
        let m = ModelTokens::builtin(4);
        let chat = |parts: Json| {
            view(
                Endpoint::ChatCompletions,
                json!({"model": "m", "messages": [
                    {"role": "system", "content": "a b c d e f g h"},
                    {"role": "user", "content": parts},
                ]}),
            )
        };
        let with_image = chat(json!([
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
            {"type": "text", "text": "and tell me more"},
        ]));
        let (ids, mark) = m.prompt_ids_marked(&with_image).unwrap();
        assert_eq!(ids, m.prompt_ids(&with_image).unwrap());
        let mark = mark.expect("a chat with an image is marked");
        // The builtin template prints nothing for the image: its place is where the marked
        // rendering's marker begins: after the text before it (and the newline the builtin
        // joins parts with), well before the end (the text after it).
        let before = chat(json!([{"type": "text", "text": "look"}]));
        let before = m.prompt_ids(&before).unwrap();
        assert!(mark.at > 1, "{mark:?}");
        assert_eq!(ids[..mark.at - 1], before[..mark.at - 1], "{mark:?}");
        assert!(mark.at + 10 < ids.len(), "{mark:?} {}", ids.len());
        // Another image: another digest, the same place.
        let other = chat(json!([
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "https://x/b.png"}},
            {"type": "text", "text": "and tell me more"},
        ]));
        let (_, other) = m.prompt_ids_marked(&other).unwrap();
        let other = other.unwrap();
        assert_eq!(other.at, mark.at);
        assert_ne!(other.digest, mark.digest);
        // Text alone is not marked.
        let plain = chat(json!([{"type": "text", "text": "look"}]));
        assert_eq!(m.prompt_ids_marked(&plain).unwrap().1, None);
    }

    #[test]
    fn a_responses_inputs_media_are_marked_where_their_message_begins() {
        let m = ModelTokens::builtin(4);
        let responses = |image: &str| {
            let r = crate::openai::ResponsesRequest::parse(&json!({
                "model": "m", "instructions": "a b c d e f g h",
                "input": [
                    {"role": "user", "content": "first turn"},
                    {"role": "user", "content": [
                        {"type": "input_text", "text": "look and tell me more"},
                        {"type": "input_image", "image_url": image},
                    ]},
                ],
            }))
            .unwrap();
            r.chat_view("m")
        };
        let a = responses("https://x/a.png");
        let (ids, mark) = m.prompt_ids_marked(&a).unwrap();
        assert_eq!(ids, m.prompt_ids(&a).unwrap());
        let mark = mark.expect("an input with an image is marked");
        // The image's message is the third (after the instructions and the first turn): the
        // mark is past the first two and before that message's text.
        let Input::Messages(messages) = &a.input else {
            panic!("a chat view");
        };
        let upto = |n: usize| {
            let mut v = a.clone();
            v.input = Input::Messages(messages[..n].to_vec());
            v.add_generation_prompt = false;
            m.prompt_ids(&v).unwrap().len()
        };
        assert!(mark.at >= upto(2), "{mark:?}");
        assert!(mark.at + 4 < ids.len(), "{mark:?} {}", ids.len());
        // Another image: another digest, the same place; the same image, the same digest.
        let (_, b) = m.prompt_ids_marked(&responses("https://x/b.png")).unwrap();
        let b = b.unwrap();
        assert_eq!(b.at, mark.at);
        assert_ne!(b.digest, mark.digest);
        let (_, again) = m.prompt_ids_marked(&responses("https://x/a.png")).unwrap();
        assert_eq!(again, Some(mark));
    }

    #[test]
    fn a_batch_is_as_long_as_its_longest_prompt() {
        let m = ModelTokens::builtin(4);
        let len = |body| {
            m.longest_prompt_len(&view(Endpoint::Completions, body))
                .unwrap()
        };
        let long = m.tokenizer().encode("a b c d e f").unwrap().len();
        assert!(long > m.tokenizer().encode("z").unwrap().len());
        assert_eq!(
            len(json!({"model": "m", "prompt": ["z", "a b c d e f"]})),
            long
        );
        assert_eq!(
            len(json!({"model": "m", "prompt": [[1, 2], [3, 4, 5], [6]]})),
            3
        );
        assert_eq!(len(json!({"model": "m", "prompt": [5, 6, 7, 8]})), 4);
        assert_eq!(len(json!({"model": "m", "prompt": "a b c d e f"})), long);
    }

    #[test]
    fn builtin_chat_is_rendered_then_encoded() {
        let m = ModelTokens::builtin(4);
        let v = view(
            Endpoint::ChatCompletions,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        );
        let ids = m.prompt_ids(&v).unwrap();
        let expected = m
            .tokenizer()
            .encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
            .unwrap();
        assert_eq!(ids, expected);
        assert_eq!(
            m.block_hashes(&ids, hash_seed("m", None, None)).len(),
            ids.len() / 4
        );
    }

    #[test]
    fn empty_seed_parts_are_absent() {
        assert_eq!(
            hash_seed("m", Some(""), Some("")),
            HashSeed::new("m", None, None)
        );
        assert_ne!(
            hash_seed("m", None, Some("t")),
            HashSeed::new("m", None, None)
        );
    }

    #[test]
    fn shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ModelTokens>();
    }
}
