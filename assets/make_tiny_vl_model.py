"""Build the shipped tiny vision-language model and the tiny object-counting task.

Task (CLEVR-like, rendered with PIL): a 112x112 picture holds 1..5 coloured shapes (circle, square,
triangle; red, green, blue, yellow, purple) on a grey background, at most one per 28x28 cell so that a
model this small can learn to see them in minutes, and the question is
"How many objects are there?". The answer is R1-style, a short thought and the count in tags:

    <think>3 objects</think><answer>3</answer>

(Listing the objects one by one before counting, as large models learn to, is beyond a 4-layer model
trained for minutes; the `colours` column keeps that list in reading order for rewards that want it.)

The model is a Qwen2-VL (vision tower 2 blocks x 64 wide; language model 4 layers x 128, head dim 64,
M-RoPE sections 8/12/12) with a character tokenizer and a Qwen2-VL chat template with image
placeholders, saved with transformers so AutoProcessor / AutoModelForImageTextToText load it. A
112x112 image is 8x8 patches of 14 px, merged 2x2 into 16 image tokens.

Partial competence, by construction. Supervised training sees freshly rendered scenes (never the shipped
sets) whose labels are right for 1-2 objects but, for 3 or more, one short with probability 0.7
(`--undercount`): the model learns to see the shapes yet to report crowded scenes one short. Greedily it
answers 1-2 right and 3-5 mostly wrong (held-out accuracy about 0.4), while sampling still gives the right
count about 0.3 of the time: a policy error that a verifiable counting reward can correct, as GRPO
corrects a real model that perceives more than it reports. Training runs a fixed number of steps with a
cosine decay to a small learning rate and ships the last step (no selection on an evaluation, so no lucky
checkpoint); fresh validation scenes, not the shipped test set, are only logged. `--report-only` evaluates
a saved model on the shipped test set and the validation scenes, trains a copy a little further at the final
learning rate to show the accuracy is flat there, and writes ACCURACY.txt. Run (about 0.65 CPU-seconds a step
with one thread, so some 17 minutes on a quiet machine; 37 minutes on a busy shared 2-core one):

    PYTHONPATH=. OMP_NUM_THREADS=1 python assets/make_tiny_vl_model.py   # writes assets/tiny-vl/ and assets/data/count_*
    PYTHONPATH=. OMP_NUM_THREADS=1 python assets/make_tiny_vl_model.py --report-only   # re-measure ACCURACY.txt
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import string
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image, ImageDraw
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

from backend.multimodal import VisionProcessor

HERE = Path(__file__).resolve().parent
SIZE = 112
CELL = 28  # pixels per image token (14 px patches merged 2x2)
CELLS = SIZE // CELL
QUESTION = "How many objects are there?"
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 230), "yellow": (235, 210, 40),
           "purple": (150, 60, 200)}
SHAPES = ("circle", "square", "triangle")
SPECIALS = ["<|pad|>", "<|endoftext|>", "<unk>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]
TAGS = ["<think>", "</think>", "<answer>", "</answer>"]  # one token each (normal tokens: they decode as text)
# Qwen2-VL's template, reduced: string content, or a list of {"type": "image"|"video"|"text"} parts.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class Scene:
    objects: list[tuple[str, str, int, int, int]]  # colour, shape, x, y, radius

    def in_reading_order(self) -> list[tuple[str, str, int, int, int]]:
        """Top row first, left to right: the order of the image tokens, one per 28x28 cell."""
        return sorted(self.objects, key=lambda o: (o[3] // CELL, o[2] // CELL))


def answer_text(n: int) -> str:
    """The R1-style target: a short thought and the count in tags."""
    return f"<think>{n} object{'s' if n > 1 else ''}</think><answer>{n}</answer>"


def random_scene(rng: random.Random, max_objects: int = 5) -> Scene:
    """1..max_objects shapes, at most one per 28x28 cell of a 4x4 grid (a cell is what one image token sees
    after the 2x2 patch merge), jittered inside its cell."""
    objs: list[tuple[str, str, int, int, int]] = []
    for c in rng.sample(range(CELLS * CELLS), rng.randint(1, max_objects)):
        r = rng.randint(7, 11)
        cx, cy = (c % CELLS) * CELL, (c // CELLS) * CELL
        objs.append((rng.choice(list(COLOURS)), rng.choice(SHAPES), rng.randint(cx + r + 1, cx + CELL - r - 2),
                     rng.randint(cy + r + 1, cy + CELL - r - 2), r))
    return Scene(objs)


def render(scene: Scene) -> Image.Image:
    img = Image.new("RGB", (SIZE, SIZE), (128, 128, 128))
    d = ImageDraw.Draw(img)
    for colour, shape, x, y, r in scene.objects:
        fill = COLOURS[colour]
        if shape == "circle":
            d.ellipse((x - r, y - r, x + r, y + r), fill=fill)
        elif shape == "square":
            d.rectangle((x - r, y - r, x + r, y + r), fill=fill)
        else:
            d.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
    return img


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in list(string.printable[:95]) + ["\n"]:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|pad|>", eos_token="<|im_end|>", unk_token="<unk>",
                                  padding_side="left")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[3:]})
    tok.add_tokens(TAGS)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_processor() -> VisionProcessor:
    """The trainer's own processor (backend.multimodal), so the model learns exactly the prompts GRPO shows it."""
    # every picture is resized to exactly 112x112 (8x8 patches -> 16 image tokens)
    images = Qwen2VLImageProcessorPil(min_pixels=SIZE * SIZE, max_pixels=SIZE * SIZE)
    return VisionProcessor(build_tokenizer(), images)


