"""Build the shipped tiny reward model, assets/tiny-reward/ (a few hundred KB).

A 2-layer Qwen2ForSequenceClassification (one logit) with the tiny-add character tokenizer, trained for
a few seconds on a toy preference: after an addition prompt "a+b=", an answer made of 2-3 digits scores
high and anything else (letters, symbols, empty, long) scores low. It exists to test the reward-model
reward kind end to end (loading, batching, padding, device), not to judge sums. Run:

    python assets/make_tiny_reward_model.py        # writes assets/tiny-reward/
"""

from __future__ import annotations

import argparse
import random
import shutil
import string
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

HERE = Path(__file__).resolve().parent


def sample(rng: random.Random) -> tuple[str, float]:
    """One (text, label) pair: label 1 for a digit answer, 0 otherwise."""
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    prompt = f"{a}+{b}="
    if rng.random() < 0.5:
        return prompt + "".join(rng.choices(string.digits, k=rng.randint(2, 3))), 1.0
    kind = rng.randrange(4)
    if kind == 0:
        junk = "".join(rng.choices(string.ascii_letters, k=rng.randint(1, 6)))
    elif kind == 1:
        junk = "".join(rng.choices(string.punctuation + " ", k=rng.randint(1, 6)))
    elif kind == 2:
        junk = "".join(rng.choices(string.digits, k=rng.randint(5, 8)))
    else:
        junk = ""
    return prompt + junk, 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, default=HERE / "tiny-add")
    ap.add_argument("--out", type=Path, default=HERE / "tiny-reward")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=256, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, num_labels=1,
        rope_theta=10000.0,
    )
    model = Qwen2ForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(1, args.steps + 1):
        texts, labels = zip(*(sample(rng) for _ in range(64)))
        enc = tok(list(texts), return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        logits = model(**enc).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(labels))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 50 == 0:
            acc = ((logits > 0).float() == torch.tensor(labels)).float().mean().item()
            print(f"step {step} loss {loss.item():.3f} batch accuracy {acc:.2f}", flush=True)
    model.eval()
    model.save_pretrained(args.out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(args.tokenizer / name, args.out / name)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"saved {args.out} ({sum(p.numel() for p in model.parameters())} params, {size / 1e3:.0f} KB)")


if __name__ == "__main__":
    main()
