//! A vLLM pair's round: prefill (with the proxy's retries over prefill workers), its
//! `kv_transfer_params`, then decode (retried over decode workers with the same parameters
//! while it fails to answer at all).

use std::sync::Arc;

use super::Dispatcher;
use super::pair::{Paired, Round, Sides, body_error, read_answer};
use crate::openai::ApiError;
use crate::proxy::handoff::{BodyError, vllm};

impl Dispatcher<'_> {
    /// One vLLM round over `sides`.
    pub(super) async fn vllm_round(&self, sides: Sides<'_, '_>) -> Result<Round, ApiError> {
        let Sides {
            out,
            body: whole,
            mut prefill,
            decode,
        } = sides;
        let body = vllm::prefill_body(whole).map_err(body_error)?;
        let (mut p, answer) = self.with_retries(out, &body, &mut prefill, None).await?;
        if !answer.status().is_success() {
            // The request's own answer (a 4xx): the client gets it as it is.
            return Ok(Paired::own_answer(p, answer));
        }
        let bytes = read_answer(answer.into_body(), self.config.first_byte_timeout).await;
        p.admitted.first_token();
        let params = match bytes
            .map_err(BodyError::Answer)
            .and_then(|b| vllm::transfer_params(&b))
        {
            Ok(params) => params,
            Err(e) => {
                let why = e.to_string();
                self.broken(&p.worker, &why);
                return Ok(self.prefill_failed(&p, &why));
            }
        };
        // The prefill's answer is its first token: its time calibrates the cost model.
        p.admitted.observe_ttft(p.at.elapsed().as_secs_f64());
        p.admitted.finish();
        let outcome = if params.is_some() {
            "relayed"
        } else {
            "no_params"
        };
        let handoffs = &self.metrics.disaggregation.handoffs;
        handoffs.with_label_values(&["vllm", outcome]).inc();
        decode.prefilled_on(&p.worker);
        let body = vllm::decode_body(whole, params.as_ref()).map_err(body_error)?;
        let (d, answer) = self.with_retries(out, &body, decode, None).await?;
        Ok(self.held_answer(d, answer, Arc::clone(&p.worker)).await)
    }
}
