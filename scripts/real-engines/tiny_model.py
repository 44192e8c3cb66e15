"""Builds the tiny random-weight Qwen3 model the real-engine tests serve, and a LoRA adapter.

No weights can be downloaded here, and the tests check prompts, caching and KV events, not text:
a 2-layer Qwen3 with hidden size 64 and the real Qwen3 tokenizer (the project's fixture) runs
the real engine code paths in ~20 MB. Everything random is seeded, so a rebuild gives the same
files. Usage: tiny_model.py TOKENIZER_DIR MODEL_OUT LORA_OUT
"""

import shutil
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

SEED = 20261201
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def build_model(tokenizer_dir: Path, out: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)
    print(f"model: {out} (vocab {config.vocab_size}, {sum(p.numel() for p in model.parameters())} parameters)")


def build_lora(model_dir: Path, out: Path) -> None:
    torch.manual_seed(SEED + 1)
    base = Qwen3ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        # A non-zero B, so the adapter changes the model's output (peft starts B at zero).
        init_lora_weights="gaussian",
    )
    model = get_peft_model(base, lora)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
    model.save_pretrained(out, safe_serialization=True)
    print(f"LoRA adapter: {out} (rank 8 on q/k/v/o)")


def main() -> None:
    tokenizer_dir, model_out, lora_out = (Path(a) for a in sys.argv[1:4])
    build_model(tokenizer_dir, model_out)
    build_lora(model_out, lora_out)


if __name__ == "__main__":
    main()