def build_model(tok: PreTrainedTokenizerFast) -> Qwen2VLForConditionalGeneration:
    ids = tok.convert_tokens_to_ids
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]},
                         bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(depth=2, embed_dim=64, hidden_size=128, num_heads=4, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    return Qwen2VLForConditionalGeneration(config)




def write_split(out_dir: Path, name: str, scenes: list[Scene]) -> Path:
    """Images under data/<name>/NNNN.png and a JSONL whose `image` column holds paths relative to the
    JSONL file's folder's parent (assets/), as the trainer resolves them against the project root."""
    img_dir = out_dir / name
    img_dir.mkdir(parents=True, exist_ok=True)
    jsonl = out_dir / f"{name}.jsonl"
    with jsonl.open("w") as f:
        for i, s in enumerate(scenes):
            p = img_dir / f"{i:04d}.png"
            render(s).save(p, optimize=True)
            f.write(json.dumps({"image": str(p.relative_to(HERE.parent)), "problem": QUESTION,
                                "solution": f"<answer>{len(s.objects)}</answer>", "count": len(s.objects),
                                "colours": [c for c, *_ in s.in_reading_order()]}) + "\n")
    return jsonl


def encode_batch(proc: VisionProcessor, scenes: list[Scene], answers: list[str] | None) -> dict[str, torch.Tensor]:
    """Model inputs for a batch: prompts (plus answers, right padded, for teacher forcing; left padded to
    generate), the images' pixel values and grids, and token types for M-RoPE."""
    tok = proc.tokenizer
    encs = [proc.encode(proc.messages(QUESTION, 1), [render(s)]) for s in scenes]
    with_answer = answers is not None
    seqs = [e.ids + (tok(a + "<|im_end|>", add_special_tokens=False)["input_ids"] if with_answer else [])
            for e, a in zip(encs, answers or [""] * len(scenes))]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(0, len(s)) if with_answer else slice(width - len(s), width)
        ids[i, sl], mask[i, sl] = torch.tensor(s), 1
    types = (ids == proc.image_token_id).int()
    return {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": types,
            "pixel_values": torch.cat([e.media["pixel_values"] for e in encs]),
            "image_grid_thw": torch.cat([e.media["image_grid_thw"] for e in encs])}


def sft_label(scene: Scene, rng: random.Random, undercount: float, undercount_from: int) -> str:
    """The supervised answer: the true count, except that scenes of `undercount_from` or more objects are
    labelled one short with probability `undercount` (a systematic, learnable bias; see the module docstring)."""
    n = len(scene.objects)
    if n >= undercount_from and rng.random() < undercount:
        n -= 1
    return answer_text(n)


def lr_at(step: int, steps: int, peak: float, final: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay from `peak` to `final` at the last step."""
    if step <= warmup:
        return peak * step / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return final + (peak - final) * 0.5 * (1 + math.cos(math.pi * t))


@torch.no_grad()
def answer_table(model, proc, scenes: list[Scene], batch: int = 100) -> dict[int, list[int]]:
    """Greedy answers per true count: {true count: [answers given, -1 when unparseable]}."""
    model.eval()
    table: dict[int, list[int]] = {}
    for i in range(0, len(scenes), batch):
        chunk = scenes[i:i + batch]
        enc = encode_batch(proc, chunk, None)
        out = model.generate(**enc, max_new_tokens=48, do_sample=False, pad_token_id=proc.tokenizer.pad_token_id,
                             eos_token_id=proc.tokenizer.eos_token_id)
        texts = proc.tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for t, s in zip(texts, chunk):
            m = re.search(r"<answer>(\d+)</answer>", t)
            table.setdefault(len(s.objects), []).append(int(m.group(1)) if m else -1)
    model.train()
    return table


def describe(table: dict[int, list[int]]) -> str:
    total = sum(len(v) for v in table.values())
    right = sum(a == n for n, v in table.items() for a in v)
    per = " ".join(f"{n}:{sum(a == n for a in v) / len(v):.2f}/{sum(a == n - 1 for a in v) / len(v):.2f}"
                   for n, v in sorted(table.items()))
    return f"acc {right / total:.3f} (per count right/one-short {per})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE / "tiny-vl")
    ap.add_argument("--data-out", type=Path, default=HERE / "data", help="where the shipped scenes go")
    ap.add_argument("--no-data", action="store_true", help="do not (re)write the shipped scenes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int, default=400, help="GRPO training prompts shipped")
    ap.add_argument("--n-test", type=int, default=200, help="held-out prompts shipped")
    ap.add_argument("--n-val", type=int, default=200, help="fresh validation scenes for the log (not the shipped test set)")
    ap.add_argument("--steps", type=int, default=1500, help="supervised steps (fixed: no selection on an evaluation)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    ap.add_argument("--final-lr", type=float, default=2e-5, help="learning rate at the last step (cosine decay)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--undercount", type=float, default=0.7, help="probability a scene of many objects is labelled one short")
    ap.add_argument("--undercount-from", type=int, default=3, help="scenes with at least this many objects may be undercounted")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--stable-steps", type=int, default=100, help="report: supervised steps at the final lr that must leave accuracy flat")
    ap.add_argument("--report-only", action="store_true", help="only measure the model in --out and write its ACCURACY.txt")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    test = [random_scene(rng) for _ in range(args.n_test)]
    train = [random_scene(rng) for _ in range(args.n_train)]
    if not (args.no_data or args.report_only):
        write_split(args.data_out, "count_train", train)
        write_split(args.data_out, "count_test", test)
    # supervised scenes and the validation scenes come from their own stream: never the shipped sets
    sft_rng = random.Random(args.seed + 1)
    val = [random_scene(sft_rng) for _ in range(args.n_val)]

    proc = build_processor()
    if args.report_only:
        report(args, proc, test, val, sft_rng)
        return
    model = build_model(proc.tokenizer)
    print(f"params: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M", flush=True)
    start = time.time()
    train_sft(model, proc, args, sft_rng, val, args.steps, args.lr, args.final_lr, args.warmup)
    model.save_pretrained(args.out, safe_serialization=True)
    proc.tokenizer.save_pretrained(args.out)
    proc.image_processor.save_pretrained(args.out)
    made = f"supervised training took {(time.time() - start) / 60:.0f} min wall, {time.process_time() / 60:.0f} CPU-min"
    print(f"saved {args.out}; {made}", flush=True)
    report(args, proc, test, val, sft_rng, made)


def train_sft(model, proc: VisionProcessor, args: argparse.Namespace, sft_rng: random.Random, val: list[Scene],
              steps: int, lr: float, final_lr: float, warmup: int) -> None:
    """Teacher-forced training on fresh scenes with (biased) labels, cosine decay from lr to final_lr."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    prompt_len = len(proc.encode(proc.messages(QUESTION, 1), [render(val[0])]).ids)
    start = time.time()
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, final_lr, warmup)
        scenes = [random_scene(sft_rng) for _ in range(args.batch)]
        answers = [sft_label(s, sft_rng, args.undercount, args.undercount_from) for s in scenes]
        enc = encode_batch(proc, scenes, answers)
        labels = enc["input_ids"].clone()
        labels[:, :prompt_len] = -100  # learn only the answer
        labels[enc["attention_mask"] == 0] = -100
        loss = model(**enc, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f} lr {opt.param_groups[0]['lr']:.2e} ({time.time() - start:.0f}s)", flush=True)
        if step % args.eval_every == 0 or step == steps:
            print(f"step {step} validation {describe(answer_table(model, proc, val))} ({time.time() - start:.0f}s)", flush=True)


def report(args: argparse.Namespace, proc: VisionProcessor, test: list[Scene], val: list[Scene], sft_rng: random.Random,
           made: str = "") -> None:
    """Measure the saved model (held-out test set, validation scenes, and after --stable-steps more steps at the
    final learning rate) and write ACCURACY.txt."""
    model = Qwen2VLForConditionalGeneration.from_pretrained(args.out)
    size = (args.out / "model.safetensors").stat().st_size / 2**20
    lines = [f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, model.safetensors {size:.1f} MiB",
             f"made by: assets/make_tiny_vl_model.py --steps {args.steps} --batch {args.batch} --lr {args.lr} --final-lr "
             f"{args.final_lr} --undercount {args.undercount} --undercount-from {args.undercount_from} --seed {args.seed}",
             f"greedy held-out counting accuracy (assets/data/count_test.jsonl, {len(test)} scenes): "
             f"{describe(answer_table(model, proc, test))}",
             f"greedy validation accuracy ({len(val)} fresh scenes): {describe(answer_table(model, proc, val))}"]
    if args.stable_steps:
        train_sft(model, proc, args, sft_rng, val, args.stable_steps, args.final_lr, args.final_lr, 1)
        lines.append(f"after {args.stable_steps} more supervised steps at lr {args.final_lr}: validation "
                     f"{describe(answer_table(model, proc, val))}")
    lines += [made] if made else []
    lines.append("per count right/one-short: the share of scenes of that many objects answered right / one short")
    (args.out / "ACCURACY.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)

if __name__ == "__main__":
    main()
