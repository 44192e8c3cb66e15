//! `[tokens]` and `[[models]]`: how each model's prompts become tokens and KV blocks.

use std::path::PathBuf;

use super::file::{FileModel, FileTokens};
use super::overrides::Override;
use super::tenants::target_s;
use super::{ConfigError, ServeArgs, invalid};
use crate::proxy::handoff::Protocol;
pub use crate::tokens::TokenizerSource;
use crate::tokens::{EngineKind, ModelSource};

/// KV block size of models not listed in `[[models]]` (vLLM's default `--block-size`).
pub const DEFAULT_BLOCK_SIZE: u32 = 16;
/// Memory for cached token ids of repeated prompt segments, per model, in MiB.
pub const DEFAULT_TOKEN_CACHE_MB: u64 = 32;
/// Whether a tenant's cache salt is sent to a model's engines unless configured otherwise.
pub const DEFAULT_FORWARD_CACHE_SALT: bool = true;
/// Largest KV block size accepted: engines use 16 to a few hundred tokens.
const MAX_BLOCK_SIZE: u32 = 4096;

/// How one model's prompts become tokens and blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The model name as clients send it.
    pub name: String,
    /// Its tokenizer.
    pub tokenizer: TokenizerSource,
    /// KV block size of its engines (vLLM `--block-size`, SGLang `--page-size`).
    pub block_size: u32,
    /// Send the tenant's cache salt to the engine as vLLM's `cache_salt` request field.
    pub forward_cache_salt: bool,
    /// When this name is a LoRA adapter: the base model it runs on. Its prompts are tokenized
    /// with the base model's tokenizer and hashed as the base model with this adapter, as the
    /// engine's KV events name its blocks (`lora_name`).
    pub base_model: Option<String>,
    /// The engine kind serving it (`engine = "vllm"` (default) or `"sglang"`): SGLang renders
    /// chat tools differently (`tokens::engine_tools`). One model's workers run one kind.
    pub engine: EngineKind,
    /// The engines' `max_model_len`, when configured (else read from their `/v1/models`): what
    /// the router's own `/tokenize` answers report.
    pub max_model_len: Option<u64>,
    /// How its prefill and decode workers hand the KV cache over when some of its workers are
    /// prefill-only or decode-only (`disaggregation = "vllm" | "sglang"`); `None`: the
    /// protocol of its `engine` (see [`ModelConfig::handoff`]).
    pub disaggregation: Option<Protocol>,
    /// Its requests' TTFT target, seconds (`ttft_target_ms`): below a request's own header,
    /// above its tenant's default (a model's target says what its engines can give; a
    /// tenant's is one figure for every model it uses).
    pub ttft_target_s: Option<f64>,
    /// Its requests' inter-token latency target, seconds (`itl_target_ms`), likewise.
    pub itl_target_s: Option<f64>,
}

impl ModelConfig {
    /// The hand-off protocol of its disaggregated requests: configured, or its engine's own
    /// (an SGLang fleet pairs by bootstrap room, a vLLM one by `kv_transfer_params`).
    pub fn handoff(&self) -> Protocol {
        self.disaggregation.unwrap_or(match self.engine {
            EngineKind::Sglang => Protocol::Sglang,
            EngineKind::Vllm => Protocol::Vllm,
        })
    }

    /// What the tokenizer registry loads for this model.
    pub fn token_source(&self) -> ModelSource<'_> {
        ModelSource {
            name: &self.name,
            tokenizer: &self.tokenizer,
            block_size: self.block_size as usize,
            engine: self.engine,
        }
    }
}

impl ModelConfig {
    /// The settings of a model that has no `[[models]]` entry.
    pub(super) fn unlisted(name: &str, block_size: u32) -> ModelConfig {
        ModelConfig {
            name: name.to_string(),
            tokenizer: TokenizerSource::Builtin,
            block_size,
            forward_cache_salt: DEFAULT_FORWARD_CACHE_SALT,
            base_model: None,
            engine: EngineKind::default(),
            max_model_len: None,
            ttft_target_s: None,
            itl_target_s: None,
            disaggregation: None,
        }
    }
}

