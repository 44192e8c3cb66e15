//! Recording the operator's own traffic as a Mooncake trace (`[recording] trace`,
//! `kvroute serve --record-trace FILE`), for `kvroute simulate --trace FILE`.
//!
//! Each routed request that got a successful response becomes one line when its response ends
//! (its output length is known only then): arrival, prompt and output tokens, and the ids of
//! its prompt's blocks ([`line`], [`ids`]). No text and no token id is written.
//!
//! The request path never waits on the disk: a record goes through a bounded queue to a writer
//! thread, and when the queue is full (the disk cannot keep up) the record is dropped and
//! counted (`kvroute_trace_records_dropped_total{reason="queue_full"}`). A record that cannot
//! be written (disk full) is counted with `reason="write_error"`, and logged at most once a
//! minute ([`complaints`]). The writer flushes whenever the queue is empty, so a line is on
//! disk moments after its request ended.

mod complaints;
mod file;
mod ids;
mod line;

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

pub use file::{TraceFile, rotated};
pub use ids::BlockIds;
pub use line::{Record, mooncake_line};

use crate::metrics::Metrics;

/// Where and how the trace is written (`[recording]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordSettings {
    /// The live trace file.
    pub path: PathBuf,
    /// Size past which the live file is rotated.
    pub max_bytes: u64,
    /// Rotated files kept (`PATH.1` … `PATH.<keep_files>`).
    pub keep_files: usize,
    /// Records waiting for the writer before new ones are dropped.
    pub queue: usize,
    /// The file holding the key of the block ids; a random key per process without one.
    pub id_key_file: Option<PathBuf>,
}

/// Default `[recording] max_bytes`: 256 MiB, about 200,000 requests of 1k-token prompts at
/// block size 16 (each id takes about 17 bytes).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
/// Default `[recording] keep_files`.
pub const DEFAULT_KEEP_FILES: usize = 4;
/// Default `[recording] queue`.
pub const DEFAULT_QUEUE: usize = 4096;

impl RecordSettings {
    /// Settings for `path` with the defaults.
    pub fn new(path: PathBuf) -> RecordSettings {
        RecordSettings {
            path,
            max_bytes: DEFAULT_MAX_BYTES,
            keep_files: DEFAULT_KEEP_FILES,
            queue: DEFAULT_QUEUE,
            id_key_file: None,
        }
    }
}

/// Fewest bytes of an `id_key_file`: a shorter key could be guessed.
pub const MIN_KEY_BYTES: usize = 16;

/// The block-id map of `settings`: under the key in its `id_key_file` (its bytes, trailing
/// whitespace trimmed), else under a random key.
fn block_ids(settings: &RecordSettings) -> std::io::Result<BlockIds> {
    let Some(path) = &settings.id_key_file else {
        return Ok(BlockIds::random());
    };
    let bytes = std::fs::read(path).map_err(|e| {
        std::io::Error::new(e.kind(), format!("id_key_file {}: {e}", path.display()))
    })?;
    let key = bytes.trim_ascii_end();
    if key.len() < MIN_KEY_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "id_key_file {} holds {} bytes; give at least {MIN_KEY_BYTES} random ones, e.g. \
                 `head -c 32 /dev/urandom | base64 > {}`",
                path.display(),
                key.len(),
                path.display()
            ),
        ));
    }
    Ok(BlockIds::with_key(key))
}

/// The request path's handle on the trace writer.
pub struct Recorder {
    tx: SyncSender<Record>,
    started: Instant,
    metrics: Metrics,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

impl Recorder {
    /// Reads the id key, creates the trace file (failing now if either cannot be) and starts the writer thread; it
    /// ends when the recorder is dropped, after writing what was queued.
    pub fn start(settings: &RecordSettings, metrics: &Metrics) -> std::io::Result<Recorder> {
        let ids = block_ids(settings)?;
        let file = TraceFile::create(&settings.path, settings.max_bytes, settings.keep_files)
            .map_err(|e| {
                let path = settings.path.display();
                std::io::Error::new(e.kind(), format!("cannot write the trace {path}: {e}"))
            })?;
        let (tx, rx) = sync_channel(settings.queue.max(1));
        let writer = Writer::new(file, ids, metrics, settings.path.clone());
        std::thread::Builder::new()
            .name("kvroute-trace".into())
            .spawn(move || writer.run(rx))?;
        Ok(Recorder {
            tx,
            started: Instant::now(),
            metrics: metrics.clone(),
        })
    }

    /// Time from the recorder's start to `at` (a request's arrival): its line's timestamp.
    pub fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.started)
    }

    /// Queues `record` for writing, or drops and counts it when the queue is full; never blocks.
    pub fn record(&self, record: Record) {
        let reason = match self.tx.try_send(record) {
            Ok(()) => return,
            Err(TrySendError::Full(_)) => "queue_full",
            Err(TrySendError::Disconnected(_)) => "write_error",
        };
        self.dropped(reason);
    }

    /// Counts a request that is not recorded, and why.
    pub fn dropped(&self, reason: &str) {
        self.metrics
            .recording
            .dropped
            .with_label_values(&[reason])
            .inc();
    }
}

/// The writer thread's state.
struct Writer {
    file: TraceFile,
    ids: BlockIds,
    seq: u64,
    metrics: Metrics,
    path: PathBuf,
    complaints: complaints::Complaints,
}

/// How long the writer waits for a record before checking that it still has senders.
const IDLE_WAKE: Duration = Duration::from_secs(1);

