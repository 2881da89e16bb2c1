"""Export round trip, model references, benchmark loaders, chat streaming and compare on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.eval.benchmarks import BENCHMARKS, gpqa_order, load_benchmark, math_answer, parse_data_ref
from backend.eval.chat import ChatModel, ChatSettings
from backend.eval.compare import CompareError, compare, load_eval
from backend.eval.export import ExportError, export_model, push_to_hub
from backend.eval.options import EvalConfig
from backend.eval.refs import ModelRefError, resolve_model
from backend.eval.run import read_status, run_eval
from backend.rewards.choice import choice_letter, multiple_choice

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "assets/tiny-add"


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory) -> Path:
    """A LoRA adapter on the tiny model with non-zero B (so merging changes the logits)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    out = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(TINY).save_pretrained(out)
    return out


def test_export_merges_lora_and_keeps_the_logits(adapter_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    choice = resolve_model(str(adapter_dir))
    assert choice.is_adapter and Path(choice.adapter_base).resolve() == TINY.resolve()
    ex = export_model(choice, tmp_path / "merged")
    names = {p.name for p in ex.path.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    assert not (ex.path / "adapter_config.json").exists() and ex.merged_adapter
    assert ex.size_bytes == sum(p.stat().st_size for p in ex.path.iterdir())
    ids = torch.tensor([[5, 9, 12, 7, 3, 8]])
    ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32), str(adapter_dir))
    base_logits = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)(ids).logits
    with torch.no_grad():
        want = ref.eval()(ids).logits
        got = AutoModelForCausalLM.from_pretrained(ex.path, dtype=torch.float32)(ids).logits
    assert not torch.allclose(want, base_logits, atol=1e-3)  # the adapter matters
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ExportError, match="not empty"):
        export_model(choice, ex.path)


def test_push_fails_clearly_offline(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ExportError, match="offline.*saved in"):
        push_to_hub(tmp_path, "someone/model")


def test_model_references(tmp_path: Path) -> None:
    with pytest.raises(ModelRefError, match="no such directory"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ModelRefError, match="neither config.json"):
        resolve_model(str(tmp_path))
    run = tmp_path / "run"
    (run / "checkpoints/step-5/model").mkdir(parents=True)
    (run / "spec.yaml").write_text(f"model: {{name_or_path: {TINY}}}\n")
    assert resolve_model(str(run)).label == "base"  # no complete checkpoint yet
    (run / "checkpoints/step-5/COMPLETE").write_text("5")
    c = resolve_model(str(run))
    assert (c.label, c.step, c.weights) == ("step-5", 5, run / "checkpoints/step-5/model")
    assert resolve_model(f"{run}:base").weights == TINY
    with pytest.raises(ModelRefError, match="step-7.*has: step-5"):
        resolve_model(f"{run}:7")
    with pytest.raises(ModelRefError, match="checkpoint step or 'base'"):
        resolve_model(f"{run}:latest")


def test_benchmark_samples_and_answer_extraction(tmp_path: Path) -> None:
    for name in BENCHMARKS:
        b, path = parse_data_ref(name)
        rows = load_benchmark(b, path, ROOT)
        assert rows and all(r["prompt"] and r["solution"] for r in rows), name
    gsm = load_benchmark(*parse_data_ref("gsm8k"), ROOT)
    assert [r["solution"] for r in gsm] == ["29", "35", "5000", "8"]  # "#### 5,000" -> 5000
    gpqa = load_benchmark(*parse_data_ref("gpqa"), ROOT)
    row = gpqa[0]
    assert f"{row['solution']}) The photon" in row["prompt"]  # the gold letter labels the correct option
    assert gpqa_order("q") == gpqa_order("q") and sorted(gpqa_order("q")) == [0, 1, 2, 3]
    assert math_answer("so x = 1,000 and \\boxed{ 12 }") == "12" and math_answer("it is 3/4.") == "3/4"
    assert choice_letter("The answer is (C).") == "C" and choice_letter("<answer>b</answer>") == "B"
    assert choice_letter("I pick \\boxed{D}") == "D" and choice_letter("no idea") is None
    assert multiple_choice(["answer is B", "A", "x"], solution=["B", "B", "?"]) == [1.0, 0.0, None]
    bad = tmp_path / "gsm.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "42"}) + "\n")
    with pytest.raises(ValueError, match="gsm8k row 0.*####"):
        load_benchmark(*parse_data_ref(f"gsm8k={bad}"), ROOT)
    with pytest.raises(ValueError, match="unknown benchmark 'mmlu'"):
        parse_data_ref("mmlu=x.jsonl")


