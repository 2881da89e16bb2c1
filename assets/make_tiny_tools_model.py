"""Build the shipped tiny tool-use model (assets/tiny-tools) and its task: sums of two 4-digit numbers.

Task: "4821+3310" -> "8131". A 2.6 M-parameter model cannot add 4-digit numbers written most-significant digit
first in its head, but it can call the tool `add` (presets/tools/calculator.py) and copy the result. The SFT mix
teaches both behaviours: on each training example the model calls the tool with probability TOOL_P (a coin flip,
not a function of the numbers) and answers directly otherwise; direct targets are the true sums.

Chat template (every character is a token, so it is compact; `tok.chat_template`, exactly):

    {%- if tools %}T:{% for t in tools %}{{ (t.function.name if t.function is defined else t.name) }}
    {%- if not loop.last %},{% endif %}{% endfor %}\\n{% endif %}
    {%- for m in messages %}
      system:    "S:" + content + "\\n"
      user:      "Q:" + content + "\\n"
      assistant: "A:" + content + for each tool call "<tool_call>" + JSON + "</tool_call>", then eos_token
      tool:      "R:" + content + "\\n"
    {%- endfor %}
    {%- if add_generation_prompt %}A:{% endif %}

The tool-call JSON is built in Jinja, not with `tojson` on the whole call, so it is compact and fixed:
`{"name":"add","arguments":{"a":4821,"b":3310}}` (each argument value goes through `tojson`; `arguments` given as a
JSON string is written as is). A call entry may be `{"type":"function","function":{"name","arguments"}}` or a bare
`{"name","arguments"}`. eos_token is `<|endoftext|>`, the token generation stops on (generation_config.eos_token_id).

A tool episode reads
`T:add\\nQ:4821+3310\\nA:<tool_call>{"name":"add","arguments":{"a":4821,"b":3310}}</tool_call><|endoftext|>R:8131\\nA:8131<|endoftext|>`
and a direct answer `T:add\\nQ:4821+3310\\nA:8131<|endoftext|>`. The template satisfies the episode loop's
property (checked by the self-check): render(conversation) == render(prompt, add_generation_prompt) + the model's
first turn (ending in EOS) + suffix, where suffix = render(dummy + tool messages, add_generation_prompt) minus
render(dummy) cut after its last EOS ("R:8131\\nA:"): nothing follows the EOS and no whitespace is trimmed.

Why the numbers are as they are: the model learns the tool call's copy (arguments and result) almost perfectly,
and its first-token choice between "<" (tool call) and a digit settles near TOOL_P = 0.3 on every prompt. Sampled
at temperature 1 it therefore calls the tool on about 30% of prompts, but greedy decoding picks the likelier
branch, a digit, almost always, and its direct 4-digit sums are mostly wrong: greedy held-out accuracy is low
(see ACCURACY.txt). GRPO rewards the episodes that called the tool (nearly always right) over the direct ones
(nearly always wrong); once the tool branch passes 50% at the first token greedy decoding takes it too, so
raising tool use adds tens of points of greedy held-out accuracy. To speed up learning the copy, each batch adds
extra tool episodes whose first token is masked out of the loss, so they teach the copy without moving the
tool-call rate. The model does start to learn direct 4-digit addition (held-out direct accuracy 0.1-0.3 after
1,200 steps, noisy), which would eat the headroom; so training has phases: phase 1 (13 minutes, lr 1e-3, 1,424 steps)
trains everything, phases 2 and 3 (6 minutes at lr 5e-4, 300 steps, then 4 minutes at lr 2e-4, 442 steps, both
--direct-first-only) keep training the copy and the first token's tool-or-not choice but no longer the direct
answers' digits (phase 3 took the sampled tool-episode accuracy from 0.943 to 0.953, forced-call 0.990 to 0.998).
The learning rate decays linearly over each
phase's time budget (to 10%), meant to steady p(tool call), which swung 0.18-0.38 between evaluations at a
constant lr. (The shipped phase 1 ran at a constant lr, before the decay was added; a phase 1 rerun now decays
too, not measured.)

Run (the shipped model, one torch thread, about 25 minutes with the self-checks):

    python assets/make_tiny_tools_model.py --max-minutes 13          # phase 1: assets/tiny-tools/, assets/data/tools_*.jsonl
    python assets/make_tiny_tools_model.py --init assets/tiny-tools --direct-first-only --lr 5e-4 --max-minutes 6
    python assets/make_tiny_tools_model.py --init assets/tiny-tools --direct-first-only --lr 2e-4 --max-minutes 4 \
        --every 100000                                               # phase 3: no early stop, the whole 4 minutes
    python assets/make_tiny_tools_model.py --check                   # only the self-check on the existing model
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import sys
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

HERE = Path(__file__).resolve().parent
SPECIALS = ["<|pad|>", "<|endoftext|>", "<unk>", "<|im_start|>", "<|im_end|>"]
TOOL_P = 0.3  # probability that an SFT example calls the tool

CHAT_TEMPLATE = (
    "{%- if tools %}T:{% for t in tools %}{{ (t.function.name if t.function is defined else t.name) }}"
    "{%- if not loop.last %},{% endif %}{% endfor %}{{ '\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}S:{{ m.content }}{{ '\\n' }}"
    "{%- elif m.role == 'user' %}Q:{{ m.content }}{{ '\\n' }}"
    "{%- elif m.role == 'assistant' %}A:{{ m.content if m.content else '' }}"
    "{%- if m.tool_calls %}{%- for tc in m.tool_calls %}"
    "{%- set f = tc.function if tc.function is defined else tc %}"
    '<tool_call>{"name":"{{ f.name }}","arguments":'
    "{%- if f.arguments is string %}{{ f.arguments }}{%- else %}{{ '{' }}"
    '{%- for k, v in f.arguments.items() %}"{{ k }}":{{ v | tojson }}{%- if not loop.last %},{% endif %}{%- endfor %}'
    "{{ '}' }}{%- endif %}{{ '}' }}</tool_call>"
    "{%- endfor %}{%- endif %}{{ eos_token }}"
    "{%- elif m.role == 'tool' %}R:{{ m.content }}{{ '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}A:{% endif %}"
)

sys.path.insert(0, str(HERE.parent / "presets" / "tools"))
from calculator import add  # noqa: E402  (the shipped tool, so the self-check runs the same code)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer of make_tiny_model.py, plus the chat template."""
    chars = list(string.printable[:95]) + ["\n"]
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|pad|>", eos_token="<|endoftext|>", unk_token="<unk>",
        padding_side="left",
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_splits(seed: int, n_train: int, n_test: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    pairs = []
    while len(pairs) < n_train + n_test:
        p = (rng.randint(1000, 9999), rng.randint(1000, 9999))
        if p not in seen:
            seen.add(p)
            pairs.append(p)
    return pairs[n_test:], pairs[:n_test]


def write_jsonl(path: Path, pairs: list[tuple[int, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for a, b in pairs:
            f.write(json.dumps({"prompt": f"{a}+{b}", "solution": str(a + b)}) + "\n")


# The strings the template renders, written out (the self-check asserts they agree with the template).
def prompt_text(a: int, b: int) -> str:
    return f"T:add\nQ:{a}+{b}\nA:"


def call_text(a: int, b: int) -> str:
    return '<tool_call>{"name":"add","arguments":{"a":' + str(a) + ',"b":' + str(b) + "}}</tool_call>"


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def example(tok, a: int, b: int, tool: bool, mask_first: bool = False, direct_first_only: bool = False) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 on inserted tokens) of one SFT episode."""
    eos = tok.eos_token_id
    seq, lab = [], []

    def put(text_or_ids, train: bool) -> None:
        t = ids(tok, text_or_ids) if isinstance(text_or_ids, str) else text_or_ids
        seq.extend(t)
        lab.extend(t if train else [-100] * len(t))

    put(prompt_text(a, b), False)
    start = len(seq)
    if tool:
        put(ids(tok, call_text(a, b)) + [eos], True)
        put(f"R:{a + b}\nA:", False)
    put(ids(tok, str(a + b)) + [eos], True)
    if mask_first:
        lab[start] = -100
    if direct_first_only and not tool:
        lab[start + 1 :] = [-100] * (len(lab) - start - 1)
    return seq, lab


def collate(tok, batch: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(s) for s, _ in batch)
    input_ids = torch.full((len(batch), width), tok.pad_token_id)
    labels = torch.full((len(batch), width), -100)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (s, lab) in enumerate(batch):
        input_ids[i, : len(s)] = torch.tensor(s)
        labels[i, : len(s)] = torch.tensor(lab)
        attn[i, : len(s)] = 1
    return input_ids, labels, attn


CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def tool_suffix(tok, tool_msgs: list[dict]) -> str:
    """The episode loop's inserted text: render(dummy + tools, gen prompt) minus render(dummy) cut after its last EOS."""
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "dummy"}]
    prefix = tok.apply_chat_template(dummy, tools=[add], tokenize=False)
    full = tok.apply_chat_template(dummy + tool_msgs, tools=[add], tokenize=False, add_generation_prompt=True)
    prefix = prefix[: prefix.rindex(tok.eos_token) + len(tok.eos_token)]
    assert full.startswith(prefix), (prefix, full)
    return full[len(prefix):]


@torch.no_grad()
def generate(model, tok, seqs: list[list[int]], max_new: int, sample: bool, bs: int = 250) -> list[list[int]]:
    """New tokens per sequence, up to and including EOS."""
    outs = []
    for i in range(0, len(seqs), bs):
        chunk = seqs[i : i + bs]
        width = max(map(len, chunk))
        input_ids = torch.full((len(chunk), width), tok.pad_token_id)
        attn = torch.zeros_like(input_ids)
        for j, s in enumerate(chunk):
            input_ids[j, width - len(s):] = torch.tensor(s)
            attn[j, width - len(s):] = 1
        kw = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
        out = model.generate(input_ids=input_ids, attention_mask=attn, max_new_tokens=max_new,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **kw)
        for row in out[:, width:].tolist():
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id) + 1]
            else:
                row = [t for t in row if t != tok.pad_token_id]
            outs.append(row)
    return outs


