//! A tenant's `cache_salt`, written into the body's bytes as sent.
//!
//! The body is never re-encoded: a JSON tree would change what the client sent (big integers
//! become floats, `1E2` becomes `100.0`, duplicate keys collapse) and the engine would answer a
//! different request. Only the top-level `cache_salt` members are touched: each one's value is
//! replaced (duplicates too), or one member is added after the opening brace, or — where the
//! engine takes no salt — each is removed with one comma next to it; a `cache_salt` key nested anywhere deeper is content and stays as it is. Every other
//! byte — spacing, key order, number spellings, escapes — goes to the engine as the client
//! wrote it.
//!
//! The body has already been read as valid JSON ([`crate::openai::RequestView::from_json`]), so
//! the scan below only has to find where top-level members begin and end; it still refuses,
//! rather than guesses, anything that is not a JSON object.

use std::ops::Range;

use bytes::Bytes;

/// The body is not a JSON object the scan can follow.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the body is not a JSON object (at byte {0})")]
pub struct NotAnObject(pub usize);

/// One top-level member: where it starts (its key's opening quote), where its value lies.
struct Member {
    key_start: usize,
    value: Range<usize>,
    is_salt: bool,
}

/// The body with its top-level `cache_salt` set to `salt` (or removed, for `None`); the same
/// bytes, not copied, when nothing changes.
pub fn with_cache_salt(body: &Bytes, salt: Option<&str>) -> Result<Bytes, NotAnObject> {
    let (open, members) = top_level_members(body)?;
    let salts: Vec<usize> = (0..members.len()).filter(|&i| members[i].is_salt).collect();
    let encoded = salt.map(|s| serde_json::Value::String(s.to_owned()).to_string());
    let mut edits: Vec<(Range<usize>, &[u8])> = Vec::new();
    match (&encoded, salts.is_empty()) {
        (None, true) => return Ok(body.clone()),
        // Every top-level salt (a duplicate too) gets the tenant's value, in place.
        (Some(s), false) => {
            for &i in &salts {
                edits.push((members[i].value.clone(), s.as_bytes()));
            }
        }
        (Some(s), true) => {
            // No salt member yet: add one first, so nothing after it moves but by its length.
            let sep = if members.is_empty() { "" } else { "," };
            let member = format!("\"cache_salt\":{s}{sep}");
            let mut out = Vec::with_capacity(body.len() + member.len());
            out.extend_from_slice(&body[..=open]);
            out.extend_from_slice(member.as_bytes());
            out.extend_from_slice(&body[open + 1..]);
            return Ok(Bytes::from(out));
        }
        // Each removed member goes with one comma next to it.
        (None, false) => match (0..members.len()).find(|i| !members[*i].is_salt) {
            // Every member goes: the object becomes `{}` (with the spacing around them).
            None => {
                if let (Some(first), Some(last)) = (members.first(), members.last()) {
                    edits.push((first.key_start..last.value.end, b""));
                }
            }
            Some(kept) => {
                for &i in &salts {
                    let cut = if i < kept {
                        // Before the first kept member: up to the next key and its comma.
                        members[i].key_start..members[i + 1].key_start
                    } else {
                        // After a kept member: from the previous value's end, with the comma.
                        members[i - 1].value.end..members[i].value.end
                    };
                    edits.push((cut, b""));
                }
            }
        },
    }
    edits.sort_by_key(|(r, _)| r.start);
    let mut out = Vec::with_capacity(body.len() + 64);
    let mut at = 0;
    for (range, with) in edits {
        out.extend_from_slice(&body[at..range.start]);
        out.extend_from_slice(with);
        at = range.end;
    }
    out.extend_from_slice(&body[at..]);
    Ok(Bytes::from(out))
}

/// The offset of the opening brace and the top-level members, in order.
fn top_level_members(b: &[u8]) -> Result<(usize, Vec<Member>), NotAnObject> {
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return Err(NotAnObject(i));
    }
    let open = i;
    i += 1;
    let mut members = Vec::new();
    loop {
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b'}') if members.is_empty() => return Ok((open, members)),
            Some(b'"') => {}
            _ => return Err(NotAnObject(i)),
        }
        let key_start = i;
        let key_end = skip_string(b, i)?;
        let is_salt = is_cache_salt(&b[key_start..key_end]);
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return Err(NotAnObject(i));
        }
        let value_start = skip_ws(b, i + 1);
        let value_end = skip_value(b, value_start)?;
        members.push(Member {
            key_start,
            value: value_start..value_end,
            is_salt,
        });
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return Ok((open, members)),
            _ => return Err(NotAnObject(i)),
        }
    }
}

/// Whether a quoted key decodes to `cache_salt` (escapes included: `"cache\u005fsalt"` is the
/// same key to every JSON reader, the engine's too).
fn is_cache_salt(quoted: &[u8]) -> bool {
    if !quoted.contains(&b'\\') {
        return quoted == b"\"cache_salt\"";
    }
    serde_json::from_slice::<String>(quoted).is_ok_and(|k| k == "cache_salt")
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The end (one past the closing quote) of the string opening at `i`.
fn skip_string(b: &[u8], mut i: usize) -> Result<usize, NotAnObject> {
    i += 1;
    loop {
        match b.get(i) {
            Some(b'"') => return Ok(i + 1),
            Some(b'\\') => i += 2,
            Some(_) => i += 1,
            None => return Err(NotAnObject(i)),
        }
    }
}

/// The end of the value starting at `i`: a string, a container (to its matching bracket) or a
/// literal (to the next delimiter).
fn skip_value(b: &[u8], mut i: usize) -> Result<usize, NotAnObject> {
    match b.get(i) {
        Some(b'"') => skip_string(b, i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            loop {
                match b.get(i) {
                    Some(b'"') => {
                        i = skip_string(b, i)?;
                        continue;
                    }
                    Some(b'{' | b'[') => depth += 1,
                    Some(b'}' | b']') => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(i + 1);
                        }
                    }
                    Some(_) => {}
                    None => return Err(NotAnObject(i)),
                }
                i += 1;
            }
        }
        Some(_) => {
            let start = i;
            while let Some(c) = b.get(i) {
                if matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    break;
                }
                i += 1;
            }
            if i == start {
                return Err(NotAnObject(i));
            }
            Ok(i)
        }
        None => Err(NotAnObject(i)),
    }
}

#[cfg(test)]
#[path = "cache_salt_tests.rs"]
mod tests;
