//! The byte-level BPE fast path (`tokens::byte_bpe`) against `tokenizers` itself on the real
//! Qwen3 tokenizer: it is taken for Qwen3, and gives the same ids on random text drawn from
//! every kind of character the split pattern treats differently.

use kvroute::tokens::Tokenizer;
use kvroute::tokens::byte_bpe::ByteBpe;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::qwen3;

fn hf() -> &'static tokenizers::Tokenizer {
    match qwen3().tokenizer() {
        Tokenizer::Hf(t) => t,
        Tokenizer::Builtin => unreachable!("qwen3 is a Hugging Face tokenizer"),
    }
}

/// Characters from every class the pattern separates: letters of several scripts and cases,
/// digits (also non-ASCII), apostrophes, punctuation, symbols, every kind of whitespace and line
/// break, combining marks, emoji with joiners.
const ALPHABET: &[&str] = &[
    "a",
    "Z",
    "é",
    "ß",
    "Ω",
    "ж",
    "日",
    "本",
    "の",
    "한",
    "ا",
    "ह",
    "0",
    "7",
    "٣",
    "½",
    "'",
    "’",
    "s",
    "t",
    "re",
    "ve",
    "m",
    "ll",
    "d",
    "S",
    "LL",
    ".",
    ",",
    "!",
    "?",
    "-",
    "_",
    "(",
    ")",
    "{",
    "\"",
    "#",
    "=",
    "*",
    "/",
    "\\",
    "€",
    "©",
    "🚀",
    "👩\u{200d}💻",
    "\u{301}",
    " ",
    " ",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "\u{a0}",
    "\u{3000}",
    "\u{2003}",
    "\u{85}",
    "\u{b}",
    "\u{c}",
    "\u{200b}",
    "the",
    " the",
    "ing",
    "Hello",
    "123456",
];

#[test]
fn qwen3_takes_the_fast_path() {
    assert!(qwen3().fast_path(), "the probe refused the fast path");
}

#[test]
fn random_text_encodes_as_tokenizers_encodes_it() {
    let fast = ByteBpe::for_tokenizer(hf()).expect("fast path");
    let mut rng = StdRng::seed_from_u64(0xb9e);
    let mut answered = 0;
    for round in 0..3_000 {
        let len = rng.random_range(0..60);
        let text: String = (0..len)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
            .collect();
        let want = hf()
            .encode_fast(text.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        if let Some(got) = fast.encode(&text) {
            assert_eq!(got, want, "round {round}: {text:?}");
            answered += 1;
        }
    }
    // Only text NFC could change goes to tokenizers (the combining accent in the alphabet).
    assert!(
        answered > 1_000,
        "the fast path answered only {answered} of 3,000"
    );
}

#[test]
fn long_runs_are_left_to_tokenizers() {
    let fast = ByteBpe::for_tokenizer(hf()).expect("fast path");
    assert_eq!(fast.encode(&"=".repeat(1_000)), None);
    let spaced = format!("a{}b", " ".repeat(100));
    let want = hf()
        .encode_fast(spaced.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(fast.encode(&spaced), Some(want));
}

#[test]
fn case_folding_and_unusual_spaces_agree() {
    let fast = ByteBpe::for_tokenizer(hf()).expect("fast path");
    for text in [
        "it'ſ",
        "IT'S",
        "x'Ll",
        "we'VE",
        "a'ſ",
        "\u{2028}a",
        " \u{a0}b",
        "a\u{3000}\u{3000}b",
        "a \u{2029}\u{2029} b",
        "x\u{85}\u{85}y",
        "  \u{feff}z",
        "1\u{1680}\u{1680}2",
    ] {
        let want = hf().encode_fast(text, false).unwrap().get_ids().to_vec();
        assert_eq!(fast.encode(text), Some(want), "{text:?}");
    }
}