def parse_call(text: str) -> tuple[int, int] | None:
    m = CALL_RE.search(text)
    if not m:
        return None
    try:
        call = json.loads(m.group(1))
        return int(call["arguments"]["a"]), int(call["arguments"]["b"])
    except (ValueError, KeyError, TypeError):
        return ()  # a call, but a bad one


def episodes(model, tok, pairs: list[tuple[int, int]], sample: bool, force_tool: bool = False) -> dict:
    """A hand-written tool loop: first turn, run `add` on a tool call, insert the result, second turn."""
    model.eval()
    prompts = [ids(tok, prompt_text(a, b)) for a, b in pairs]
    if force_tool:  # start the first turn with the tool-call tag to measure the copy alone
        head = ids(tok, "<tool_call>")
        prompts = [p + head for p in prompts]
    first = generate(model, tok, prompts, 72, sample)
    called, results, second_in = [], [], {}
    for i, toks in enumerate(first):
        text = ("<tool_call>" if force_tool else "") + tok.decode(toks, skip_special_tokens=True)
        args = parse_call(text)
        called.append(args is not None)
        if args is None:
            results.append(text.strip())
            continue
        res = str(add(*args)) if args else json.dumps({"error": "bad tool call"})
        results.append(None)
        second_in[i] = prompts[i] + toks + ids(tok, tool_suffix(tok, [{"role": "tool", "name": "add", "content": res}]))
    keys = list(second_in)
    for i, toks in zip(keys, generate(model, tok, [second_in[k] for k in keys], 8, sample)):
        results[i] = tok.decode(toks, skip_special_tokens=True).strip()
    right = [r == str(a + b) for r, (a, b) in zip(results, pairs)]
    n_call = sum(called)
    model.train()
    return {
        "accuracy": sum(right) / len(pairs),
        "tool_rate": n_call / len(pairs),
        "acc_tool": sum(r for r, c in zip(right, called) if c) / max(n_call, 1),
        "acc_direct": sum(r for r, c in zip(right, called) if not c) / max(len(pairs) - n_call, 1),
        "n_tool": n_call,
    }


