"""Data sources: every supported format, sample counts, mixing by seed, resumable prompt order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.checks import check_spec
from backend.data import DataError, PromptSampler, load_rows, render_prompt
from backend.spec import DataSection, load_spec

ROOT = Path(__file__).resolve().parent.parent
ROWS = [{"prompt": f"{i}+1=", "solution": str(i + 1)[::-1]} for i in range(10)]


@pytest.fixture()
def sources(tmp_path: Path) -> dict[str, Path]:
    import pandas as pd
    from datasets import Dataset

    out = {}
    out["jsonl"] = tmp_path / "a.jsonl"
    out["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out["json"] = tmp_path / "b.json"
    out["json"].write_text(json.dumps(ROWS))
    out["csv"] = tmp_path / "c.csv"
    pd.DataFrame(ROWS).to_csv(out["csv"], index=False)
    out["parquet"] = tmp_path / "d.parquet"
    pd.DataFrame(ROWS).to_parquet(out["parquet"])
    out["dir"] = tmp_path / "saved"
    Dataset.from_list(ROWS).save_to_disk(str(out["dir"]))
    return out


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet", "dir"])
def test_each_format_loads(sources: dict[str, Path], kind: str) -> None:
    rows = load_rows([str(sources[kind])], DataSection(), 0, ROOT)
    assert sorted(r["prompt"] for r in rows) == sorted(r["prompt"] for r in ROWS)
    assert {str(r["solution"]) for r in rows} == {r["solution"] for r in ROWS}


def test_sample_counts_and_mixing(sources: dict[str, Path]) -> None:
    mixed = load_rows([f"{sources['jsonl']}#3", f"{sources['parquet']}#25"], DataSection(), 0, ROOT)
    assert len(mixed) == 28  # 25 > 10 rows: the source repeats
    again = load_rows([f"{sources['jsonl']}#3", f"{sources['parquet']}#25"], DataSection(), 0, ROOT)
    other = load_rows([f"{sources['jsonl']}#3", f"{sources['parquet']}#25"], DataSection(), 1, ROOT)
    assert [r["prompt"] for r in mixed] == [r["prompt"] for r in again]  # same seed, same order
    assert [r["prompt"] for r in mixed] != [r["prompt"] for r in other]


def test_limit_and_column_mapping(tmp_path: Path) -> None:
    p = tmp_path / "q.jsonl"
    p.write_text("".join(json.dumps({"question": f"q{i}", "answer": i}) + "\n" for i in range(20)))
    data = DataSection(prompt_column="question", solution_column="answer", limit=5)
    rows = load_rows([str(p)], data, 0, ROOT)
    assert len(rows) == 5 and all("solution" in r and "answer" not in r for r in rows)


def test_missing_column_is_reported(sources: dict[str, Path]) -> None:
    with pytest.raises(DataError, match="question"):
        load_rows([str(sources["csv"])], DataSection(prompt_column="question"), 0, ROOT)


def test_prompt_template_and_system_prompt() -> None:
    row = {"nums": [1, 2, 3], "target": 6}
    assert render_prompt(row, DataSection(prompt_template="Make {target} from {nums}."), None) == "Make 6 from [1, 2, 3]."
    assert render_prompt({"prompt": "1+1="}, DataSection(system_prompt="Add."), None) == "Add.\n1+1="


def test_template_column_checked_before_launch(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "presets/tiny-cpu.yaml", ["data.prompt_template=Solve {question}"])
    issues = check_spec(spec, ROOT)
    assert any(i.field == "data.prompt_template" and "'question'" in i.message for i in issues)


def test_chat_messages_need_a_template() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / "assets/tiny-add")
    with pytest.raises(DataError, match="chat template"):
        render_prompt({"prompt": [{"role": "user", "content": "hi"}]}, DataSection(), tok)


def test_prompt_sampler_resumes_exactly() -> None:
    a = PromptSampler(7, seed=3)
    first = a.take(5)
    state = a.state_dict()
    rest = a.take(12)
    b = PromptSampler(7, seed=3)
    b.load_state_dict(state)
    assert b.take(12) == rest
    assert sorted(first + rest[:2]) == list(range(7))  # one epoch covers every row once


def test_prompt_sampler_passes_over_solved_rows_and_resumes_exactly() -> None:
    """skip_solved: rows marked solved are passed over with that probability, rows marked unsolved (all wrong or
    mixed) never; the draws are a function of (seed, epoch, row), so a resumed sampler takes the same prompts."""
    plain, skipping = PromptSampler(20, seed=5), PromptSampler(20, seed=5, skip_solved=0.9)
    for row in range(20):
        skipping.mark(row, solved=row < 10)
        plain.mark(row, solved=row < 10)  # kept only when skipping is on
    assert plain.solved == set() and skipping.solved == set(range(10))
    taken = skipping.take(60)  # several epochs
    unsolved = [row for row in taken if row >= 10]
    counts = [unsolved.count(row) for row in range(10, 20)]
    assert min(counts) >= 4 and max(counts) - min(counts) <= 1  # never skipped: once per epoch, like the plain order
    assert len(taken) - len(unsolved) < 15 and skipping.skipped > 0  # about one solved row in ten is taken
    state = skipping.state_dict()
    assert state["solved"] == list(range(10))
    rest = skipping.take(30)
    again = PromptSampler(20, seed=5, skip_solved=0.9)
    again.load_state_dict(state)
    assert again.take(30) == rest
    skipping.mark(3, solved=False)  # a solved row that failed again is taken every time
    assert 3 not in skipping.solved


def _template_tokenizer():
    """The tiny model's tokenizer with a chat template that reads an extra argument, as Qwen3's reads
    enable_thinking."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / "assets/tiny-tools")
    tok.chat_template = ("{% for m in messages %}Q:{{ m.content }}{% endfor %}"
                         "{% if enable_thinking is defined and not enable_thinking %}N{% endif %}A:")
    return tok


