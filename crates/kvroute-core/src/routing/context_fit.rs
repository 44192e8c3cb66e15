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
//! SGLang 0.5.23 keeps more back and clamps nothing. Its scheduler refuses a prompt of
//! `min(context_len − 1, KV pool − 1) − 5` tokens or more (`srt/managers/tp_worker.py`,
//! `srt/managers/utils.py::validate_input_length`): 250 tokens on a 256-token context, measured
//! by `tests/it/real_sglang_contexts.rs`. Its tokenizer manager refuses `p + max_tokens >
//! context_len` unless started to truncate (`srt/managers/tokenizer_manager.py`). So for a
//! model served by SGLang (`[[models]] engine = "sglang"`) a worker is whole or over, never
//! clamped. A request without `max_tokens` is taken to ask for one token: SGLang's own default
//! for completions (16) can leave a prompt within 16 tokens of the edge refused there.
//!
//! A worker that has not reported its context (no `/v1/models` answer yet, an engine that does
//! not say) is taken to hold anything: it is never the reason a request is refused. Pure: the
//! limits are passed in, per worker, by the caller.

use super::pair::plan_roles;
use crate::fleet::Role;
use crate::tokens::EngineKind;

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

/// Tokens past the prompt an SGLang engine keeps back: its scheduler takes prompts shorter than
/// `context_len − 1 − 5` (see the module's notes), so a prompt needs 7 tokens of room.
const SGLANG_PROMPT_ROOM: u64 = 7;

/// How a prompt of `prompt_tokens` with up to `max_tokens` output tokens (unbounded: `None`,
/// taken as one) meets a context of `limit` tokens (`None`: unknown) on an `engine`.
pub fn fit(
    limit: Option<u64>,
    prompt_tokens: u64,
    max_tokens: Option<u64>,
    engine: EngineKind,
) -> Fit {
    let Some(limit) = limit else {
        return Fit::Whole;
    };
    let asked = prompt_tokens.saturating_add(max_tokens.unwrap_or(1).max(1));
    let room = match engine {
        EngineKind::Vllm => 1,
        EngineKind::Sglang => SGLANG_PROMPT_ROOM,
    };
    let prompt_fits = prompt_tokens.saturating_add(room) <= limit;
    match (prompt_fits, asked <= limit, engine) {
        (true, true, _) => Fit::Whole,
        (true, false, EngineKind::Vllm) => Fit::Clamped,
        _ => Fit::Over,
    }
}

/// Which of the workers whose contexts are `limits` (a model's, all run by `engine`) a request
/// of `prompt_tokens` (0: not tokenized — every worker) and `max_tokens` should be routed
/// among: those of the best [`Fit`] present, or when none holds the prompt ([`Fit::Over`]), those with the largest
/// context; and that best fit.
pub fn fitting(
    limits: &[Option<u64>],
    prompt_tokens: u64,
    max_tokens: Option<u64>,
    engine: EngineKind,
) -> (Vec<bool>, Fit) {
    if prompt_tokens == 0 {
        return (vec![true; limits.len()], Fit::Whole);
    }
    let fits: Vec<Fit> = limits
        .iter()
        .map(|l| fit(*l, prompt_tokens, max_tokens, engine))
        .collect();
    let best = fits.iter().copied().max().unwrap_or(Fit::Whole);
    if best > Fit::Over {
        return (fits.iter().map(|f| *f == best).collect(), best);
    }
    // Every limit is known and too small: the largest.
    let largest = limits.iter().flatten().copied().max();
    (limits.iter().map(|l| *l == largest).collect(), best)
}

/// Whether the contexts `limits` differ: only then can a request's length change where it may
/// go (callers check before they count a prompt's tokens for it).
pub fn differ(limits: &[Option<u64>]) -> bool {
    limits.windows(2).any(|pair| pair[0] != pair[1])
}