@torch.no_grad()
def p_tool(model, tok, pairs: list[tuple[int, int]]) -> float:
    """Mean probability of "<" (a tool call) as the first token of the answer."""
    model.eval()
    seqs = [ids(tok, prompt_text(a, b)) for a, b in pairs]
    input_ids = torch.tensor(seqs)  # all prompts are the same length
    probs = model(input_ids=input_ids).logits[:, -1].softmax(-1)[:, tok.convert_tokens_to_ids("<")]
    model.train()
    return probs.mean().item()


def check_template(tok) -> None:
    """The template renders the strings the SFT data uses, and the episode loop's concatenation property holds."""
    a, b = 4821, 3310
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
    msgs = [{"role": "user", "content": f"{a}+{b}"}]
    prompt = tok.apply_chat_template(msgs, tools=[add], tokenize=False, add_generation_prompt=True)
    assert prompt == prompt_text(a, b), prompt
    tool_msgs = [{"role": "tool", "name": "add", "content": str(a + b)}]
    conv = msgs + [{"role": "assistant", "content": "", "tool_calls": [call]}] + tool_msgs + [
        {"role": "assistant", "content": str(a + b)}]
    full = tok.apply_chat_template(conv, tools=[add], tokenize=False)
    first_turn = call_text(a, b) + tok.eos_token
    suffix = tool_suffix(tok, tool_msgs)
    assert suffix == f"R:{a + b}\nA:", suffix
    want = prompt + first_turn + suffix + str(a + b) + tok.eos_token
    assert full == want, (full, want)
    assert ids(tok, full) == example(tok, a, b, True)[0], "template and SFT tokens differ"
    direct = tok.apply_chat_template(msgs + [{"role": "assistant", "content": str(a + b)}], tools=[add], tokenize=False)
    assert ids(tok, direct) == example(tok, a, b, False)[0]
    call_json = CALL_RE.search(full).group(1)
    assert json.loads(call_json) == {"name": "add", "arguments": {"a": a, "b": b}}, call_json
    bare = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "", "tool_calls": [
        {"name": "add", "arguments": json.dumps({"a": a, "b": b}, separators=(",", ":"))}]}], tools=[add], tokenize=False)
    assert call_text(a, b) in bare, bare
    print("template: ok\n" + full.replace(tok.eos_token, "<EOS>"), flush=True)


