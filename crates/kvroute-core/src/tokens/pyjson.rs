//! Python's `json.dumps` and `repr` for template values.
//!
//! Hugging Face chat templates run under Python's Jinja2, where `tojson` is transformers' own
//! filter (`json.dumps(x, ensure_ascii=False, indent=…, separators=…, sort_keys=…)`) and printing
//! a value uses `str()` (`None`, `True`, `['a', 1]`). minijinja differs in both places: its
//! `tojson` escapes `< > & '` for HTML and prints without spaces, and it prints `none`/`true`.
//! Any byte of difference changes the token ids and therefore every block hash after it, so the
//! router would predict cache hits the engine never has. This file reproduces Python's output.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Options of Python's `json.dumps` that templates use.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    /// `indent`: `None` for one line; otherwise the string repeated per nesting level.
    pub indent: Option<String>,
    /// Separator between items (`", "` by default, `","` when indenting).
    pub item_sep: String,
    /// Separator between a key and its value.
    pub key_sep: String,
    /// `sort_keys`
    pub sort_keys: bool,
    /// `ensure_ascii`: escape every non-ASCII character as `\uXXXX`.
    pub ensure_ascii: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
            ensure_ascii: false,
        }
    }
}

impl DumpOptions {
    /// Reads `indent`, `separators`, `sort_keys` and `ensure_ascii` as transformers' `tojson`
    /// filter accepts them (`ensure_ascii` defaults to false there, unlike `json.dumps`).
    pub fn from_args(indent: Option<Value>, kwargs: &Kwargs) -> Result<Self, Error> {
        let mut opts = DumpOptions::default();
        let indent = match indent {
            Some(v) => Some(v),
            None => kwargs.get::<Option<Value>>("indent")?,
        };
        if let Some(v) = indent.filter(|v| !v.is_none() && !v.is_undefined()) {
            opts.indent = Some(match v.kind() {
                ValueKind::String => v.as_str().unwrap_or_default().to_owned(),
                // Python: `' ' * indent`; a negative count is an empty string.
                ValueKind::Number => " ".repeat(v.as_i64().unwrap_or(0).max(0) as usize),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    ));
                }
            });
            opts.item_sep = ",".into();
        }
        if let Some(seps) = kwargs.get::<Option<Value>>("separators")?
            && !seps.is_none()
        {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    opts.item_sep = a.as_str().unwrap_or_default().to_owned();
                    opts.key_sep = b.as_str().unwrap_or_default().to_owned();
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ));
                }
            }
        }
        if let Some(b) = kwargs.get::<Option<bool>>("sort_keys")? {
            opts.sort_keys = b;
        }
        if let Some(b) = kwargs.get::<Option<bool>>("ensure_ascii")? {
            opts.ensure_ascii = b;
        }
        kwargs.assert_all_used()?;
        Ok(opts)
    }
}

/// The `tojson` filter: `json.dumps(value, ensure_ascii=False, …)`.
pub fn tojson_filter(
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let opts = DumpOptions::from_args(indent, &kwargs)?;
    dumps(value, &opts)
}

/// `json.dumps(value)` with `opts`.
pub fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    dump_value(&mut out, value, opts, 0)?;
    Ok(out)
}

fn newline(out: &mut String, opts: &DumpOptions, level: usize) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn dump_value(out: &mut String, v: &Value, opts: &DumpOptions, level: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v, true),
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, opts, level + 1);
                dump_value(out, item, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in v.try_iter()? {
                let value = v.get_item(&key)?;
                entries.push((json_key(&key)?, value));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, value)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, opts, level + 1);
                write_json_str(out, key, opts.ensure_ascii);
                out.push_str(&opts.key_sep);
                dump_value(out, value, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {other} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

/// Python converts `None`, booleans and numbers used as keys to strings.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None | ValueKind::Undefined => "null".into(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key, true);
            s
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {other}"),
            ));
        }
    })
}