impl Writer {
    fn new(file: TraceFile, ids: BlockIds, metrics: &Metrics, path: PathBuf) -> Writer {
        Writer {
            file,
            ids,
            seq: 0,
            metrics: metrics.clone(),
            path,
            complaints: complaints::Complaints::new(complaints::EVERY),
        }
    }

    /// Logs a failure to write the trace, unless one was logged less than a minute ago.
    fn complain(&mut self, e: &std::io::Error) {
        if let Some(quiet) = self.complaints.failed(Instant::now()) {
            tracing::warn!(
                path = %self.path.display(),
                error = %e,
                failures_not_logged = quiet,
                "cannot write the trace; records are dropped (counted in \
                 kvroute_trace_records_dropped_total), and this is logged at most once a minute"
            );
        }
    }

    fn run(mut self, rx: Receiver<Record>) {
        loop {
            let record = match rx.recv_timeout(IDLE_WAKE) {
                Ok(r) => r,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            self.write(&record);
            // Everything already queued goes in the same buffered write.
            while let Ok(r) = rx.try_recv() {
                self.write(&r);
            }
            if let Err(e) = self.file.flush() {
                self.complain(&e);
            }
        }
        let _ = self.file.flush();
    }

    fn write(&mut self, record: &Record) {
        let line = mooncake_line(record, &self.ids, self.seq);
        self.seq += 1;
        match self.file.write_line(&line) {
            Ok(()) => self.metrics.recording.records.inc(),
            Err(e) => {
                self.metrics
                    .recording
                    .dropped
                    .with_label_values(&["write_error"])
                    .inc();
                self.complain(&e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::tokens::BlockHash;

    fn record(ms: u64) -> Record {
        Record {
            arrival: Duration::from_millis(ms),
            input_tokens: 20,
            output_tokens: 3,
            hashes: vec![BlockHash(1)],
            block_size: 16,
        }
    }

    #[test]
    fn lines_reach_the_file_and_rotate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.jsonl");
        let metrics = Metrics::new();
        let settings = RecordSettings {
            max_bytes: 150,
            keep_files: 10,
            ..RecordSettings::new(path.clone())
        };
        let recorder = Recorder::start(&settings, &metrics).unwrap();
        for ms in 0..6 {
            recorder.record(record(ms));
        }
        drop(recorder);
        // The writer ends once its queue is drained and its sender gone.
        let mut lines = 0;
        for _ in 0..200 {
            lines = (0..=10)
                .map(|n| {
                    if n == 0 {
                        path.clone()
                    } else {
                        rotated(&path, n)
                    }
                })
                .filter_map(|p| std::fs::read_to_string(p).ok())
                .map(|t| t.lines().count())
                .sum::<usize>();
            if lines == 6 && metrics.recording.records.get() == 6 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(lines, 6);
        assert!(rotated(&path, 1).exists(), "a 150-byte file rotates");
    }

    /// A log sink for one test: what the subscriber writes, kept.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Issue 35 item 7: on a full disk every dropped record logged a WARN (1,766 lines).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_full_disk_is_complained_about_once_not_per_record() {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let metrics = Metrics::new();
        let file = TraceFile::over(PathBuf::from("/dev/full"), full, u64::MAX);
        let mut writer = Writer::new(file, BlockIds::random(), &metrics, "/dev/full".into());
        let logs = Captured::default();
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for ms in 0..2000 {
                writer.write(&record(ms));
            }
            let _ = writer.file.flush();
        });
        let dropped = metrics
            .recording
            .dropped
            .with_label_values(&["write_error"])
            .get();
        assert!(dropped > 1000, "the disk is full: {dropped} dropped");
        let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        let warnings = text.matches("cannot write the trace").count();
        assert_eq!(
            warnings, 1,
            "{dropped} failures logged {warnings} times:\n{text}"
        );
    }

    #[test]
    fn a_key_file_gives_every_process_the_same_ids() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("id.key");
        let with_key = |k: &std::path::Path| RecordSettings {
            id_key_file: Some(k.to_owned()),
            ..RecordSettings::new(dir.path().join("t.jsonl"))
        };
        std::fs::write(&key, "short\n").unwrap();
        let e = block_ids(&with_key(&key)).unwrap_err().to_string();
        assert!(e.contains("at least 16"), "{e}");
        let e = block_ids(&with_key(&dir.path().join("absent"))).unwrap_err();
        assert!(e.to_string().contains("absent"), "{e}");
        std::fs::write(&key, "c2VjcmV0LWtleS1mb3ItdGVzdHM=\n").unwrap();
        let (a, b) = (
            block_ids(&with_key(&key)).unwrap(),
            block_ids(&with_key(&key)).unwrap(),
        );
        assert_eq!(a.id(BlockHash(5)), b.id(BlockHash(5)));
        let random = block_ids(&RecordSettings::new(dir.path().join("t.jsonl"))).unwrap();
        assert_ne!(a.id(BlockHash(5)), random.id(BlockHash(5)));
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let (tx, rx) = sync_channel(1);
        let metrics = Metrics::new();
        let recorder = Recorder {
            tx,
            started: Instant::now(),
            metrics: metrics.clone(),
        };
        recorder.record(record(0));
        recorder.record(record(1));
        let dropped = |r: &str| metrics.recording.dropped.with_label_values(&[r]).get();
        assert_eq!(dropped("queue_full"), 1);
        drop(rx);
        recorder.record(record(2));
        assert_eq!(dropped("write_error"), 1);
    }
}
