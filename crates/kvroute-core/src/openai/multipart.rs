//! The text fields of a `multipart/form-data` body (RFC 7578), as audio endpoints receive
//! them: routing reads the `model` field of a transcription and forwards the bytes as they came.
//! Only what is needed is parsed: the boundary, each part's `Content-Disposition` name, and the
//! value of the fields asked for; file contents are skipped, never copied.

use super::ApiError;

/// The boundary of a `multipart/form-data` content type; `None` for any other type.
pub fn boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        (!v.is_empty() && v.len() <= 70).then(|| v.to_owned())
    })
}

fn malformed(why: &str) -> ApiError {
    ApiError::invalid(format!("the multipart body is malformed: {why}"), None)
}

/// Position of `needle` in `hay` from `from`.
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let first = *needle.first()?;
    let mut i = from;
    while i + needle.len() <= hay.len() {
        let at = hay[i..hay.len() - needle.len() + 1]
            .iter()
            .position(|&b| b == first)?;
        i += at;
        if &hay[i..i + needle.len()] == needle {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The `name` of a part from its header block.
fn part_name(headers: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(headers).ok()?;
    text.split("\r\n").find_map(|line| {
        let (k, v) = line.split_once(':')?;
        if !k.trim().eq_ignore_ascii_case("content-disposition") {
            return None;
        }
        v.split(';').find_map(|p| {
            let (k, v) = p.split_once('=')?;
            if k.trim() != "name" {
                return None;
            }
            let v = v.trim();
            Some(
                v.strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(v)
                    .to_owned(),
            )
        })
    })
}

/// The value of the text field `name` (the last one, when repeated), or `None` when the form
/// has no such field. 400 when the body is not a well-formed form with that `boundary`, or the
/// field is not UTF-8.
pub fn text_field(body: &[u8], boundary: &str, name: &str) -> Result<Option<String>, ApiError> {
    let open = format!("--{boundary}");
    let delimiter = format!("\r\n--{boundary}");
    let Some(start) = find(body, open.as_bytes(), 0) else {
        return Err(malformed("no boundary"));
    };
    let mut at = start + open.len();
    let mut found = None;
    loop {
        if body[at..].starts_with(b"--") {
            return Ok(found);
        }
        if !body[at..].starts_with(b"\r\n") {
            return Err(malformed("a boundary is not followed by a line break"));
        }
        at += 2;
        let Some(headers_end) = find(body, b"\r\n\r\n", at) else {
            return Err(malformed("a part has no end of headers"));
        };
        let part = part_name(&body[at..headers_end]);
        let content = headers_end + 4;
        let Some(end) = find(body, delimiter.as_bytes(), content) else {
            return Err(malformed("a part is not closed by the boundary"));
        };
        if part.as_deref() == Some(name) {
            let value = std::str::from_utf8(&body[content..end])
                .map_err(|_| malformed(&format!("the `{name}` field is not UTF-8")))?;
            found = Some(value.to_owned());
        }
        at = end + delimiter.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(boundary: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n").as_bytes());
        b.extend_from_slice(&[0, 1, 2, b'\r', b'\n', b'-', b'-', 255]);
        b.extend_from_slice(format!("\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--{boundary}--\r\n").as_bytes());
        b
    }

    #[test]
    fn finds_the_model_after_a_binary_file() {
        let ct = "multipart/form-data; boundary=\"XyZ123\"";
        let b = boundary(ct).unwrap();
        assert_eq!(b, "XyZ123");
        let body = form(&b);
        assert_eq!(
            text_field(&body, &b, "model").unwrap().as_deref(),
            Some("whisper")
        );
        assert_eq!(text_field(&body, &b, "language").unwrap(), None);
    }

    #[test]
    fn other_types_and_broken_forms() {
        assert_eq!(boundary("application/json"), None);
        assert_eq!(boundary("multipart/form-data"), None);
        assert!(text_field(b"no boundary here", "b", "model").is_err());
        assert!(
            text_field(
                b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nx",
                "b",
                "model"
            )
            .is_err()
        );
        assert!(text_field(b"--bX", "b", "model").is_err());
    }
}
