//! The replay plan: every request's body serialized before the run starts.
//!
//! Building prompts costs far more than sending them (a 12k-token prompt is ~70 kB of JSON);
//! doing it ahead keeps the client's timing honest and its per-request work down to a copy.
//! Memory is about 6 bytes per prompt token: cap long traces with a window or
//! `--max-input-tokens`.

use bytes::Bytes;
use serde::Serialize;

use crate::workload::synthesis::PromptSynth;
use crate::workload::trace::Trace;

/// How requests are shaped for the server.
#[derive(Clone, Debug)]
pub struct RequestShape {
    /// The `model` field.
    pub model: String,
    /// Send `ignore_eos: true` and `min_tokens = max_tokens` (vLLM and SGLang accept them) so
    /// every request generates exactly its trace's output length.
    pub force_output_length: bool,
    /// Send the prompt as text (one word per token) instead of token ids.
    pub text_prompt: bool,
    /// Leave out `stream_options.include_usage`, as most clients do: the answers' lengths are
    /// then counted from their streams' events, by the client and by any router between.
    pub no_usage: bool,
}

/// One request, ready to send.
#[derive(Clone, Debug)]
pub struct PlannedRequest {
    /// Position in the trace.
    pub index: usize,
    /// When to send it, seconds from the start of the run.
    pub arrival_s: f64,
    /// Prompt tokens in the body.
    pub prompt_tokens: u32,
    /// The JSON body for `/v1/completions`.
    pub body: Bytes,
}

#[derive(Serialize)]
#[serde(untagged)]
enum PromptField {
    Tokens(Vec<u32>),
    Text(String),
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct CompletionBody<'a> {
    model: &'a str,
    prompt: PromptField,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignore_eos: Option<bool>,
    temperature: f32,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    /// The trace's session, named as OpenAI clients name a group of requests that share a
    /// prefix (an affinity hint for routers that read it).
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<String>,
}

/// Serializes every request of `trace`, in arrival order.
pub fn plan(trace: &Trace, synth: &PromptSynth, shape: &RequestShape) -> Vec<PlannedRequest> {
    trace
        .requests
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let prompt = if shape.text_prompt {
                PromptField::Text(synth.prompt_text(r))
            } else {
                PromptField::Tokens(synth.prompt_tokens(r))
            };
            let max_tokens = r.output_tokens.max(1);
            let body = CompletionBody {
                model: &shape.model,
                prompt,
                max_tokens,
                min_tokens: shape.force_output_length.then_some(max_tokens),
                ignore_eos: shape.force_output_length.then_some(true),
                temperature: 0.0,
                stream: true,
                stream_options: (!shape.no_usage).then_some(StreamOptions {
                    include_usage: true,
                }),
                prompt_cache_key: r.session.map(|s| format!("session-{s}")),
            };
            // Serializing plain structs of numbers and strings cannot fail.
            let body = serde_json::to_vec(&body).unwrap_or_default();
            PlannedRequest {
                index,
                arrival_s: r.arrival_s,
                prompt_tokens: r.input_tokens,
                body: Bytes::from(body),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::trace::TraceRequest;

    #[test]
    fn body_carries_token_ids_and_output_length() {
        let trace = Trace::new(vec![TraceRequest {
            arrival_s: 0.5,
            input_tokens: 3,
            output_tokens: 7,
            hash_ids: vec![9],
            block_tokens: 4,
            session: None,
        }]);
        let synth = PromptSynth::default();
        let shape = RequestShape {
            model: "m".into(),
            force_output_length: true,
            text_prompt: false,
            no_usage: false,
        };
        let p = plan(&trace, &synth, &shape);
        let v: serde_json::Value = serde_json::from_slice(&p[0].body).unwrap();
        assert_eq!(v["prompt"].as_array().unwrap().len(), 3);
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["min_tokens"], 7);
        assert_eq!(v["ignore_eos"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(p[0].arrival_s, 0.5);
        let quiet = RequestShape {
            no_usage: true,
            ..shape
        };
        let v: serde_json::Value =
            serde_json::from_slice(&plan(&trace, &synth, &quiet)[0].body).unwrap();
        assert!(v.get("stream_options").is_none(), "{v}");
    }
}
