//! How long moving a prompt's KV cache from a prefill engine to a decode engine takes.
//!
//! In a disaggregated fleet the decode engine pulls the prompt's KV blocks from the prefill
//! engine (vLLM's NIXL connector reads them over RDMA; SGLang's Mooncake transfer engine does
//! the same) before it can decode. The time is what the link makes of the bytes:
//! `latency + tokens × bytes_per_token ÷ bandwidth`. Nothing else of the engine depends on
//! the model's size, so the bytes per token are stated here, from the model's KV shape
//! ([`KvShape`]); the default is a Qwen3-8B-like model (36 layers, 8 KV heads of 128 in
//! bf16: 144 KiB per token) over an effective 25 GB/s link (one 200–400 Gb/s RDMA NIC per
//! GPU, as NIXL deployments use) with 1 ms of fixed latency (handshake, notification).
//!
//! The transfer is asynchronous: it costs the decode engine no step time, only the wait
//! before the request may run (vLLM's `WAITING_FOR_REMOTE_KVS`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::request::RequestId;

/// One KV transfer a decode engine started: the request's prompt tokens it lacked locally,
/// moving from `start` (its admission) to `ready_at`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvPull {
    /// The decode-side request.
    pub id: RequestId,
    /// Prompt tokens whose KV moves (the prompt minus the decode engine's own cached prefix).
    pub tokens: usize,
    /// Their bytes.
    pub bytes: u64,
    /// When the transfer started (the step that admitted the request), engine seconds.
    pub start: f64,
    /// When the KV is there.
    pub ready_at: f64,
}

/// The shape of a model's KV cache, which sets the bytes one token's KV takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvShape {
    /// Transformer layers (each holds a K and a V per token).
    pub layers: u32,
    /// Key/value heads (grouped-query attention: fewer than query heads).
    pub kv_heads: u32,
    /// Dimension of one head.
    pub head_dim: u32,
    /// Bytes per element (2 for bf16/fp16, 1 for fp8).
    pub dtype_bytes: u32,
}

impl KvShape {
    /// Qwen3-8B: 36 layers, 8 KV heads of 128, bf16.
    pub const QWEN3_8B: KvShape = KvShape {
        layers: 36,
        kv_heads: 8,
        head_dim: 128,
        dtype_bytes: 2,
    };

    /// Bytes of one token's KV: K and V in every layer.
    pub fn bytes_per_token(&self) -> u64 {
        2 * u64::from(self.layers)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }
}

/// A transfer model that cannot describe a link.
#[derive(Clone, Copy, Debug, Error, PartialEq)]
pub enum TransferError {
    /// Zero bytes per token would make every transfer free.
    #[error("KV bytes per token must be at least 1")]
    ZeroBytesPerToken,
    /// The bandwidth is not a positive finite number of bytes per second.
    #[error("KV transfer bandwidth must be a positive number of bytes per second, got {0}")]
    Bandwidth(f64),
    /// The latency is negative or not finite.
    #[error("KV transfer latency must be a number of seconds >= 0, got {0}")]
    Latency(f64),
}

/// The time to move a prompt's KV between two engines.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransferModel {
    bytes_per_token: u64,
    bandwidth_bytes_per_s: f64,
    latency_s: f64,
}

impl Default for TransferModel {
    /// Qwen3-8B-like KV (147,456 bytes per token) over 25 GB/s with 1 ms latency.
    fn default() -> Self {
        TransferModel {
            bytes_per_token: KvShape::QWEN3_8B.bytes_per_token(),
            bandwidth_bytes_per_s: Self::DEFAULT_BANDWIDTH,
            latency_s: Self::DEFAULT_LATENCY_S,
        }
    }
}

impl TransferModel {
    /// The default link's effective bandwidth, bytes per second.
    pub const DEFAULT_BANDWIDTH: f64 = 25e9;
    /// The default fixed cost of one transfer, seconds.
    pub const DEFAULT_LATENCY_S: f64 = 0.001;

