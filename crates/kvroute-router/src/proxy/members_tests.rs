//! Tests of `members`: several keys at once, replacing only what is there, and reading.

use super::*;

fn edited(body: &str, edits: &[(&str, Edit<'_>)]) -> String {
    let out = edit(&Bytes::from(body.to_owned()), edits).unwrap();
    let text = String::from_utf8(out.to_vec()).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    text
}

#[test]
fn several_keys_are_set_replaced_and_removed_in_one_pass() {
    let body = r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":99,"n":12345678901234567890123,"t":1E2}"#;
    let edits = [
        (
            "kv_transfer_params",
            Edit::Set(br#"{"do_remote_decode":true}"#),
        ),
        ("stream", Edit::Set(b"false")),
        ("stream_options", Edit::Remove),
        ("max_tokens", Edit::Set(b"1")),
        ("max_completion_tokens", Edit::Replace(b"1")),
        ("min_tokens", Edit::Remove),
    ];
    assert_eq!(
        edited(body, &edits),
        r#"{"kv_transfer_params":{"do_remote_decode":true},"model":"m","stream":false,"max_tokens":1,"n":12345678901234567890123,"t":1E2}"#
    );
    // Present, `Replace` replaces (every duplicate too).
    assert_eq!(
        edited(
            r#"{"max_completion_tokens":5,"x":1,"max_completion_tokens":6}"#,
            &[("max_completion_tokens", Edit::Replace(b"1"))]
        ),
        r#"{"max_completion_tokens":1,"x":1,"max_completion_tokens":1}"#
    );
}

#[test]
fn members_added_to_an_object_whose_members_all_go_leave_no_dangling_comma() {
    assert_eq!(
        edited(
            r#"{"a":1,"b":2}"#,
            &[
                ("a", Edit::Remove),
                ("b", Edit::Remove),
                ("c", Edit::Set(b"3")),
                ("d", Edit::Set(b"4"))
            ]
        ),
        r#"{"c":3,"d":4}"#
    );
    assert_eq!(
        edited(
            r#"{"a":1,"b":2,"c":0}"#,
            &[("a", Edit::Remove), ("c", Edit::Set(b"3"))]
        ),
        r#"{"b":2,"c":3}"#
    );
    assert_eq!(
        edited(
            r#"{"a":1,"b":2,"c":0}"#,
            &[("b", Edit::Remove), ("c", Edit::Remove)]
        ),
        r#"{"a":1}"#
    );
    assert_eq!(edited("{}", &[("a", Edit::Remove)]), "{}");
    assert_eq!(edited("{}", &[("a", Edit::Replace(b"1"))]), "{}");
}

/// Whether `body` has a top-level member named `key`: removing it changes the bytes.
fn has_member(body: &'static [u8], key: &str) -> Result<bool, NotAnObject> {
    let body = Bytes::from_static(body);
    Ok(edit(&body, &[(key, Edit::Remove)])? != body)
}

#[test]
fn keys_are_read_as_json_reads_them_and_only_at_the_top() {
    let body = br#"{"kv_transfer_params":{"x":1}}"#;
    assert_eq!(has_member(body, "kv_transfer_params"), Ok(true));
    assert_eq!(
        has_member(br#"{"kv\u005ftransfer_params":1}"#, "kv_transfer_params"),
        Ok(true)
    );
    assert_eq!(
        has_member(br#"{"prompt":"kv_transfer_params"}"#, "kv_transfer_params"),
        Ok(false)
    );
    assert_eq!(
        has_member(br#"{"a":{"kv_transfer_params":1}}"#, "kv_transfer_params"),
        Ok(false)
    );
    assert!(has_member(b"[1]", "a").is_err());
}
