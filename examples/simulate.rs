//! `kvroute simulate` as a standalone example, for use before (or without) the main binary:
//! `cargo run --release --example simulate -- --scenario all --out /tmp/sim`.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "simulate",
    about = "Virtual-time simulation of routing policies"
)]
struct Cli {
    #[command(flatten)]
    args: kvroute::sim::SimulateArgs,
}

fn main() -> std::process::ExitCode {
    match kvroute::sim::run(Cli::parse().args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("simulate: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