    /// A model of `bytes_per_token` bytes per token over `bandwidth_bytes_per_s` with
    /// `latency_s` seconds of fixed cost per transfer.
    pub fn try_new(
        bytes_per_token: u64,
        bandwidth_bytes_per_s: f64,
        latency_s: f64,
    ) -> Result<Self, TransferError> {
        if bytes_per_token == 0 {
            return Err(TransferError::ZeroBytesPerToken);
        }
        if !(bandwidth_bytes_per_s.is_finite() && bandwidth_bytes_per_s > 0.0) {
            return Err(TransferError::Bandwidth(bandwidth_bytes_per_s));
        }
        if !(latency_s.is_finite() && latency_s >= 0.0) {
            return Err(TransferError::Latency(latency_s));
        }
        Ok(TransferModel {
            bytes_per_token,
            bandwidth_bytes_per_s,
            latency_s,
        })
    }

    /// The default link (25 GB/s, 1 ms) for a model of KV shape `shape`.
    pub fn for_shape(shape: KvShape) -> Result<Self, TransferError> {
        Self::try_new(
            shape.bytes_per_token(),
            Self::DEFAULT_BANDWIDTH,
            Self::DEFAULT_LATENCY_S,
        )
    }

    /// Bytes of one token's KV.
    pub fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token
    }

    /// Link bandwidth, bytes per second.
    pub fn bandwidth_bytes_per_s(&self) -> f64 {
        self.bandwidth_bytes_per_s
    }

    /// Fixed cost of one transfer, seconds.
    pub fn latency_s(&self) -> f64 {
        self.latency_s
    }

    /// Bytes moved for `tokens` tokens.
    pub fn bytes_for(&self, tokens: usize) -> u64 {
        self.bytes_per_token.saturating_mul(tokens as u64)
    }

    /// Seconds to move `tokens` tokens' KV; nothing to move costs nothing (not even the
    /// latency: no transfer happens).
    pub fn time_for(&self, tokens: usize) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        self.latency_s + self.bytes_for(tokens) as f64 / self.bandwidth_bytes_per_s
    }

    /// [`TransferModel::time_for`] as a `Duration`.
    pub fn duration_for(&self, tokens: usize) -> Duration {
        Duration::from_secs_f64(self.time_for(tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_qwen3_8b_over_25_gb_per_s() {
        let t = TransferModel::default();
        assert_eq!(t.bytes_per_token(), 147_456);
        assert_eq!(KvShape::QWEN3_8B.bytes_per_token(), 147_456);
        assert_eq!(t.time_for(0), 0.0);
        // 10,000 tokens = 1.47456 GB = 58.98 ms at 25 GB/s, plus 1 ms.
        let s = t.time_for(10_000);
        assert!((s - (0.001 + 1.47456 / 25.0)).abs() < 1e-12, "{s}");
        assert_eq!(t.duration_for(10_000), Duration::from_secs_f64(s));
        assert_eq!(TransferModel::for_shape(KvShape::QWEN3_8B), Ok(t));
    }

    #[test]
    fn time_grows_linearly_with_tokens() {
        let t = TransferModel::try_new(1000, 1e6, 0.5).unwrap();
        assert_eq!(t.time_for(1), 0.5 + 0.001);
        assert!((t.time_for(2000) - 2.5).abs() < 1e-12);
        assert_eq!(t.bytes_for(3), 3000);
    }

    #[test]
    fn invalid_links_are_refused_with_a_reason() {
        assert_eq!(
            TransferModel::try_new(0, 1e9, 0.0),
            Err(TransferError::ZeroBytesPerToken)
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                TransferModel::try_new(1, bad, 0.0),
                Err(TransferError::Bandwidth(_))
            ));
        }
        for bad in [-0.1, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                TransferModel::try_new(1, 1e9, bad),
                Err(TransferError::Latency(_))
            ));
        }
        let err = TransferModel::try_new(1, -3.0, 0.0).unwrap_err();
        assert!(err.to_string().contains("bandwidth"), "{err}");
    }
}
