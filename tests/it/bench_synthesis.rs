//! Prompt synthesis: determinism, equal ids give equal content, exact prefixes.

use kvroute::workload::synthesis::PromptSynth;
use kvroute::workload::trace::TraceRequest;

fn req(input: u32, ids: &[u64], block_tokens: u32) -> TraceRequest {
    TraceRequest {
        arrival_s: 0.0,
        input_tokens: input,
        output_tokens: 1,
        hash_ids: ids.to_vec(),
        block_tokens,
        session: None,
    }
}

#[test]
fn same_inputs_same_prompt() {
    let a = PromptSynth::default();
    let b = PromptSynth::default();
    let r = req(1200, &[3, 4, 5], 512);
    assert_eq!(a.prompt_tokens(&r), b.prompt_tokens(&r));
    assert_eq!(a.prompt_tokens(&r).len(), 1200);
}

#[test]
fn equal_ids_equal_content_different_ids_differ() {
    let s = PromptSynth::default();
    let x = s.prompt_tokens(&req(1536, &[1, 2, 3], 512));
    let y = s.prompt_tokens(&req(1536, &[1, 2, 9], 512));
    let z = s.prompt_tokens(&req(1536, &[5, 2, 3], 512));
    assert_eq!(x[..1024], y[..1024]);
    assert_ne!(x[1024..], y[1024..]);
    // Sharing starts at the first block: a different first id makes everything differ, even
    // though later ids are equal (block content is keyed by id, not by position).
    assert_ne!(x[..512], z[..512]);
    assert_eq!(x[512..], z[512..]);
    // Different blocks differ from their first token on (no accidental shared prefix).
    let mut first_tokens: Vec<u32> = (0..200).map(|id| s.block(id, 1)[0]).collect();
    first_tokens.sort_unstable();
    first_tokens.dedup();
    assert!(first_tokens.len() > 190, "{}", first_tokens.len());
}

#[test]
fn cut_prompt_is_exact_prefix_of_longer_one() {
    let s = PromptSynth::default();
    let long = s.prompt_tokens(&req(2000, &[10, 11, 12, 13], 512));
    let short = s.prompt_tokens(&req(700, &[10, 11], 512));
    assert_eq!(short.len(), 700);
    assert_eq!(short[..], long[..700]);
}

#[test]
fn padding_fills_to_input_length_and_is_deterministic() {
    let s = PromptSynth::default();
    let r = req(100, &[1], 16);
    let p = s.prompt_tokens(&r);
    assert_eq!(p.len(), 100);
    assert_eq!(p[..16], s.block(1, 16)[..]);
    assert_eq!(p, s.prompt_tokens(&r));
    // Padding belongs to the id chain: another chain pads differently.
    let q = s.prompt_tokens(&req(100, &[2], 16));
    assert_ne!(p[16..], q[16..]);
}

#[test]
fn vocab_range_is_respected() {
    let s = PromptSynth::new(500, 600, 9);
    let p = s.prompt_tokens(&req(5000, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 512));
    assert!(p.iter().all(|&t| (500..600).contains(&t)));
}

#[test]
fn text_prompt_has_one_word_per_token() {
    let s = PromptSynth::default();
    let r = req(40, &[1, 2, 3], 16);
    let text = s.prompt_text(&r);
    assert_eq!(text.split(' ').count(), 40);
    assert_eq!(text, s.prompt_text(&r));
    let tokens = kvroute::tokens::tokenizer::Tokenizer::builtin()
        .encode(&text)
        .unwrap();
    assert_eq!(tokens.len(), 40);
}
