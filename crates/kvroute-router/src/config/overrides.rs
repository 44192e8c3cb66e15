//! Which file values a flag or its `KVROUTE_*` variable replaced. A container's environment
//! (the Dockerfile sets `KVROUTE_LISTEN`) silently beating the file's `listen` cost a newcomer
//! an afternoon (issue 34): each replacement is logged at start, naming the variable.

use super::ServeArgs;
use super::file::FileConfig;

/// A file key whose value a flag replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    /// The flag's long name (`listen`, `block-size`, ...).
    pub flag: &'static str,
    /// The file's key it replaced (`server.listen`, `models[0].tokenizer`, ...).
    pub key: String,
}

impl Override {
    /// The flag's variable, by the rule of the `kvroute` package's `cli` for `serve`'s flags.
    pub fn variable(&self) -> String {
        format!(
            "KVROUTE_{}",
            self.flag.to_ascii_uppercase().replace('-', "_")
        )
    }

    /// Logs it at INFO: the variable (or flag) and the file key it beat.
    pub fn log(&self) {
        tracing::info!(
            variable = %self.variable(),
            flag = %format!("--{}", self.flag),
            key = %self.key,
            "`{}` (or `--{}`) overrides the config file's `{}`",
            self.variable(),
            self.flag,
            self.key
        );
    }
}

/// The file keys that `args` replace, in flag order. `--worker` adds workers rather than
/// replacing any; `--tokenizer` overrides are found by `models` (per model).
pub(super) fn overrides(file: &FileConfig, args: &ServeArgs) -> Vec<Override> {
    let listen_key = if file.server.listen.is_some() {
        Some("server.listen")
    } else {
        file.listen.as_ref().map(|_| "listen")
    };
    let open_on_loopback = file
        .admin
        .as_ref()
        .is_some_and(|a| a.open_on_loopback.is_some());
    [
        ("listen", args.listen.is_some(), listen_key),
        (
            "policy",
            args.policy.is_some(),
            file.policy.as_ref().map(|_| "policy"),
        ),
        (
            "log-format",
            args.log_format.is_some(),
            file.log_format.map(|_| "log_format"),
        ),
        (
            "record-trace",
            args.record_trace.is_some(),
            file.recording.trace.as_ref().map(|_| "recording.trace"),
        ),
        (
            "admin-open-on-loopback",
            args.admin_open_on_loopback,
            open_on_loopback.then_some("admin.open_on_loopback"),
        ),
        (
            "replica-bus-url",
            args.replica_bus_url.is_some(),
            file.replica_bus.url.as_ref().map(|_| "replica_bus.url"),
        ),
        (
            "replica-id",
            args.replica_id.is_some(),
            file.replica_bus
                .replica_id
                .as_ref()
                .map(|_| "replica_bus.replica_id"),
        ),
        (
            "block-size",
            args.block_size.is_some(),
            file.tokens
                .default_block_size
                .map(|_| "tokens.default_block_size"),
        ),
    ]
    .into_iter()
    .filter_map(|(flag, given, key)| {
        key.filter(|_| given).map(|key| Override {
            flag,
            key: key.to_owned(),
        })
    })
    .collect()
}
