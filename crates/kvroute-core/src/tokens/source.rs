//! Where each configured model's tokenizer comes from, as the configuration names it: read by
//! the start's fetch from the Hugging Face hub (the router's `tokens::hub`) and by the registry
//! that loads the tokenizers (`tokens::registry`), which also reads the hub's cache — so
//! neither imports the other for these names.

use std::path::PathBuf;

use super::engine_tools::EngineKind;

/// Where a model's tokenizer comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizerSource {
    /// The file-free builtin tokenizer (what `kvroute engine` uses by default).
    Builtin,
    /// A directory with `tokenizer.json` (and `tokenizer_config.json` / `chat_template.jinja`
    /// for chat), or a `tokenizer.json` file.
    Path(PathBuf),
    /// A Hugging Face model id (`ORG/NAME`): its files, fetched at start into the Hugging
    /// Face cache (the router's `tokens::hub`), are read from there.
    Hub(String),
}

/// One configured model as the registry loads it.
#[derive(Clone, Copy, Debug)]
pub struct ModelSource<'a> {
    /// The model name as clients send it.
    pub name: &'a str,
    /// Its tokenizer.
    pub tokenizer: &'a TokenizerSource,
    /// KV block size of its engines.
    pub block_size: usize,
    /// The engine kind serving it (how chat tools are rendered).
    pub engine: EngineKind,
}