def test_chat_template_kwargs_reach_the_template() -> None:
    tok = _template_tokenizer()
    row = {"prompt": "1+1="}
    assert render_prompt(row, DataSection(), tok) == "Q:1+1=A:"
    assert render_prompt(row, DataSection(chat_template_kwargs={"enable_thinking": False}), tok) == "Q:1+1=NA:"


def test_long_prompts_are_cut_from_the_left_or_dropped() -> None:
    from backend.data import drop_long_prompts, prompt_tokens

    tok = _template_tokenizer()
    long_row, short_row = {"prompt": "1+2+3+4+5+6+7+8+9+1+2+3+4+5+6+7+8+9="}, {"prompt": "1+1="}
    n = prompt_tokens(long_row, DataSection(), tok)
    assert n > 16 >= prompt_tokens(short_row, DataSection(), tok)
    left = DataSection(max_prompt_tokens=16, prompt_truncation="left")
    cut = render_prompt(long_row, left, tok)
    whole = render_prompt(long_row, DataSection(), tok)
    assert whole.endswith(cut) and len(cut) < len(whole)  # the end of the prompt, where the question is, stays
    assert len(tok(cut, add_special_tokens=False)["input_ids"]) == 16
    assert render_prompt(short_row, left, tok) == render_prompt(short_row, DataSection(), tok)
    delete = DataSection(max_prompt_tokens=16, prompt_truncation="delete")
    assert drop_long_prompts([long_row, short_row], delete, tok) == [short_row]
    assert drop_long_prompts([long_row, short_row], DataSection(max_prompt_tokens=16), tok) == [long_row, short_row]
    with pytest.raises(DataError, match="dropped them all"):
        drop_long_prompts([long_row], delete, tok)


def test_the_length_check_refuses_only_when_asked_to(tmp_path: Path) -> None:
    src = tmp_path / "long.jsonl"
    src.write_text(json.dumps({"prompt": "1+2+" * 40 + "1=", "solution": "1"}) + "\n")
    base = ["model.name_or_path=assets/tiny-add", f"data.sources=[{src}]", "data.max_prompt_tokens=32"]
    refuse = load_spec(ROOT / "presets/tiny-cpu.yaml", base)
    assert any(i.field == "data.max_prompt_tokens" for i in check_spec(refuse, ROOT))
    for how in ("left", "delete"):
        spec = load_spec(ROOT / "presets/tiny-cpu.yaml", [*base, f"data.prompt_truncation={how}"])
        assert not any(i.field == "data.max_prompt_tokens" for i in check_spec(spec, ROOT))


def test_a_hub_subset_loads_as_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    from backend.data import is_hub_dataset, load_source, split_subset

    assert split_subset("openai/gsm8k:main") == ("openai/gsm8k", "main")
    assert split_subset("openai/gsm8k") == ("openai/gsm8k", None)
    assert is_hub_dataset("openai/gsm8k:main", ROOT) and not is_hub_dataset("assets/data:x", ROOT)
    asked = []

    def fake_load(name, subset=None, split=None):  # the hub cannot be reached here: record what is asked
        asked.append((name, subset, split))
        return datasets.Dataset.from_list([{"prompt": "1+1=", "solution": "2"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    assert len(load_source("openai/gsm8k:main#3", ROOT, 0)) == 3
    assert asked == [("openai/gsm8k", "main", "train")]


def test_left_truncation_keeps_whole_characters_under_a_byte_level_bpe() -> None:
    # Qwen's and Llama 3's tokenizers are byte-level BPE: a cut inside a CJK character decodes to U+FFFD, and the
    # engines re-tokenize the text, so the kept tail must be whole characters that encode within the bound
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from backend.data import keep_last_tokens

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["hello world, the sum of 12 and 30"] * 4, vocab_size=300, min_frequency=1)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    text = "hello world 计算十二加三十等于多少，请一步一步地思考。the sum of 12 and 30 是多少？"
    total = len(tok(text, add_special_tokens=False)["input_ids"])
    for n in range(1, total + 2):
        kept = keep_last_tokens(text, tok, n)
        assert text.endswith(kept) and "\ufffd" not in kept
        assert len(tok(kept, add_special_tokens=False)["input_ids"]) <= n
        assert n < total or kept == text
        if n >= 8:
            assert len(tok(kept, add_special_tokens=False)["input_ids"]) >= n - 3  # a character is <= 3 bytes


def test_template_arguments_the_renderer_sets_are_refused() -> None:
    from backend.spec import SpecError, spec_from_dict

    for key in ("tokenize", "add_generation_prompt", "tools"):
        with pytest.raises(SpecError, match=key):
            spec_from_dict({"data": {"chat_template_kwargs": {key: True}}})


def test_left_cuts_of_media_prompts_and_a_short_engine_context_are_refused() -> None:
    mm = load_spec(ROOT / "presets/tiny-cpu.yaml", ["data.images_column=image", "data.prompt_truncation=left"])
    assert any(i.field == "data.prompt_truncation" for i in check_spec(mm, ROOT))
    short = load_spec(ROOT / "presets/tiny-cpu.yaml", ["rollout.engine=vllm", "rollout.max_model_len=1024"])
    assert any(i.field == "rollout.max_model_len" and "max_prompt_tokens" in i.message for i in check_spec(short, ROOT))
    fits = load_spec(ROOT / "presets/tiny-cpu.yaml", ["rollout.engine=vllm", "rollout.max_model_len=1024",
                                                      "data.max_prompt_tokens=512"])
    assert not any(i.field == "rollout.max_model_len" for i in check_spec(fits, ROOT))