def self_check(out: Path, test_pairs: list[tuple[int, int]], seed: int) -> dict:
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    model = Qwen2ForCausalLM.from_pretrained(out)
    assert model.generation_config.eos_token_id == tok.eos_token_id
    check_template(tok)
    torch.manual_seed(seed)
    greedy = episodes(model, tok, test_pairs, sample=False)
    sampled = episodes(model, tok, test_pairs, sample=True)
    forced = episodes(model, tok, test_pairs, sample=False, force_tool=True)
    pt = p_tool(model, tok, test_pairs)
    n = len(test_pairs)
    lines = [
        f"held-out prompts: {n} sums of two 4-digit numbers (assets/data/tools_test.jsonl), tool: add",
        f"greedy accuracy (greedy tool loop): {greedy['accuracy']:.3f}",
        f"greedy tool-call rate: {greedy['tool_rate']:.3f}",
        f"sampled tool-call rate (temperature 1): {sampled['tool_rate']:.3f}",
        f"sampled accuracy (temperature 1): {sampled['accuracy']:.3f}",
        f"accuracy when calling the tool (sampled, {sampled['n_tool']} episodes): {sampled['acc_tool']:.3f}",
        f"accuracy answering directly (sampled, {n - sampled['n_tool']} episodes): {sampled['acc_direct']:.3f}",
        f"accuracy answering directly (greedy): {greedy['acc_direct']:.3f}",
        f"accuracy with a forced tool call (greedy after '<tool_call>'): {forced['accuracy']:.3f}",
        f"mean p(tool call) at the first answer token: {pt:.3f}",
    ]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    (out / "ACCURACY.txt").write_text(text)
    return {"greedy": greedy, "sampled": sampled, "forced": forced, "p_tool": pt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE / "tiny-tools")
    ap.add_argument("--data-out", type=Path, default=HERE / "data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int, default=4000)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--batch", type=int, default=48, help="SFT examples per step (tool with probability TOOL_P)")
    ap.add_argument("--extra-tool", type=int, default=8, help="extra tool episodes per step, first token masked")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-steps", type=int, default=6000)
    ap.add_argument("--max-minutes", type=float, default=14.0)
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--init", type=Path, default=None, help="continue from this model instead of a fresh one")
    ap.add_argument("--direct-first-only", action="store_true",
                    help="train direct answers on their first token only (the tool-or-not choice), not the digits")
    ap.add_argument("--check", action="store_true", help="only run the self-check on the existing model")
    args = ap.parse_args()
    torch.set_num_threads(1)

    train_pairs, test_pairs = make_splits(args.seed, args.n_train, args.n_test)
    if args.check:
        self_check(args.out, test_pairs, args.seed)
        return
    write_jsonl(args.data_out / "tools_train.jsonl", train_pairs)
    write_jsonl(args.data_out / "tools_test.jsonl", test_pairs)

    torch.manual_seed(args.seed)
    tok = build_tokenizer()
    check_template(tok)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=160,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        rope_theta=10000.0,
    )
    model = Qwen2ForCausalLM.from_pretrained(args.init) if args.init else Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    print(f"params: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    rng = random.Random(args.seed)
    monitor = test_pairs[:100]
    start = time.time()
    done = False
    for step in range(1, args.max_steps + 1):
        batch = [example(tok, a, b, rng.random() < TOOL_P, direct_first_only=args.direct_first_only)
                 for a, b in rng.sample(train_pairs, args.batch)]
        batch += [example(tok, a, b, True, mask_first=True) for a, b in rng.sample(train_pairs, args.extra_tool)]
        # two passes by length (direct episodes are short), the loss a token mean over both
        short = [x for x in batch if len(x[0]) < 40]
        long = [x for x in batch if len(x[0]) >= 40]
        n_tok = sum(sum(t != -100 for t in lab) for _, lab in batch)
        total = 0.0
        for part in (short, long):
            if not part:
                continue
            input_ids, labels, attn = collate(tok, part)
            logits = model(input_ids=input_ids, attention_mask=attn).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
            ) / n_tok
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        minutes = (time.time() - start) / 60
        for g in opt.param_groups:  # linear decay over the time budget, to 10%: steadies p(tool call)
            g["lr"] = args.lr * max(0.1, 1 - minutes / args.max_minutes)
        if step % args.every == 0 or minutes > args.max_minutes:
            forced = episodes(model, tok, monitor, sample=False, force_tool=True)
            greedy = episodes(model, tok, monitor, sample=False)
            pt = p_tool(model, tok, monitor)
            print(f"step {step} loss {total:.3f} forced-tool acc {forced['accuracy']:.2f} p(tool) {pt:.2f} "
                  f"greedy acc {greedy['accuracy']:.2f} greedy tool {greedy['tool_rate']:.2f} "
                  f"direct acc {greedy['acc_direct']:.2f} ({minutes * 60:.0f}s)", flush=True)
            done = forced["accuracy"] >= 0.98 and 0.22 <= pt <= 0.38 and greedy["accuracy"] < 0.2
            if done or minutes > args.max_minutes or step == args.max_steps:
                break
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    print(f"saved {args.out} after {step} steps ({'target reached' if done else 'limit reached'})", flush=True)
    self_check(args.out, test_pairs, args.seed)


if __name__ == "__main__":
    main()
