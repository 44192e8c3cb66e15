//! The endpoints the router forwards, as metrics and the access log name them: one label value
//! per kind of endpoint (never the path a client chose), so the `endpoint` label stays small.

/// A kind of endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/responses` and `/v1/responses/{id}…`
    Responses,
    /// `POST /v1/embeddings`
    Embeddings,
    /// `POST /v1/rerank`, `/rerank`, `/v2/rerank`
    Rerank,
    /// `POST /v1/score`, `/score`
    Score,
    /// `POST /v1/audio/transcriptions`
    Transcriptions,
    /// `POST /tokenize`
    Tokenize,
    /// `POST /detokenize`
    Detokenize,
    /// Any path on `[endpoints] forward_paths`.
    Forwarded,
}

impl Api {
    /// The `endpoint` label.
    pub fn label(self) -> &'static str {
        match self {
            Api::Completions => "completions",
            Api::Chat => "chat_completions",
            Api::Responses => "responses",
            Api::Embeddings => "embeddings",
            Api::Rerank => "rerank",
            Api::Score => "score",
            Api::Transcriptions => "transcriptions",
            Api::Tokenize => "tokenize",
            Api::Detokenize => "detokenize",
            Api::Forwarded => "forwarded",
        }
    }

    /// Whether its responses are generated token by token: only these record a time to first
    /// token and calibrate the policy's prefill model.
    pub fn generates(self) -> bool {
        matches!(self, Api::Completions | Api::Chat | Api::Responses)
    }
}