def test_chat_streams_a_reply() -> None:
    chat = ChatModel(str(TINY))
    parts = list(chat.stream([{"role": "user", "content": "12+34="}], ChatSettings(temperature=0, max_new_tokens=6)))
    from backend.rollout.base import PromptInput, SamplingParams
    from backend.rollout.hf import HFEngine

    ids = chat.tok("12+34=", add_special_tokens=False)["input_ids"]
    greedy = HFEngine(chat.model, chat.tok).generate([PromptInput(ids)], SamplingParams(n=1, max_tokens=6, top_k=1))
    assert parts and parts[-1] == greedy[0][0].text and parts[-1]  # the same reply as the rollout engine's greedy
    assert all(parts[i + 1].startswith(parts[i]) for i in range(len(parts) - 1))


def test_chat_sends_images_to_a_vision_model() -> None:
    from backend.multimodal import render_mm_prompt
    from backend.rollout.base import PromptInput, SamplingParams
    from backend.rollout.hf import HFEngine
    from backend.spec import load_spec

    chat = ChatModel(str(ROOT / "assets/tiny-vl"), ROOT)
    spec = load_spec(ROOT / "presets/tiny-vl-counting-cpu.yaml")
    rows = [json.loads(x) for x in (ROOT / "assets/data/count_test.jsonl").read_text().splitlines()[:4]]
    replies = []
    for row in rows:
        msgs = [{"role": "user", "content": row["problem"], "images": [row["image"]]}]
        enc = chat.inputs(msgs, spec.data.system_prompt)
        mm = render_mm_prompt(row, spec.data, chat.vision, ROOT)  # the trainer's rendering of the same row
        assert enc["input_ids"][0].tolist() == mm.ids
        torch.testing.assert_close(enc["pixel_values"], mm.media["pixel_values"])
        reply = list(chat.stream(msgs, ChatSettings(temperature=0, max_new_tokens=12,
                                                    system_prompt=spec.data.system_prompt)))[-1]
        greedy = HFEngine(chat.model, chat.tok).generate([PromptInput(mm.ids, multi_modal=mm.media)],
                                                         SamplingParams(n=1, max_tokens=12, top_k=1))
        assert reply == greedy[0][0].text  # the rollout engine's greedy answer for that image
        replies.append(reply)
    assert len(set(replies)) > 1  # the answer depends on the picture
    with pytest.raises(ValueError, match="text-only model: it takes no images"):
        ChatModel(str(TINY)).inputs([{"role": "user", "content": "1+2=", "images": [rows[0]["image"]]}])