/// A number as Python prints it. `json` spells non-finite floats `NaN`/`Infinity`; `repr`
/// spells them `nan`/`inf`.
fn write_number(out: &mut String, v: &Value, json: bool) {
    if v.is_integer() {
        // Integers (i64, u64, i128) display as plain decimals in minijinja.
        let _ = write!(out, "{v}");
        return;
    }
    match f64::try_from(v.clone()) {
        Ok(f) => write_float(out, f, json),
        Err(_) => {
            let _ = write!(out, "{v}");
        }
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, in positional notation for decimal
/// exponents in `-4..16`, otherwise scientific with a signed two-digit exponent.
pub fn write_float(out: &mut String, f: f64, json: bool) {
    if f.is_nan() {
        out.push_str(if json { "NaN" } else { "nan" });
        return;
    }
    if f.is_infinite() {
        let s = match (json, f > 0.0) {
            (true, true) => "Infinity",
            (true, false) => "-Infinity",
            (false, true) => "inf",
            (false, false) => "-inf",
        };
        out.push_str(s);
        return;
    }
    // Rust's `{:e}` gives the same shortest digits as Python's repr.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let plain = format!("{f}");
        out.push_str(&plain);
        if !plain.contains('.') {
            out.push_str(".0");
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        let _ = write!(out, "{mantissa}e{sign}{:02}", exp.abs());
    }
}

/// A JSON string literal as Python's encoder writes it.
pub fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `str(value)`: what Jinja2 prints for `{{ value }}`.
pub fn write_str(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::String => out.push_str(v.as_str().unwrap_or_default()),
        ValueKind::Undefined => {}
        _ => write_repr(out, v),
    }
}

/// Python's `repr(value)` for the value kinds templates see.
fn write_repr(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, v, false),
        ValueKind::String => write_py_str_literal(out, v.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            if let Ok(iter) = v.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &item);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = v.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &key);
                    out.push_str(": ");
                    write_repr(out, &v.get_item(&key).unwrap_or_default());
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{v}");
        }
    }
}

/// `repr(str)`: single quotes unless the text contains `'` and no `"`.
fn write_py_str_literal(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn d(v: serde_json::Value, opts: &DumpOptions) -> String {
        dumps(&crate::tokens::chat_template::json_value(&v), opts).unwrap()
    }

    #[test]
    fn default_dumps_matches_python() {
        let o = DumpOptions::default();
        // json.dumps({"a": [1, 2.5, None, True], "b": "x<y>&'z' é"}, ensure_ascii=False)
        assert_eq!(
            d(json!({"a": [1, 2.5, null, true], "b": "x<y>&'z' é"}), &o),
            r#"{"a": [1, 2.5, null, true], "b": "x<y>&'z' é"}"#
        );
        assert_eq!(d(json!({}), &o), "{}");
        assert_eq!(d(json!([]), &o), "[]");
        assert_eq!(d(json!("a\"b\\c\n\u{1}"), &o), r#""a\"b\\c\n\u0001""#);
    }

    #[test]
    fn indent_separators_sort_keys() {
        let o = DumpOptions {
            indent: Some("  ".into()),
            item_sep: ",".into(),
            sort_keys: true,
            ..DumpOptions::default()
        };
        assert_eq!(
            d(json!({"b": [1, {}], "a": 1}), &o),
            "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    {}\n  ]\n}"
        );
        let compact = DumpOptions {
            item_sep: ",".into(),
            key_sep: ":".into(),
            ..DumpOptions::default()
        };
        assert_eq!(d(json!({"a": [1, 2]}), &compact), r#"{"a":[1,2]}"#);
    }

    #[test]
    fn ensure_ascii_uses_surrogate_pairs() {
        let o = DumpOptions {
            ensure_ascii: true,
            ..DumpOptions::default()
        };
        assert_eq!(d(json!("é🚀"), &o), r#""\u00e9\ud83d\ude80""#);
    }

    #[test]
    fn floats_print_like_python_repr() {
        let f = |x: f64| {
            let mut s = String::new();
            write_float(&mut s, x, true);
            s
        };
        assert_eq!(f(1.0), "1.0");
        assert_eq!(f(1.5), "1.5");
        assert_eq!(f(-0.0), "-0.0");
        assert_eq!(f(1e16), "1e+16");
        assert_eq!(f(1.5e-5), "1.5e-05");
        assert_eq!(f(0.0001), "0.0001");
        assert_eq!(f(123456789012345678.0), "1.2345678901234568e+17");
        assert_eq!(f(f64::NAN), "NaN");
    }

    #[test]
    fn str_of_values_is_pythonic() {
        let s = |v: serde_json::Value| {
            let mut out = String::new();
            write_str(&mut out, &crate::tokens::chat_template::json_value(&v));
            out
        };
        assert_eq!(s(json!(null)), "None");
        assert_eq!(s(json!(true)), "True");
        assert_eq!(s(json!("plain")), "plain");
        assert_eq!(s(json!(["a", 1, null])), "['a', 1, None]");
        assert_eq!(s(json!({"k": "it's"})), "{'k': \"it's\"}");
    }
}
