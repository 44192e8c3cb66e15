//! Workload flags shared by `kvroute bench` and `kvroute simulate`.

use clap::ValueEnum;

/// Synthetic workloads selectable on the command line.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyntheticChoice {
    /// System prompts with zipf popularity plus unique questions.
    SharedPrefix,
    /// Conversations whose next turn extends the previous prompt.
    MultiTurn,
    /// Every prompt unique.
    Unique,
    /// One hot prefix at a high rate.
    HotPrefix,
}
