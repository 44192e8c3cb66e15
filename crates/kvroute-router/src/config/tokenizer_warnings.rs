//! The loud warning of a model whose workers publish KV events while its prompts are
//! tokenized by the builtin tokenizer. The builtin tokenizer's blocks match nothing a real
//! engine computes, so such a fleet subscribes to events and never finds a prefix: it routes
//! as if it had no index, and said nothing about it (issue 34). Logged at start and at each
//! reload; not refused, because the simulated engines of the lab do use the builtin tokenizer.

use super::{Config, ModelConfig, TokenizerSource};

/// The fix, written once for every warning.
const FIX: &str = "give the engine's tokenizer: `--tokenizer MODEL=DIR` (`KVROUTE_TOKENIZER`) \
                   or `tokenizer = \"DIR\"` in its [[models]] entry, DIR holding the model's \
                   tokenizer.json, or its Hugging Face id (`ORG/NAME`, fetched once into the \
                   Hugging Face cache) instead of DIR; `tokenizer = \"builtin\"` is right only \
                   for kvroute's own simulated engines";

impl Config {
    /// One message per model that is tokenized by the builtin tokenizer while a static worker
    /// serving it publishes KV events; for a worker whose models are discovered, one message
    /// when no model at all has a tokenizer configured.
    pub fn builtin_tokenizer_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut named: Vec<&str> = Vec::new();
        for w in self.workers.iter().filter(|w| w.kv_events.is_some()) {
            for m in &w.models {
                if !named.contains(&m.as_str()) && self.tokenizes_builtin(m) {
                    named.push(m);
                    out.push(format!(
                        "model `{m}` is tokenized by the builtin tokenizer while worker `{}` \
                         publishes its KV events: no prefix will ever match; {FIX}",
                        w.id
                    ));
                }
            }
            if w.models.is_empty() && !self.any_real_tokenizer() {
                out.push(unlisted(&format!("worker `{}`", w.id)));
            }
        }
        if !self.any_real_tokenizer() {
            let d = &self.discovery;
            if d.kubernetes.is_some() {
                out.push(unlisted(
                    "the pods of [discovery.kubernetes] (kv_events_port)",
                ));
            }
            if d.dns.as_ref().is_some_and(|d| d.kv_events_port.is_some()) {
                out.push(unlisted("the workers of [discovery.dns] (kv_events_port)"));
            }
        }
        out
    }

    /// Logs [`Config::builtin_tokenizer_warnings`] at WARN.
    pub fn warn_builtin_tokenizers(&self) {
        for message in self.builtin_tokenizer_warnings() {
            tracing::warn!("{message}");
        }
    }

    /// Whether `model`'s prompts (its base model's, for a LoRA adapter) use the builtin one.
    fn tokenizes_builtin(&self, model: &str) -> bool {
        let m: ModelConfig = self.model(model);
        let base = m.base_model.as_deref().map(|b| self.model(b)).unwrap_or(m);
        base.tokenizer == TokenizerSource::Builtin
    }

    fn any_real_tokenizer(&self) -> bool {
        self.models
            .iter()
            .any(|m| m.tokenizer != TokenizerSource::Builtin)
    }
}

/// The warning for workers whose models are learnt at run time, `who` naming them.
fn unlisted(who: &str) -> String {
    format!(
        "{who} publish KV events but no model has a tokenizer configured, so the models they \
         serve are tokenized by the builtin tokenizer: no prefix will ever match; {FIX}"
    )
}
