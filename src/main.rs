//! The `kvroute` command: one binary, one subcommand per job.

use kvroute::cli::Job as Command;
use kvroute::config::{Config, LogFormat};

/// Logs go to stderr (stdout is for results: `bench` and `simulate` print theirs there), in
/// colour only when stderr is a terminal: escape codes in a file or a log collector are noise.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> std::process::ExitCode {
    let cli = kvroute::cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kvroute: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => {
                let loaded = Config::load_hashed(&args)?;
                init_logging(loaded.config.log_format);
                loaded.config.warn_deprecations();
                kvroute::server::run(loaded, args).await
            }
            #[cfg(feature = "lab")]
            Command::Engine(args) => {
                init_logging(LogFormat::Text);
                kvroute::engine::run(args).await
            }
            #[cfg(feature = "lab")]
            Command::Bench(args) => kvroute::bench::run(args).await,
            #[cfg(feature = "lab")]
            Command::Simulate(args) => {
                init_logging(LogFormat::Text);
                tokio::task::spawn_blocking(move || kvroute::sim::run(args)).await?
            }
            #[cfg(feature = "lab")]
            Command::Demo(args) => {
                init_logging(LogFormat::Text);
                kvroute::demo::run(args).await
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvroute: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
