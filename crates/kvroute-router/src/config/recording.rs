//! `[recording]`: the operator's own traffic as a Mooncake trace (`trace`, `max_bytes`,
//! `keep_files`, `queue`, `id_key_file`); `kvroute serve --record-trace FILE` sets `trace`. Off unless a file
//! is named. Defaults are in [`crate::recording`].

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::recording::{DEFAULT_KEEP_FILES, DEFAULT_MAX_BYTES, DEFAULT_QUEUE, RecordSettings};

/// The `[recording]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileRecording {
    pub(super) trace: Option<PathBuf>,
    pub(super) max_bytes: Option<u64>,
    pub(super) keep_files: Option<usize>,
    pub(super) queue: Option<usize>,
    pub(super) id_key_file: Option<PathBuf>,
}

/// Smallest `max_bytes`: a file must hold at least a few lines.
const MIN_MAX_BYTES: u64 = 4 << 10;
/// Most rotated files kept: the numbered names are shifted one by one at each rotation.
const MAX_KEEP_FILES: usize = 1000;
/// Largest queue: each waiting record holds its prompt's block hashes.
const MAX_QUEUE: usize = 1 << 20;

/// The recording settings, `None` when no trace file is named; `flag` is `--record-trace`,
/// which wins over `[recording] trace`.
pub(super) fn recording(
    file: &FileRecording,
    flag: Option<&Path>,
) -> Result<Option<RecordSettings>, ConfigError> {
    let Some(path) = flag.map(Path::to_path_buf).or_else(|| file.trace.clone()) else {
        return Ok(None);
    };
    if path.as_os_str().is_empty() || path.is_dir() {
        return Err(invalid(
            "recording.trace",
            "must name a file to write, e.g. \"/var/lib/kvroute/trace.jsonl\"",
        ));
    }
    let max_bytes = file.max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    if max_bytes < MIN_MAX_BYTES {
        return Err(invalid(
            "recording.max_bytes",
            format!(
                "{max_bytes} is too small; give at least {MIN_MAX_BYTES} (default {DEFAULT_MAX_BYTES})"
            ),
        ));
    }
    let keep_files = file.keep_files.unwrap_or(DEFAULT_KEEP_FILES);
    if keep_files > MAX_KEEP_FILES {
        return Err(invalid(
            "recording.keep_files",
            format!("keep at most {MAX_KEEP_FILES} rotated files (default {DEFAULT_KEEP_FILES})"),
        ));
    }
    let queue = file.queue.unwrap_or(DEFAULT_QUEUE);
    if !(1..=MAX_QUEUE).contains(&queue) {
        return Err(invalid(
            "recording.queue",
            format!("must be 1 to {MAX_QUEUE} records (default {DEFAULT_QUEUE})"),
        ));
    }
    if file
        .id_key_file
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err(invalid(
            "recording.id_key_file",
            "must name a file holding at least 16 random bytes, or be left out for a random key per process",
        ));
    }
    Ok(Some(RecordSettings {
        path,
        max_bytes,
        keep_files,
        queue,
        id_key_file: file.id_key_file.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_named_and_the_flag_wins() {
        assert_eq!(recording(&FileRecording::default(), None).unwrap(), None);
        let file = FileRecording {
            trace: Some("/tmp/a.jsonl".into()),
            max_bytes: Some(1 << 20),
            keep_files: Some(2),
            queue: None,
            id_key_file: None,
        };
        let s = recording(&file, None).unwrap().unwrap();
        assert_eq!(
            (s.path.to_str(), s.max_bytes, s.keep_files, s.queue),
            (Some("/tmp/a.jsonl"), 1 << 20, 2, DEFAULT_QUEUE)
        );
        let s = recording(&file, Some(Path::new("/tmp/b.jsonl")))
            .unwrap()
            .unwrap();
        assert_eq!(s.path, PathBuf::from("/tmp/b.jsonl"));
    }

    /// The example's `[recording]` block is commented out (the example must not write
    /// anything), but uncommented it loads with the defaults it documents.
    #[test]
    fn the_example_block_loads_when_uncommented() {
        let text = include_str!("../../../../config/kvroute.example.toml");
        let start = text.find("# [recording]\n").unwrap();
        let end = start + text[start..].find("\n\n").unwrap();
        let block: String = text[start..end]
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l.trim_start_matches('#')))
            .collect::<Vec<_>>()
            .join("\n");
        let c = super::super::Config::from_toml(&block, Path::new("example")).unwrap();
        let r = c.recording.unwrap();
        assert_eq!(r.path, PathBuf::from("/var/lib/kvroute/trace.jsonl"));
        assert_eq!(
            (r.max_bytes, r.keep_files, r.queue),
            (DEFAULT_MAX_BYTES, DEFAULT_KEEP_FILES, DEFAULT_QUEUE)
        );
        assert_eq!(
            r.id_key_file,
            Some(PathBuf::from("/etc/kvroute/trace-id.key"))
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let named = |f: FileRecording| FileRecording {
            trace: Some("/tmp/a.jsonl".into()),
            ..f
        };
        for (bad, key) in [
            (
                named(FileRecording {
                    max_bytes: Some(10),
                    ..Default::default()
                }),
                "recording.max_bytes",
            ),
            (
                named(FileRecording {
                    keep_files: Some(5000),
                    ..Default::default()
                }),
                "recording.keep_files",
            ),
            (
                named(FileRecording {
                    queue: Some(0),
                    ..Default::default()
                }),
                "recording.queue",
            ),
            (
                FileRecording {
                    trace: Some(std::env::temp_dir()),
                    ..Default::default()
                },
                "recording.trace",
            ),
            (
                named(FileRecording {
                    id_key_file: Some(PathBuf::new()),
                    ..Default::default()
                }),
                "recording.id_key_file",
            ),
        ] {
            let e = recording(&bad, None).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }
}