def test_eval_and_compare_line_up(tmp_path: Path) -> None:
    common = {"data": str(ROOT / "assets/data/add_test.jsonl"), "rewards": ["exact_match"], "limit": 12, "batch": 5,
              "max_tokens": 6, "base_dir": str(ROOT)}
    a = run_eval(EvalConfig(model=str(TINY), ks=[1, 2], n=2, temperature=1.0, out=str(tmp_path / "a"), **common))
    assert read_status(tmp_path / "a")["state"] == "finished" and read_status(tmp_path / "a")["done"] == 12
    rows = [json.loads(x) for x in (tmp_path / "a/samples.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and a["metrics"]["pass@2"] >= a["metrics"]["pass@1"]
    acc = sum(r["correct"] for r in rows) / 24
    assert a["metrics"]["accuracy"] == pytest.approx(acc)
    run_eval(EvalConfig(model=str(TINY), ks=[1, 2], n=2, temperature=1.0, out=str(tmp_path / "b"), **common))
    same = compare([load_eval(tmp_path / "a", "x"), load_eval(tmp_path / "b", "y")])
    assert [r.answers[0] for r in same.rows] == [r.answers[1] for r in same.rows]  # same seed, same model
    assert same.filtered("base_wrong_other_right") == [] and same.filtered("differ") == []
    csv_text = same.to_csv()
    assert csv_text.splitlines()[0].startswith("index,prompt,solution,x:answer") and len(csv_text.splitlines()) == 13
    run_eval(EvalConfig(model=str(TINY), ks=[1], out=str(tmp_path / "c"), **{**common, "limit": 5}))
    with pytest.raises(CompareError, match="same prompts"):
        compare([load_eval(tmp_path / "a"), load_eval(tmp_path / "c")])


def test_cli_errors_name_the_bad_argument(tmp_path: Path, capsys) -> None:
    from backend.eval.cli import main

    assert main(["--model", str(tmp_path / "nope"), "--data", "gsm8k", "--out", str(tmp_path / "f")]) == 2
    assert "no such directory" in capsys.readouterr().err
    st = read_status(tmp_path / "f")  # the studio follows the folder: an early failure is reported there too
    assert st["state"] == "failed" and "no such directory" in st["error"]
    assert main(["--model", str(TINY), "--data", "gsm8k", "--k", "1,4", "--n", "2"]) == 2
    assert "pass@4 needs --n >= 4" in capsys.readouterr().err
    assert main(["--model", str(TINY)]) == 2
    assert "--data is required" in capsys.readouterr().err
    assert main(["--model", str(TINY), "--data", "gsm8k", "--top-p", "0"]) == 2
    assert "--top-p" in capsys.readouterr().err
    assert main(["--model", str(TINY), "--data", "gsm8k", "--rewards", "exact_match", "--correct", "accuracy",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--correct 'accuracy' is not among" in capsys.readouterr().err
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        assert main(["--model", str(TINY), "--data", "gsm8k", "--engine", "vllm", "--out", str(tmp_path / "v")]) == 2
        assert "the vllm package is not installed here" in capsys.readouterr().err


def test_compare_command_runs_both_models_on_the_same_prompts(tmp_path: Path, capsys) -> None:
    from backend.eval.compare import main

    code = main(["--model", str(TINY), "--model", str(TINY), "--data", str(ROOT / "assets/data/add_test.jsonl"),
                 "--rewards", "exact_match", "--limit", "8", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("model\taccuracy") and "compare.csv" in out
    assert len((tmp_path / "compare.csv").read_text().splitlines()) == 9  # header + 8 prompts
    assert {p.name for p in tmp_path.iterdir()} >= {"0", "1", "compare.csv"}


def test_local_judge_drives_the_first_correct_position() -> None:
    from backend.eval.thinking import LocalJudge, thinking_stats

    judge = LocalJudge(str(TINY)).for_question("12+34=", "64")
    verdicts = [judge(p) for p in ("12", "12+34=64")]
    assert all(isinstance(v, bool) for v in verdicts)
    s = thinking_stats("<think>12. 12+34=64.</think>64", True, judge=judge)
    assert s is not None and (s.first_correct_tokens is None) == (not any(judge(p) for p in ("12.", "12. 12+34=64.")))


class ScriptedEngine:
    """A fake engine for the scoring path: per prompt, a right answer with a think block, then a wrong one."""

    def __init__(self, tok, golds: list[str]) -> None:
        self.tok, self.golds = tok, iter(golds)  # prompts arrive in file order

    def generate(self, prompts, sampling):
        from backend.rollout.base import Completion

        out = []
        for _ in prompts:
            gold = next(self.golds)
            right = f"<think>Try 1. Wait, it is {gold}. Check: yes.</think>The answer is \\boxed{{{gold}}}."
            wrong = "<think>No idea. 等等, maybe 1.</think>\\boxed{1}"
            group = [right if j % 2 == 0 else wrong for j in range(sampling.n)]
            out.append([Completion(self.tok(c, add_special_tokens=False)["input_ids"], c, "stop") for c in group])
        return out

    def close(self) -> None:
        pass


def test_benchmark_scoring_path_with_a_scripted_engine(tmp_path: Path, monkeypatch) -> None:
    import backend.eval.run as run_mod

    rows = load_benchmark(*parse_data_ref("gsm8k"), ROOT)
    golds = [r["solution"] for r in rows]
    monkeypatch.setattr(run_mod, "open_engine", lambda cfg, choice, tok: ScriptedEngine(tok, golds))
    res = run_eval(EvalConfig(model=str(TINY), data="gsm8k", ks=[1, 2], n=2, temperature=1.0, out=str(tmp_path),
                              base_dir=str(ROOT)))
    m = res["metrics"]
    assert res["correct_function"] == "accuracy"  # the benchmark's reward, through math-verify
    assert (m["accuracy"], m["pass@1"], m["pass@2"], m["maj@2"]) == (0.5, 0.5, 1.0, 1.0)  # tie: first seen wins
    th = res["thinking"]
    assert th["thinking/with_think_block"] == 1.0 and th["thinking/thought_switches"] == 1.0  # "Wait" / "等等"
    assert th["thinking/efficiency"] > 0 and th["thinking/reflection_tokens"] > 0
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["correct"] for s in samples[:2]] == [True, False]
    assert samples[0]["answer"] == "29" and samples[1]["thinking"]["efficiency"] == 0.0
