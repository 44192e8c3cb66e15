//! The trace file on disk, rotated by size.
//!
//! The live file is the configured path; when a line takes it past `max_bytes` it is closed and
//! shifted to `PATH.1` (an older `PATH.1` to `PATH.2`, …, up to `PATH.<keep_files>`; the oldest
//! is deleted), and a new live file begins. At start a file left by an earlier run is shifted
//! the same way rather than appended to: a run's timestamps start at 0 and its ids under a key
//! of its own (see `ids`), so two runs in one file would read as one wrong trace. Files of one
//! run concatenate, oldest first, into one valid trace.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// The live trace file and its rotation.
pub struct TraceFile {
    path: PathBuf,
    max_bytes: u64,
    keep_files: usize,
    out: BufWriter<File>,
    written: u64,
}

impl TraceFile {
    /// Starts a new live file at `path`, shifting an earlier run's away.
    pub fn create(path: &Path, max_bytes: u64, keep_files: usize) -> io::Result<TraceFile> {
        if path.exists() {
            shift(path, keep_files)?;
        }
        Ok(TraceFile {
            path: path.to_owned(),
            max_bytes,
            keep_files,
            out: BufWriter::new(open(path)?),
            written: 0,
        })
    }

    /// A trace file over an already open `file` (tests: a device that fails every write).
    #[cfg(test)]
    pub(super) fn over(path: PathBuf, file: File, max_bytes: u64) -> TraceFile {
        TraceFile {
            path,
            max_bytes,
            keep_files: 0,
            out: BufWriter::new(file),
            written: 0,
        }
    }

    /// Appends one line (buffered), then rotates if the file is now past its size.
    pub fn write_line(&mut self, line: &str) -> io::Result<()> {
        self.out.write_all(line.as_bytes())?;
        self.written += line.len() as u64;
        if self.written >= self.max_bytes {
            self.rotate()?;
        }
        Ok(())
    }

    /// Writes buffered lines to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.out.flush()?;
        shift(&self.path, self.keep_files)?;
        self.out = BufWriter::new(open(&self.path)?);
        self.written = 0;
        Ok(())
    }
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
}

/// `path.n` for rotated file `n`.
pub fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// Moves `path` to `path.1` and each `path.n` to `path.n+1`, deleting what would pass
/// `keep_files` (with 0 kept, `path` itself is deleted).
fn shift(path: &Path, keep_files: usize) -> io::Result<()> {
    if keep_files == 0 {
        return remove_if_present(path);
    }
    remove_if_present(&rotated(path, keep_files))?;
    for n in (1..keep_files).rev() {
        let from = rotated(path, n);
        if from.exists() {
            fs::rename(&from, rotated(path, n + 1))?;
        }
    }
    fs::rename(path, rotated(path, 1))
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: &Path) -> String {
        fs::read_to_string(p).unwrap_or_default()
    }

    #[test]
    fn rotates_past_the_size_and_keeps_n_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        fs::write(&path, "earlier run\n").unwrap();
        let mut f = TraceFile::create(&path, 10, 2).unwrap();
        assert_eq!(
            read(&rotated(&path, 1)),
            "earlier run\n",
            "never appended to"
        );
        for line in ["aaaaaa\n", "bbbbbb\n", "cccccc\n", "dddddd\n", "eeee\n"] {
            f.write_line(line).unwrap();
        }
        f.flush().unwrap();
        assert_eq!(read(&path), "eeee\n");
        assert_eq!(read(&rotated(&path, 1)), "cccccc\ndddddd\n");
        assert_eq!(read(&rotated(&path, 2)), "aaaaaa\nbbbbbb\n");
        assert!(
            !rotated(&path, 3).exists(),
            "only two rotated files are kept"
        );
    }

    #[test]
    fn keeping_no_files_deletes_the_full_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let mut f = TraceFile::create(&path, 4, 0).unwrap();
        f.write_line("12345\n").unwrap();
        f.write_line("ab\n").unwrap();
        f.flush().unwrap();
        assert_eq!(read(&path), "ab\n");
        assert!(!rotated(&path, 1).exists());
    }
}