/// The narrowing of workers whose contexts are `limits` and roles `roles` (in the same order)
/// for a request of `prompt_tokens` and `max_tokens` on an `engine`: which to keep and what
/// they can do with it ([`fitting`]); `None` when every worker is kept, or when those kept would
/// not serve as all of them do (a disaggregated fleet left without a side: the engine then
/// answers for itself, as it does where no context holds the prompt). The live router and the
/// simulator both narrow through this.
pub fn narrow(
    limits: &[Option<u64>],
    roles: &[Role],
    prompt_tokens: u64,
    max_tokens: Option<u64>,
    engine: EngineKind,
) -> Option<(Vec<bool>, Fit)> {
    if !differ(limits) {
        return None;
    }
    let (keep, kept) = fitting(limits, prompt_tokens, max_tokens, engine);
    if keep.iter().all(|k| *k) {
        return None;
    }
    let kept_roles = roles
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(r, _)| *r);
    (plan_roles(kept_roles) == plan_roles(roles.iter().copied())).then_some((keep, kept))
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

    fn fit_v(limit: Option<u64>, prompt: u64, max_tokens: Option<u64>) -> Fit {
        fit(limit, prompt, max_tokens, EngineKind::Vllm)
    }

    fn fitting_v(limits: &[Option<u64>], prompt: u64, max_tokens: Option<u64>) -> (Vec<bool>, Fit) {
        fitting(limits, prompt, max_tokens, EngineKind::Vllm)
    }

    #[test]
    fn sglang_keeps_room_back_and_clamps_nothing() {
        let sglang = |prompt, max_tokens| fit(Some(256), prompt, max_tokens, EngineKind::Sglang);
        // Its scheduler's edge on a 256-token context: 249 prompt tokens served, 250 refused.
        assert_eq!(sglang(249, Some(1)), Fit::Whole);
        assert_eq!(sglang(250, Some(1)), Fit::Over);
        assert_eq!(sglang(200, Some(56)), Fit::Whole);
        assert_eq!(sglang(200, Some(57)), Fit::Over);
        let limits = [Some(256), Some(4096)];
        let (keep, kept) = fitting(&limits, 200, Some(100), EngineKind::Sglang);
        assert_eq!((keep, kept), (vec![false, true], Fit::Whole));
    }

    #[test]
    fn a_prompt_needs_room_for_one_output_token() {
        // vLLM's own edge: 2,047 prompt tokens on a 2,048-token model are served, 2,048 not.
        assert_eq!(fit_v(Some(2048), 2047, None), Fit::Whole);
        assert_eq!(fit_v(Some(2048), 2047, Some(1)), Fit::Whole);
        assert_eq!(fit_v(Some(2048), 2048, None), Fit::Over);
        assert_eq!(fit_v(Some(2048), 2047, Some(0)), Fit::Whole);
        assert_eq!(fit_v(Some(2048), 2000, Some(48)), Fit::Whole);
        assert_eq!(fit_v(Some(2048), 2000, Some(49)), Fit::Clamped);
        assert_eq!(fit_v(None, u64::MAX, Some(u64::MAX)), Fit::Whole);
        assert_eq!(fit_v(Some(10), u64::MAX, None), Fit::Over);
    }

    #[test]
    fn the_best_fit_present_is_kept() {
        let limits = [Some(32_768), Some(131_072), None, Some(131_072)];
        // Fits everywhere.
        assert_eq!(
            fitting_v(&limits, 1_000, Some(1_000)),
            (vec![true; 4], Fit::Whole)
        );
        // 40k tokens: only the large contexts and the unknown one.
        let keep = vec![false, true, true, true];
        assert_eq!(fitting_v(&limits, 40_000, None), (keep.clone(), Fit::Whole));
        // 30k + 8k output: the small context would clamp the completion; the others do not.
        assert_eq!(fitting_v(&limits, 30_000, Some(8_000)), (keep, Fit::Whole));
    }

    #[test]
    fn a_clamped_completion_beats_a_refusal() {
        let limits = [Some(32_768), Some(65_536)];
        // 60k + 8k fits nowhere as asked; the 64k context serves it clamped.
        let clamped = (vec![false, true], Fit::Clamped);
        assert_eq!(fitting_v(&limits, 60_000, Some(8_000)), clamped);
        // Both clamp: both are kept.
        assert_eq!(
            fitting_v(&limits, 30_000, Some(60_000)),
            (vec![true, true], Fit::Clamped)
        );
    }

    #[test]
    fn narrowing_keeps_both_sides_of_a_disaggregated_fleet() {
        let limits = [Some(256), Some(4096), Some(4096)];
        let both = [Role::Both; 3];
        let narrowed = narrow(&limits, &both, 300, None, EngineKind::Vllm);
        assert_eq!(narrowed, Some((vec![false, true, true], Fit::Whole)));
        // Nothing to narrow: one context for all, or a prompt every worker holds.
        assert_eq!(
            narrow(&[Some(256); 3], &both, 300, None, EngineKind::Vllm),
            None
        );
        assert_eq!(narrow(&limits, &both, 100, None, EngineKind::Vllm), None);
        // The only prefill worker cannot hold it: every worker is kept, the engine answers.
        let pair = [Role::Prefill, Role::Decode, Role::Decode];
        assert_eq!(narrow(&limits, &pair, 300, None, EngineKind::Vllm), None);
        assert!(differ(&limits) && !differ(&[None, None]) && !differ(&[]));
    }

    #[test]
    fn a_prompt_no_context_holds_goes_to_the_largest() {
        let limits = [Some(32_768), Some(65_536), Some(65_536)];
        let largest = (vec![false, true, true], Fit::Over);
        assert_eq!(fitting_v(&limits, 100_000, None), largest);
        // An untokenized request (0 tokens) is not narrowed.
        assert_eq!(
            fitting_v(&limits, 0, Some(1 << 40)),
            (vec![true; 3], Fit::Whole)
        );
        assert!(fitting_v(&[], 100, None).0.is_empty());
    }
}
