"""Build the shipped tiny model and the tiny addition task.

Task: "a+b=" with two 2-digit numbers; the answer is the sum written least-significant
digit first ("47+38=" -> "58", since 85 reversed), then end of text. Written that way a
3 M-parameter transformer can learn addition from scratch in minutes on a CPU.

The script trains a small Qwen2-architecture causal LM (head dim 64, so vLLM can serve it)
with a character tokenizer, and stops as soon as greedy accuracy on the held-out set reaches
the target band, leaving headroom for GRPO. Run:

    python assets/make_tiny_model.py            # writes assets/tiny-add/ and assets/data/
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

HERE = Path(__file__).resolve().parent
SPECIALS = ["<|pad|>", "<|endoftext|>", "<unk>", "<|im_start|>", "<|im_end|>"]


def reversed_sum(a: int, b: int) -> str:
    return str(a + b)[::-1]


def make_splits(seed: int, n_test: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    return pairs[n_test:], pairs[:n_test]


def build_tokenizer() -> PreTrainedTokenizerFast:
    chars = list(string.printable[:95]) + ["\n"]  # printable ASCII incl. space, plus newline
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<|pad|>",
        eos_token="<|endoftext|>",
        unk_token="<unk>",
        padding_side="left",
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tok


def write_jsonl(path: Path, pairs: list[tuple[int, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for a, b in pairs:
            f.write(json.dumps({"prompt": f"{a}+{b}=", "solution": reversed_sum(a, b), "a": a, "b": b}) + "\n")


@torch.no_grad()
def greedy_accuracy(model, tok, pairs: list[tuple[int, int]]) -> float:
    model.eval()
    prompts = [f"{a}+{b}=" for a, b in pairs]
    enc = tok(prompts, return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    model.train()
    return sum(t.strip() == reversed_sum(a, b) for t, (a, b) in zip(texts, pairs)) / len(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE / "tiny-add")
    ap.add_argument("--data-out", type=Path, default=HERE / "data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--n-train-prompts", type=int, default=2000)
    ap.add_argument("--target", type=float, default=0.38, help="stop once greedy held-out accuracy reaches this")
    ap.add_argument("--max-target", type=float, default=0.50, help="never ship a checkpoint above this")
    ap.add_argument("--max-steps", type=int, default=20000)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    train_pairs, test_pairs = make_splits(args.seed, args.n_test)
    write_jsonl(args.data_out / "add_train.jsonl", train_pairs[: args.n_train_prompts])
    write_jsonl(args.data_out / "add_test.jsonl", test_pairs)

    tok = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=64,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        rope_theta=10000.0,
    )
    model = Qwen2ForCausalLM(config)
    print(f"params: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    # Full sequences are "a+b=" (4-5 chars) + answer (2-3 chars) + eos: pad right for teacher forcing.
    texts = [f"{a}+{b}={reversed_sum(a, b)}" for a, b in train_pairs]
    monitor = test_pairs[:200]
    start, best = time.time(), None
    rng = random.Random(args.seed)
    every = 50
    for step in range(1, args.max_steps + 1):
        batch = rng.sample(texts, 128)
        ids = [tok(t)["input_ids"] + [tok.eos_token_id] for t in batch]
        width = max(map(len, ids))
        input_ids = torch.full((len(ids), width), tok.pad_token_id)
        labels = torch.full((len(ids), width), -100)
        for i, seq in enumerate(ids):
            input_ids[i, : len(seq)] = torch.tensor(seq)
            eq = seq.index(tok.convert_tokens_to_ids("="))
            labels[i, eq + 1 : len(seq)] = torch.tensor(seq[eq + 1 :])  # learn only the answer
        loss = model(input_ids=input_ids, attention_mask=(input_ids != tok.pad_token_id).long(), labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % every == 0:
            acc = greedy_accuracy(model, tok, monitor)
            print(f"step {step} loss {loss.item():.3f} acc {acc:.3f} ({time.time() - start:.0f}s)", flush=True)
            if acc > 0.1:
                every = 10  # close to the band: look more often so we do not jump over it
            if acc <= args.max_target and (best is None or acc > best):
                best = acc
                model.save_pretrained(args.out, safe_serialization=True)
                tok.save_pretrained(args.out)
            if acc >= args.target:
                break
    full = greedy_accuracy(Qwen2ForCausalLM.from_pretrained(args.out), tok, test_pairs)
    (args.out / "ACCURACY.txt").write_text(f"greedy held-out accuracy: {full:.3f} on {len(test_pairs)} sums\n")
    print(f"saved {args.out} (greedy held-out accuracy {full:.3f})")


if __name__ == "__main__":
    main()
