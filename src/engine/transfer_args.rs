//! The KV transfer link as flags, one clap group for every subcommand that models it.
//!
//! `kvroute simulate` flattens it for its disaggregated fleets; `kvroute engine` flattens it
//! for a decode engine's pulls. It is not part of [`super::EngineCoreArgs`] so that a
//! subcommand without disaggregation does not grow flags it ignores.

use clap::Args;

use super::transfer::{KvShape, TransferError, TransferModel};

/// The link a decode engine pulls prompts' KV over.
#[derive(Args, Clone, Copy, Debug, PartialEq)]
pub struct TransferArgs {
    /// Bytes of one token's KV cache (default: Qwen3-8B, 36 layers × 8 KV heads × 128 × 2
    /// (K and V) × 2 bytes bf16 = 147,456).
    #[arg(long, value_name = "BYTES", default_value_t = KvShape::QWEN3_8B.bytes_per_token())]
    pub kv_bytes_per_token: u64,
    /// Effective bandwidth of the prefill-to-decode link, bytes per second (default 25e9: one
    /// 200–400 Gb/s RDMA NIC per GPU).
    #[arg(long, value_name = "BYTES_PER_S", default_value_t = TransferModel::DEFAULT_BANDWIDTH)]
    pub kv_transfer_bandwidth: f64,
    /// Fixed cost of one KV transfer, milliseconds (handshake and completion notice).
    #[arg(long, value_name = "MS", default_value_t = TransferModel::DEFAULT_LATENCY_S * 1000.0)]
    pub kv_transfer_latency_ms: f64,
}

impl TransferArgs {
    /// The transfer model these flags describe, or why they describe none.
    pub fn transfer_model(&self) -> Result<TransferModel, TransferError> {
        TransferModel::try_new(
            self.kv_bytes_per_token,
            self.kv_transfer_bandwidth,
            self.kv_transfer_latency_ms / 1000.0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        link: TransferArgs,
    }

    fn parse(flags: &[&str]) -> Result<TransferModel, TransferError> {
        Cli::try_parse_from(std::iter::once("t").chain(flags.iter().copied()))
            .unwrap()
            .link
            .transfer_model()
    }

    #[test]
    fn defaults_are_the_default_model_and_flags_change_it() {
        assert_eq!(parse(&[]), Ok(TransferModel::default()));
        let m = parse(&[
            "--kv-bytes-per-token",
            "1000",
            "--kv-transfer-bandwidth",
            "1e6",
            "--kv-transfer-latency-ms",
            "500",
        ])
        .unwrap();
        assert_eq!(m, TransferModel::try_new(1000, 1e6, 0.5).unwrap());
        assert!(matches!(
            parse(&["--kv-transfer-bandwidth", "0"]),
            Err(TransferError::Bandwidth(_))
        ));
        assert!(matches!(
            parse(&["--kv-transfer-latency-ms=-1"]),
            Err(TransferError::Latency(_))
        ));
    }
}
