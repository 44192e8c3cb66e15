//! How long one engine step takes.
//!
//! Defaults are the polynomial fit NVIDIA Dynamo's mocker publishes for vLLM: a prefill of `t`
//! batched new tokens costs `a·t² + b·t + c` ms, a decode step costs `d·p² + e·p + f` ms for
//! `p` = fraction of KV blocks in use (at least `min_decode_ms`). Everything is divided by
//! `speedup`, which simulates a faster GPU (or lets tests and demos run quickly).
//!
//! Mixed steps: vLLM runs decodes and prefill chunks in one forward pass. The prefill part is
//! compute bound (GEMMs over the new tokens), the decode part memory bound (reading the KV of
//! every running sequence); neither hides the other well, so a mixed step costs the **sum** of
//! the prefill time of its prefill tokens and the decode time at the current KV usage. This is
//! continuous with both pure cases and never makes adding work cheaper. Decode tokens are
//! charged by the decode term only, not counted as prefill tokens.

use serde::{Deserialize, Serialize};

/// Coefficients of the step-time model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepTiming {
    /// Prefill ms, coefficient of t².
    pub prefill_a: f64,
    /// Prefill ms, coefficient of t.
    pub prefill_b: f64,
    /// Prefill ms, constant.
    pub prefill_c: f64,
    /// Decode ms, coefficient of p².
    pub decode_a: f64,
    /// Decode ms, coefficient of p.
    pub decode_b: f64,
    /// Decode ms, constant.
    pub decode_c: f64,
    /// Floor of a decode step, ms.
    pub min_decode_ms: f64,
    /// Divides every duration; 1 is a real-speed GPU.
    pub speedup: f64,
}

impl Default for StepTiming {
    fn default() -> Self {
        StepTiming {
            prefill_a: 4.209989e-7,
            prefill_b: 1.518344e-2,
            prefill_c: 16.50142,
            decode_a: -25.74,
            decode_b: 54.01,
            decode_c: 5.74,
            min_decode_ms: 1.0,
            speedup: 1.0,
        }
    }
}

/// The work of one step, as the timing model sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepWork {
    /// New tokens of prefill chunks (including recomputation after preemption).
    pub prefill_tokens: usize,
    /// Sequences producing one decode token.
    pub decode_seqs: usize,
    /// Fraction of KV blocks in use after scheduling, in `[0, 1]`.
    pub kv_usage: f64,
}

impl StepTiming {
    /// Prefill time of `t` new tokens, ms (before speedup).
    pub fn prefill_ms(&self, t: usize) -> f64 {
        let t = t as f64;
        (self.prefill_a * t * t + self.prefill_b * t + self.prefill_c).max(0.0)
    }

    /// Decode step time at KV usage `p`, ms (before speedup).
    pub fn decode_ms(&self, p: f64) -> f64 {
        let p = p.clamp(0.0, 1.0);
        (self.decode_a * p * p + self.decode_b * p + self.decode_c).max(self.min_decode_ms)
    }

    /// Duration of a step, seconds (after speedup). Zero for an empty step.
    pub fn step_seconds(&self, work: StepWork) -> f64 {
        let mut ms = 0.0;
        if work.prefill_tokens > 0 {
            ms += self.prefill_ms(work.prefill_tokens);
        }
        if work.decode_seqs > 0 {
            ms += self.decode_ms(work.kv_usage);
        }
        let speedup = if self.speedup > 0.0 {
            self.speedup
        } else {
            1.0
        };
        ms / 1000.0 / speedup
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn defaults_match_the_published_fit() {
        let t = StepTiming::default();
        assert!(close(t.prefill_ms(1000), 0.4209989 + 15.18344 + 16.50142));
        assert!(close(t.decode_ms(0.5), -25.74 * 0.25 + 27.005 + 5.74));
        assert!(close(t.decode_ms(0.0), 5.74));
    }

    #[test]
    fn mixed_step_is_the_sum_and_speedup_divides() {
        let mut t = StepTiming::default();
        let w = StepWork {
            prefill_tokens: 100,
            decode_seqs: 3,
            kv_usage: 0.2,
        };
        let sum = (t.prefill_ms(100) + t.decode_ms(0.2)) / 1000.0;
        assert!(close(t.step_seconds(w), sum));
        t.speedup = 10.0;
        assert!(close(t.step_seconds(w), sum / 10.0));
        assert_eq!(t.step_seconds(StepWork::default()), 0.0);
    }

    #[test]
    fn decode_has_a_floor() {
        let t = StepTiming {
            decode_c: -100.0,
            ..StepTiming::default()
        };
        assert_eq!(t.decode_ms(0.0), 1.0);
    }
}