/// What `[tokens]` and `[[models]]` configure together.
pub(super) struct Models {
    /// Block size of unlisted models.
    pub(super) default_block_size: u32,
    /// Listed models.
    pub(super) models: Vec<ModelConfig>,
    /// Token cache per model, in bytes.
    pub(super) token_cache_bytes: u64,
}

impl Models {
    /// The settings of `[tokens]` and `[[models]]`, then of `--block-size` (which replaces
    /// `tokens.default_block_size`) and `--tokenizer MODEL=TOKENIZER` (which replaces a listed
    /// model's tokenizer, or lists the model). Replaced file values are added to `overrides`.
    pub(super) fn from_file(
        tokens: &FileTokens,
        mut file: Vec<FileModel>,
        flags: &ModelFlags<'_>,
        overrides: &mut Vec<Override>,
    ) -> Result<Models, ConfigError> {
        let default_block_size = flags
            .block_size
            .or(tokens.default_block_size)
            .unwrap_or(DEFAULT_BLOCK_SIZE);
        let key = match flags.block_size {
            Some(_) => "block_size",
            None => "tokens.default_block_size",
        };
        block_size_ok(key, default_block_size)?;
        let listed = file.len();
        for (k, flag) in flags.tokenizers.iter().enumerate() {
            let (name, path) = tokenizer_flag(flag)
                .map_err(|message| invalid(format!("--tokenizer #{}", k + 1), message))?;
            match file.iter().position(|m| m.name == name) {
                Some(i) => {
                    if file[i].tokenizer.is_some() {
                        overrides.push(Override {
                            flag: "tokenizer",
                            key: format!("models[{i}].tokenizer"),
                        });
                    }
                    file[i].tokenizer = Some(path);
                }
                None => file.push(FileModel::named(name, path)),
            }
        }
        let mut models = Vec::new();
        for (i, m) in file.into_iter().enumerate() {
            let key = if i < listed {
                format!("models[{i}]")
            } else {
                format!("--tokenizer {}", m.name)
            };
            let model = model(&key, m, default_block_size, &models)?;
            models.push(model);
        }
        Ok(Models {
            default_block_size,
            models,
            token_cache_bytes: tokens.cache_mb.unwrap_or(DEFAULT_TOKEN_CACHE_MB) << 20,
        })
    }
}

/// The `serve` flags that configure models.
#[derive(Default)]
pub(super) struct ModelFlags<'a> {
    /// `--tokenizer MODEL=TOKENIZER`, each.
    pub(super) tokenizers: &'a [String],
    /// `--block-size`.
    pub(super) block_size: Option<u32>,
}

impl ModelFlags<'_> {
    /// The flags `kvroute serve` was given.
    pub(super) fn of(args: &ServeArgs) -> ModelFlags<'_> {
        ModelFlags {
            tokenizers: &args.tokenizers,
            block_size: args.block_size,
        }
    }
}

/// `MODEL=TOKENIZER`: the model's name and its tokenizer (a directory with `tokenizer.json`,
/// the file itself, a Hugging Face id, or `builtin`; see [`tokenizer_source`]).
fn tokenizer_flag(flag: &str) -> Result<(String, String), String> {
    match flag.split_once('=') {
        Some((name, path)) if !name.trim().is_empty() && !path.trim().is_empty() => {
            Ok((name.trim().to_owned(), path.trim().to_owned()))
        }
        _ => Err(format!(
            "`{flag}` is not MODEL=TOKENIZER; write e.g. \
             `--tokenizer meta-llama/Llama-3.1-8B-Instruct=/models/llama` (a directory with \
             tokenizer.json, or the file) or \
             `--tokenizer meta-llama/Llama-3.1-8B-Instruct=meta-llama/Llama-3.1-8B-Instruct` \
             (a Hugging Face id, fetched once into its cache)"
        )),
    }
}

