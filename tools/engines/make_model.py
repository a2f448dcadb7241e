"""Make a tiny random-weight Llama with a tokenizer built here (no hub): run
with the vLLM venv's python (torch, transformers, tokenizers), one argument:
the directory to write.  Hidden 256 = 4 heads of 64 (vLLM's CPU attention
wants head_dim >= 64), 2 layers; a few MB.

    make_model.py [--hidden N] [--layers N] [--max-positions N] DIR

The options make a larger one of the same shape (heads of 64): the GPU
machine's llama-server holds GBs with one (tools/engines/build-llama-cuda).

The tokenizer is a Llama-2 style BPE with byte fallback (specials, then the
256 byte tokens <0x00>..<0xFF>, then merges learnt from a few sentences): the
shape llama.cpp's convert_hf_to_gguf.py converts as a "llama" vocabulary
without knowing its pre-tokenizer hash, and vLLM loads as a fast tokenizer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM

SPECIALS = ["<unk>", "<s>", "</s>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A unit is started, stopped and restarted by systemd; the server answers health probes.",
    "Hello world! One token at a time, the model writes a reply to the prompt it was given.",
    "0 1 2 3 4 5 6 7 8 9 ten eleven twelve, the numbers and the letters of the alphabet.",
] * 20


def tokenizer_json() -> dict[str, Any]:
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=SPECIALS,
                                                        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    data: dict[str, Any] = json.loads(tok.to_str())
    # Byte tokens right after the specials, as in Llama-2's vocabulary.
    learnt = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in learnt:
        if t not in vocab:
            vocab[t] = len(vocab)
    data["model"]["vocab"] = vocab
    return data


def main(out: Path, hidden: int = 256, layers: int = 2, max_positions: int = 512) -> None:
    out.mkdir(parents=True)
    data = tokenizer_json()
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
        "model_max_length": 512, "clean_up_tokenization_spaces": False,
        "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
    }))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    # Exactly the tokenizer's size: the GGUF's token list must match the embedding.
    vocab_size = len(data["model"]["vocab"])
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64, head_dim=64, max_position_embeddings=max_positions,
        rms_norm_eps=1e-5, rope_theta=10000.0,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="a random-weight Llama and its tokenizer")
    p.add_argument("out", type=Path)
    p.add_argument("--hidden", type=int, default=256, help="hidden size, a multiple of 64")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--max-positions", type=int, default=512,
                   help="the context it says it was trained for (llama-server warns past it)")
    a = p.parse_args()
    if a.hidden % 64:
        p.error("--hidden: a multiple of 64 (heads of 64)")
    main(a.out, a.hidden, a.layers, a.max_positions)
