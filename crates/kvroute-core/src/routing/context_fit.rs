//! Which workers' context holds a request: in a fleet whose engines were started with different
//! `--max-model-len` (GPUs of different memory, another tensor-parallel size), a long prompt sent
//! to a worker whose context cannot hold it fails there — vLLM answers 400 — while another
//! worker could have served it. So after the prompt is tokenized, the eligible workers are
//! narrowed to those whose reported `max_model_len` holds it, before any policy weighs them.
//!
//! What an engine takes, as vLLM 0.32 decides it (`entrypoints/serve/utils/api_utils.py`,
//! `get_max_tokens`; `v1/engine` input validation): a prompt of `p` tokens needs `p + 1 ≤
//! max_model_len` (at least one output token), and a larger `max_tokens` is *clamped* to the
//! room left, not refused. A worker where `p + max_tokens` fits serves the request as asked; one
//! where only `p + 1` does serves a shorter completion than the client allowed. Hence three
//! grades ([`Fit`]), and the workers of the best grade present are kept. When none holds even
//! the prompt, the workers with the largest context are kept and the engine gives its own
//! answer: the router's token count is its own tokenization of the request, so it never refuses
//! a request on it.
//!
//! SGLang 0.5.23 (`srt/managers/tokenizer_manager.py`) has the same edge for the prompt (`p ≥
//! context_len` is refused) and refuses rather than clamps `p + max_tokens > context_len`
//! unless started to truncate: the whole grade is its rule exactly, and where only the clamped
//! grade is left, an SGLang worker refuses as every other would.
//!
//! A worker that has not reported its context (no `/v1/models` answer yet, an engine that does
//! not say) is taken to hold anything: it is never the reason a request is refused. Pure: the
//! limits are passed in, per worker, by the caller.

/// How a request's length meets one worker's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fit {
    /// Not even the prompt and one output token fit.
    Over,
    /// The prompt fits, but not with all of `max_tokens`: the engine clamps the completion.
    Clamped,
    /// The prompt and every output token the client allowed fit (or the limit is unknown).
    Whole,
}

/// How a prompt of `prompt_tokens` with up to `max_tokens` output tokens (unbounded: `None`,
/// taken as one) meets a context of `limit` tokens (`None`: unknown).
pub fn fit(limit: Option<u64>, prompt_tokens: u64, max_tokens: Option<u64>) -> Fit {
    let Some(limit) = limit else {
        return Fit::Whole;
    };
    let asked = prompt_tokens.saturating_add(max_tokens.unwrap_or(1).max(1));
    if asked <= limit {
        Fit::Whole
    } else if prompt_tokens.saturating_add(1) <= limit {
        Fit::Clamped
    } else {
        Fit::Over
    }
}

/// Which of the workers whose contexts are `limits` a request of `prompt_tokens` (0: not
/// tokenized — every worker) and `max_tokens` should be routed among: those of the best
/// [`Fit`] present, or when none holds the prompt ([`Fit::Over`]), those with the largest
/// context; and that best fit.
pub fn fitting(
    limits: &[Option<u64>],
    prompt_tokens: u64,
    max_tokens: Option<u64>,
) -> (Vec<bool>, Fit) {
    if prompt_tokens == 0 {
        return (vec![true; limits.len()], Fit::Whole);
    }
    let fits: Vec<Fit> = limits
        .iter()
        .map(|l| fit(*l, prompt_tokens, max_tokens))
        .collect();
    let best = fits.iter().copied().max().unwrap_or(Fit::Whole);
    if best > Fit::Over {
        return (fits.iter().map(|f| *f == best).collect(), best);
    }
    // Every limit is known and too small: the largest.
    let largest = limits.iter().flatten().copied().max();
    (limits.iter().map(|l| *l == largest).collect(), best)
}

impl Fit {
    /// Its name in metrics: what the workers a request was narrowed to can do with it.
    pub fn as_str(self) -> &'static str {
        match self {
            Fit::Whole => "whole",
            Fit::Clamped => "clamped",
            Fit::Over => "largest",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_needs_room_for_one_output_token() {
        // vLLM's own edge: 2,047 prompt tokens on a 2,048-token model are served, 2,048 not.
        assert_eq!(fit(Some(2048), 2047, None), Fit::Whole);
        assert_eq!(fit(Some(2048), 2047, Some(1)), Fit::Whole);
        assert_eq!(fit(Some(2048), 2048, None), Fit::Over);
        assert_eq!(fit(Some(2048), 2047, Some(0)), Fit::Whole);
        assert_eq!(fit(Some(2048), 2000, Some(48)), Fit::Whole);
        assert_eq!(fit(Some(2048), 2000, Some(49)), Fit::Clamped);
        assert_eq!(fit(None, u64::MAX, Some(u64::MAX)), Fit::Whole);
        assert_eq!(fit(Some(10), u64::MAX, None), Fit::Over);
    }

    #[test]
    fn the_best_fit_present_is_kept() {
        let limits = [Some(32_768), Some(131_072), None, Some(131_072)];
        // Fits everywhere.
        assert_eq!(
            fitting(&limits, 1_000, Some(1_000)),
            (vec![true; 4], Fit::Whole)
        );
        // 40k tokens: only the large contexts and the unknown one.
        let keep = vec![false, true, true, true];
        assert_eq!(fitting(&limits, 40_000, None), (keep.clone(), Fit::Whole));
        // 30k + 8k output: the small context would clamp the completion; the others do not.
        assert_eq!(fitting(&limits, 30_000, Some(8_000)), (keep, Fit::Whole));
    }

    #[test]
    fn a_clamped_completion_beats_a_refusal() {
        let limits = [Some(32_768), Some(65_536)];
        // 60k + 8k fits nowhere as asked; the 64k context serves it clamped.
        let clamped = (vec![false, true], Fit::Clamped);
        assert_eq!(fitting(&limits, 60_000, Some(8_000)), clamped);
        // Both clamp: both are kept.
        assert_eq!(
            fitting(&limits, 30_000, Some(60_000)),
            (vec![true, true], Fit::Clamped)
        );
    }

    #[test]
    fn a_prompt_no_context_holds_goes_to_the_largest() {
        let limits = [Some(32_768), Some(65_536), Some(65_536)];
        let largest = (vec![false, true, true], Fit::Over);
        assert_eq!(fitting(&limits, 100_000, None), largest);
        // An untokenized request (0 tokens) is not narrowed.
        assert_eq!(
            fitting(&limits, 0, Some(1 << 40)),
            (vec![true; 3], Fit::Whole)
        );
        assert!(fitting(&[], 100, None).0.is_empty());
    }
}
