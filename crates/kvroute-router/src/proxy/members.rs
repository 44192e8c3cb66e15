//! Edits to a JSON object's top-level members, written into the body's bytes as sent.
//!
//! The body is never re-encoded: a JSON tree would change what the client sent (big integers
//! become floats, `1E2` becomes `100.0`, duplicate keys collapse) and the engine would answer a
//! different request. Only the named top-level members are touched: each one's value is
//! replaced in place (duplicates too), or one member is added after the opening brace, or each
//! is removed with one comma next to it; the same key nested anywhere deeper is content and
//! stays as it is. Every other byte — spacing, key order, number spellings, escapes — goes to
//! the engine as the client wrote it. Used for a tenant's `cache_salt`
//! (`server::cache_salt`) and the prefill/decode hand-off fields (`proxy::handoff`).
//!
//! Bodies reach this after they were read as valid JSON, so the scan only has to find where
//! top-level members begin and end; it still refuses, rather than guesses, anything that is not
//! a JSON object.

use std::ops::Range;

use bytes::Bytes;

/// The body is not a JSON object the scan can follow.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the body is not a JSON object (at byte {0})")]
pub struct NotAnObject(pub usize);

/// What to do with one top-level key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit<'a> {
    /// Give every member of this key this (encoded JSON) value; add the member if there is none.
    Set(&'a [u8]),
    /// Give every member of this key this value; add nothing if there is none.
    Replace(&'a [u8]),
    /// Remove every member of this key.
    Remove,
}

/// One top-level member: where it starts (its key's opening quote), where its value lies, and
/// which edit (by index) names its key.
struct Member {
    key_start: usize,
    value: Range<usize>,
    edit: Option<usize>,
}

/// The body with `edits` applied to its top-level members; the same bytes, not copied, when
/// nothing changes. A key named twice in `edits` takes the first.
pub fn edit(body: &Bytes, edits: &[(&str, Edit<'_>)]) -> Result<Bytes, NotAnObject> {
    let (open, members) = top_level_members(body, edits)?;
    let present = |e: usize| members.iter().any(|m| m.edit == Some(e));
    // Members added after the opening brace, in the order of `edits`.
    let mut added = Vec::new();
    for (i, (key, e)) in edits.iter().enumerate() {
        if let Edit::Set(value) = e
            && !present(i)
            && edits[..i].iter().all(|(k, _)| k != key)
        {
            if !added.is_empty() {
                added.push(b',');
            }
            added.extend_from_slice(
                serde_json::Value::String((*key).to_owned())
                    .to_string()
                    .as_bytes(),
            );
            added.push(b':');
            added.extend_from_slice(value);
        }
    }
    let removed = |m: &Member| m.edit.is_some_and(|e| edits[e].1 == Edit::Remove);
    let kept = members.iter().position(|m| !removed(m));
    let mut cuts: Vec<(Range<usize>, &[u8])> = Vec::new();
    if !added.is_empty() && kept.is_some() {
        added.push(b',');
    }
    if !added.is_empty() {
        cuts.push((open + 1..open + 1, &added));
    }
    for (i, m) in members.iter().enumerate() {
        match m.edit.map(|e| edits[e].1) {
            None => {}
            Some(Edit::Set(v) | Edit::Replace(v)) => cuts.push((m.value.clone(), v)),
            Some(Edit::Remove) => match kept {
                // Every member goes: the object keeps only the spacing around them.
                None => {
                    if i == 0
                        && let Some(last) = members.last()
                    {
                        cuts.push((m.key_start..last.value.end, b""));
                    }
                }
                // Before the first kept member: up to the next key, with the comma.
                Some(k) if i < k => cuts.push((m.key_start..members[i + 1].key_start, b"")),
                // After a kept member: from the previous value's end, with the comma.
                Some(_) => cuts.push((members[i - 1].value.end..m.value.end, b"")),
            },
        }
    }
    if cuts.is_empty() {
        return Ok(body.clone());
    }
    // Stable: the insertion at the brace stays ahead of a cut starting at the same byte.
    cuts.sort_by_key(|(r, _)| r.start);
    let mut out = Vec::with_capacity(body.len() + added.len() + 64);
    let mut at = 0;
    for (range, with) in cuts {
        out.extend_from_slice(&body[at..range.start]);
        out.extend_from_slice(with);
        at = range.end;
    }
    out.extend_from_slice(&body[at..]);
    Ok(Bytes::from(out))
}

/// The offset of the opening brace and the top-level members, in order.
fn top_level_members(
    b: &[u8],
    edits: &[(&str, Edit<'_>)],
) -> Result<(usize, Vec<Member>), NotAnObject> {
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
        let edit = named(&b[key_start..key_end], edits);
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return Err(NotAnObject(i));
        }
        let value_start = skip_ws(b, i + 1);
        let value_end = skip_value(b, value_start)?;
        members.push(Member {
            key_start,
            value: value_start..value_end,
            edit,
        });
        i = skip_ws(b, value_end);
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return Ok((open, members)),
            _ => return Err(NotAnObject(i)),
        }
    }
}

/// Which edit names this quoted key, decoded as every JSON reader (the engine's too) decodes
/// it: `"cache\u005fsalt"` is `cache_salt`.
fn named(quoted: &[u8], edits: &[(&str, Edit<'_>)]) -> Option<usize> {
    let inner = quoted.get(1..quoted.len().saturating_sub(1))?;
    if !inner.contains(&b'\\') {
        return edits.iter().position(|(k, _)| k.as_bytes() == inner);
    }
    let key = serde_json::from_slice::<String>(quoted).ok()?;
    edits.iter().position(|(k, _)| *k == key)
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
#[path = "members_tests.rs"]
mod tests;