/// One `[[models]]` entry, checked against the entries before it.
fn model(
    key: &str,
    m: FileModel,
    default_block_size: u32,
    before: &[ModelConfig],
) -> Result<ModelConfig, ConfigError> {
    if m.name.is_empty() {
        return Err(invalid(format!("{key}.name"), "must not be empty"));
    }
    if before.iter().any(|x| x.name == m.name) {
        return Err(invalid(
            format!("{key}.name"),
            format!("model `{}` is listed twice", m.name),
        ));
    }
    let tokenizer = match m.tokenizer.as_deref() {
        None => TokenizerSource::Builtin,
        Some(value) => tokenizer_source(value)
            .map_err(|message| invalid(format!("{key}.tokenizer"), message))?,
    };
    let block_size = m.block_size.unwrap_or(default_block_size);
    block_size_ok(&format!("{key}.block_size"), block_size)?;
    check_adapter(key, &m)?;
    let engine = match m.engine.as_deref() {
        None => EngineKind::default(),
        Some(e) => EngineKind::parse(e).ok_or_else(|| {
            invalid(
                format!("{key}.engine"),
                format!("`{e}` is not an engine kind; use \"vllm\" or \"sglang\""),
            )
        })?,
    };
    if m.max_model_len == Some(0) {
        return Err(invalid(
            format!("{key}.max_model_len"),
            "must be at least 1: the engines' --max-model-len",
        ));
    }
    let disaggregation = m
        .disaggregation
        .as_deref()
        .map(|p| {
            p.parse::<Protocol>()
                .map_err(|e| invalid(format!("{key}.disaggregation"), e.to_string()))
        })
        .transpose()?;
    Ok(ModelConfig {
        name: m.name,
        tokenizer,
        block_size,
        forward_cache_salt: m.forward_cache_salt.unwrap_or(DEFAULT_FORWARD_CACHE_SALT),
        base_model: m.base_model,
        engine,
        max_model_len: m.max_model_len,
        disaggregation,
        ttft_target_s: target_s(key, "ttft_target_ms", m.ttft_target_ms)?,
        itl_target_s: target_s(key, "itl_target_ms", m.itl_target_ms)?,
    })
}

/// A LoRA adapter's entry (one with `base_model`): it names another model, and sets none of
/// what it shares with its base (tokenizer, block size, engine, context length, disaggregation).
fn check_adapter(key: &str, m: &FileModel) -> Result<(), ConfigError> {
    if m.base_model.is_some() {
        for (k, set) in [
            ("tokenizer", m.tokenizer.is_some()),
            ("block_size", m.block_size.is_some()),
            ("engine", m.engine.is_some()),
            ("max_model_len", m.max_model_len.is_some()),
            ("disaggregation", m.disaggregation.is_some()),
        ] {
            if set {
                return Err(invalid(
                    format!("{key}.{k}"),
                    "a LoRA adapter uses its base model's; set it on the base model's entry",
                ));
            }
        }
    }
    if let Some(base) = &m.base_model
        && (base.is_empty() || *base == m.name)
    {
        return Err(invalid(
            format!("{key}.base_model"),
            "must name the model this LoRA adapter runs on, not be empty or the adapter itself",
        ));
    }
    Ok(())
}

/// What a `tokenizer` value names: `"builtin"`; a path that exists (a directory with
/// `tokenizer.json`, or the file); else a Hugging Face id (`ORG/NAME`, fetched at start).
/// A value that is neither — a missing path written as one (starting with `/`, `.` or `~`),
/// or no id — is refused, so a typo in a path never becomes a download.
fn tokenizer_source(value: &str) -> Result<TokenizerSource, String> {
    if value == "builtin" {
        return Ok(TokenizerSource::Builtin);
    }
    let path = PathBuf::from(value);
    if path.exists() {
        return Ok(TokenizerSource::Path(path));
    }
    if crate::tokens::hub::is_model_id(value) {
        return Ok(TokenizerSource::Hub(value.to_owned()));
    }
    Err(format!(
        "`{value}` does not exist, and is no Hugging Face id (ORG/NAME); give a directory with \
         tokenizer.json, a tokenizer.json file, a model id such as \
         \"meta-llama/Llama-3.1-8B-Instruct\" (fetched once into the Hugging Face cache), or \
         \"builtin\""
    ))
}

fn block_size_ok(key: &str, bs: u32) -> Result<(), ConfigError> {
    if bs == 0 || bs > MAX_BLOCK_SIZE {
        return Err(invalid(
            key,
            format!("{bs} is not a KV block size; use the engine's (vLLM default 16)"),
        ));
    }
    Ok(())
}
