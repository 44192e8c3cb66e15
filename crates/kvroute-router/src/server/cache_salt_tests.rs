//! Tests of `cache_salt`: the bytes out are the bytes in, but for the top-level salt.

use super::*;

fn salted(body: &str, salt: Option<&str>) -> String {
    let out = with_cache_salt(&Bytes::from(body.to_owned()), salt).unwrap();
    String::from_utf8(out.to_vec()).unwrap()
}

#[test]
fn a_salt_is_added_first_and_nothing_else_changes() {
    let body = r#"{ "model":"m", "prompt":[1E2, 12345678901234567890123, -0.0],"x":1,"x":2 }"#;
    assert_eq!(
        salted(body, Some("s")),
        r#"{"cache_salt":"s", "model":"m", "prompt":[1E2, 12345678901234567890123, -0.0],"x":1,"x":2 }"#
    );
    assert_eq!(salted("{}", Some("s")), r#"{"cache_salt":"s"}"#);
    assert_eq!(salted(" { } ", Some("s")), r#" {"cache_salt":"s" } "#);
}

#[test]
fn every_top_level_salt_is_replaced_in_place_and_nested_ones_are_left() {
    let body = r#"{"cache_salt":"a","m":{"cache_salt":"keep"},"cache_salt" : null, "cache\u005fsalt":[1]}"#;
    assert_eq!(
        salted(body, Some("t\"x")),
        r#"{"cache_salt":"t\"x","m":{"cache_salt":"keep"},"cache_salt" : "t\"x", "cache\u005fsalt":"t\"x"}"#
    );
}

#[test]
fn without_a_salt_every_top_level_one_is_removed_with_one_comma() {
    let cases = [
        (r#"{"cache_salt":"a"}"#, r#"{}"#),
        (r#"{ "cache_salt" : "a" }"#, r#"{  }"#),
        (r#"{"cache_salt":"a","model":"m"}"#, r#"{"model":"m"}"#),
        (r#"{"model":"m", "cache_salt":"a"}"#, r#"{"model":"m"}"#),
        (
            r#"{"cache_salt":1,"cache_salt":2,"a":{"cache_salt":3},"cache_salt":4,"b":[5]}"#,
            r#"{"a":{"cache_salt":3},"b":[5]}"#,
        ),
        (r#"{"a":"}","cache_salt":"\\","b":1}"#, r#"{"a":"}","b":1}"#),
        (r#"{"cache_salt":1, "cache_salt":2}"#, r#"{}"#),
    ];
    for (body, want) in cases {
        let got = salted(body, None);
        assert_eq!(got, want, "{body}");
        let v: serde_json::Value = serde_json::from_str(&got).unwrap();
        assert!(v.get("cache_salt").is_none(), "{got}");
    }
}

#[test]
fn unchanged_bodies_are_the_same_bytes() {
    let body = Bytes::from_static(br#"{"model":"m","x":{"cache_salt":"nested"}}"#);
    let out = with_cache_salt(&body, None).unwrap();
    assert_eq!(out.as_ptr(), body.as_ptr(), "not copied");
}

#[test]
fn what_is_not_an_object_is_refused_not_guessed() {
    for body in [
        "[1]",
        "\"x\"",
        "",
        "{",
        "{\"a\"",
        "{\"a\":",
        "{\"a\":1",
        "{\"a\":1,}",
        "{1:2}",
    ] {
        assert!(
            with_cache_salt(&Bytes::from(body), Some("s")).is_err(),
            "{body}"
        );
    }
}
