//! The `kvroute` command: one binary, one subcommand per job.

use kvroute::cli::Job as Command;
use kvroute::config::Config;
use kvroute::telemetry;

fn main() -> std::process::ExitCode {
    kvroute::heap::fix_mmap_threshold();
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
    // The work's result, and what must be shut down after it while the runtime still runs
    // (the trace exporter sends its last spans on it).
    let result: anyhow::Result<(anyhow::Result<()>, Option<telemetry::Telemetry>)> = runtime
        .block_on(async {
            match cli.command {
                Command::Serve(args) => {
                    let loaded = Config::load_hashed(&args)?;
                    let telemetry =
                        telemetry::init(loaded.config.log_format, Some(&loaded.config.tracing))?;
                    loaded.config.warn_deprecations();
                    loaded.config.log_overrides();
                    loaded.config.warn_builtin_tokenizers();
                    let served = kvroute::server::run(loaded, args).await;
                    Ok((served, Some(telemetry)))
                }
                #[cfg(feature = "epp")]
                Command::Epp(args) => {
                    let loaded = args.load()?;
                    let telemetry =
                        telemetry::init(loaded.config.log_format, Some(&loaded.config.tracing))?;
                    loaded.config.warn_deprecations();
                    loaded.config.log_overrides();
                    loaded.config.warn_builtin_tokenizers();
                    Ok((kvroute::epp::run(loaded, &args).await, Some(telemetry)))
                }
                #[cfg(feature = "lab")]
                Command::Engine(args) => {
                    let _logs = telemetry::init(kvroute::config::LogFormat::Text, None)?;
                    Ok((kvroute::engine::run(args).await, None))
                }
                Command::Completions(args) => Ok((
                    kvroute::manual::run_completions(args, kvroute::cli::command()),
                    None,
                )),
                Command::Man(args) => Ok((
                    kvroute::manual::run_man(args, kvroute::cli::command()),
                    None,
                )),
                #[cfg(feature = "lab")]
                Command::Bench(args) => Ok((kvroute::bench::run(args).await, None)),
                #[cfg(feature = "lab")]
                Command::Simulate(args) => {
                    let _logs = telemetry::init(kvroute::config::LogFormat::Text, None)?;
                    let ran = tokio::task::spawn_blocking(move || kvroute::sim::run(*args)).await?;
                    Ok((ran, None))
                }
                #[cfg(feature = "lab")]
                Command::Demo(args) => {
                    let _logs = telemetry::init(kvroute::config::LogFormat::Text, None)?;
                    Ok((kvroute::demo::run(args).await, None))
                }
            }
        });
    let result = result.and_then(|(ran, telemetry)| {
        if let Some(t) = telemetry {
            t.shutdown();
        }
        ran
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvroute: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
