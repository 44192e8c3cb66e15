//! Which session each request of a trace belongs to, so that a replay can name it the way
//! clients do (an affinity hint: `kvroute bench` sends it as `prompt_cache_key`, `kvroute
//! simulate` gives it to the routing core as the live router would read it).
//!
//! A Mooncake line may carry its own `session_id` (a number or a string). Traces that keep
//! sessions in a line-aligned sidecar (the agentic traces' `.meta.jsonl`: one JSON object per
//! request line, with `session`) are read with `--trace-sessions FILE`.

use std::io::BufRead;
use std::path::Path;

use serde_json::Value;

use super::trace::{TraceError, session_number};

/// The sidecar members that name a line's session, in order of preference.
const SIDECAR_KEYS: [&str; 2] = ["session_id", "session"];

/// Reads a sessions sidecar: for each non-empty line, the session it names (`None` for a line
/// naming none). A line that is not a JSON object is an error naming it.
pub fn read_sidecar(path: &Path) -> Result<Vec<Option<u64>>, TraceError> {
    let io = |source| TraceError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line).map_err(|e| TraceError::Line {
            line: i + 1,
            reason: format!("sessions sidecar {}: {e}", path.display()),
        })?;
        let Value::Object(m) = v else {
            return Err(TraceError::Line {
                line: i + 1,
                reason: format!("sessions sidecar {}: not a JSON object", path.display()),
            });
        };
        out.push(
            SIDECAR_KEYS
                .iter()
                .find_map(|k| m.get(*k))
                .and_then(session_number),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::trace::Trace;
    use serde_json::json;

    #[test]
    fn ids_are_numbers_or_hashed_and_null_names_none() {
        assert_eq!(session_number(&json!(7)), Some(7));
        assert_eq!(session_number(&json!(null)), None);
        assert_eq!(session_number(&json!("")), None);
        let a = session_number(&json!("conv-1")).unwrap();
        assert_eq!(session_number(&json!("conv-1")), Some(a));
        assert_ne!(session_number(&json!("conv-2")), Some(a));
    }

    #[test]
    fn a_line_names_its_session_and_a_sidecar_aligns_by_line_before_sorting() {
        let text = "{\"timestamp\": 5, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1], \"session_id\": \"s\"}\n\
                    {\"timestamp\": 1, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [2]}\n";
        let t = Trace::from_mooncake_str(text).unwrap();
        // Sorted by arrival: the second line comes first.
        assert_eq!(t.requests[0].session, None);
        assert_eq!(t.requests[1].session, session_number(&json!("s")));
        let t = Trace::from_mooncake_with_sessions(text.as_bytes(), Some(&[Some(10), Some(20)]))
            .unwrap();
        assert_eq!(t.requests[0].session, Some(20));
        assert_eq!(t.requests[1].session, Some(10));
    }

    #[test]
    fn a_sidecar_reads_session_or_session_id_and_rejects_what_is_not_an_object() {
        let dir = std::env::temp_dir().join(format!("kvroute-sidecar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("meta.jsonl");
        std::fs::write(
            &p,
            "{\"session\": 3, \"lane\": 1}\n\n{\"session_id\": \"x\"}\n{}\n",
        )
        .unwrap();
        let s = read_sidecar(&p).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0], Some(3));
        assert_eq!(s[1], session_number(&json!("x")));
        assert_eq!(s[2], None);
        std::fs::write(&p, "[1]\n").unwrap();
        let e = read_sidecar(&p).unwrap_err().to_string();
        assert!(
            e.contains("line 1") && e.contains("not a JSON object"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
