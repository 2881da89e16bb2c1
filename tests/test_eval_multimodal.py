"""`python -m backend.eval` on the shipped tiny Qwen2-VL (assets/tiny-vl): a bare model with --data, a run's base
and a run's checkpoint all evaluate, and each accuracy is the trainer's own greedy eval figure
(GRPOTrainer.evaluate, backend/eval/greedy.py) on the same held-out scenes; media with another engine and a
missing image are refused with errors that say what to do and where.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.eval.cli import main as eval_main
from backend.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "presets/tiny-vl-counting-cpu.yaml"
ROWS = 12  # first scenes of the shipped test set


@pytest.fixture
def held_out(tmp_path: Path) -> Path:
    """The first scenes of count_test.jsonl; their image paths stay relative to the project root, as shipped."""
    path = tmp_path / "held_out.jsonl"
    with (ROOT / "assets/data/count_test.jsonl").open() as f:
        path.write_text("".join(line for _, line in zip(range(ROWS), f)))
    return path


def _eval(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert eval_main(list(args)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_vl_model_and_run_evaluate_as_the_trainer_does(tmp_path: Path, held_out: Path, capsys, monkeypatch) -> None:
    from backend.rundir import create_run, read_jsonl
    from backend.train.loop import GRPOTrainer

    monkeypatch.chdir(ROOT)  # the CLI's base dir: relative image paths resolve against it, as the trainer's do
    spec = load_spec(PRESET, [f"output.runs_dir={tmp_path / 'runs'}", f"data.eval_sources=[{held_out}]",
                              "algorithm.max_steps=2", "output.save_steps=2", "output.eval_steps=2"])
    run = create_run(spec, ROOT)
    trainer = GRPOTrainer(spec, run, ROOT).setup()
    before = trainer.evaluate()["eval/rewards/counting/mean"]
    trainer.train()
    during = read_jsonl(run.eval_dir / "during_training.jsonl")[0]
    assert [r["step"] for r in during] == [2]
    after = during[0]["eval/rewards/counting/mean"]  # the trainer's greedy eval of the step-2 weights
    with capsys.disabled():
        print(json.dumps({"trainer eval before": before, "after 2 steps": after}))
    assert 0 < before < 1  # the shipped model is partly competent: right and wrong answers both occur

    # a bare model directory with --data: the image column is inferred from the vision-language model
    bare = _eval(capsys, "--model", "assets/tiny-vl", "--data", str(held_out), "--prompt-column", "problem",
                 "--rewards", "counting,format", "--out", str(tmp_path / "bare"))
    assert bare["prompts"] == ROWS and bare["accuracy"] == pytest.approx(before)
    assert bare["rewards/counting/mean"] == pytest.approx(before)
    samples = [json.loads(line) for line in (tmp_path / "bare/samples.jsonl").read_text().splitlines()]
    shipped = {json.loads(line)["image"] for line in held_out.read_text().splitlines()}
    assert len(samples) == ROWS and all(len(s["images"]) == 1 and s["images"][0] in shipped for s in samples)
    assert all(s["prompt"].count("<|image_pad|>") == 1 for s in samples)  # one placeholder, as the trainer's text

    # the run: its spec carries the image column, prompt column and rewards; base and the step-2 checkpoint
    base = _eval(capsys, "--model", f"{run.path}:base")
    assert base["accuracy"] == pytest.approx(before)
    trained = _eval(capsys, "--model", str(run.path))
    assert trained["accuracy"] == pytest.approx(after)
    results = json.loads((run.evals()[0] / "results.json").read_text())
    assert results["model_label"] == "step-2" and results["correct_function"] == "counting"

    # an exported checkpoint is a model directory that takes images again (its image processor saved beside it)
    from backend.eval.export import main as export_main

    assert export_main(["--model", str(run.path), "--out", str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported/preprocessor_config.json").is_file()
    exported = _eval(capsys, "--model", str(tmp_path / "exported"), "--data", str(held_out), "--prompt-column", "problem",
                     "--rewards", "counting,format", "--out", str(tmp_path / "exported-eval"))
    assert exported["accuracy"] == pytest.approx(after)

    # the Evaluate page's side-by-side comparison shows each prompt's picture
    from app.eval_view import side_by_side_html
    from app.media import thumb_uris
    from app.paths import Workspace
    from backend.eval.compare import compare, load_eval

    cmp = compare([load_eval(f) for f in reversed(run.evals())])  # base, then step-2
    assert all(len(r.images) == 1 and r.images[0] in shipped for r in cmp.rows)
    page = side_by_side_html(cmp, cmp.rows, image_uris=lambda refs: thumb_uris(refs, Workspace(ROOT)))
    assert page.count('<img class="gs-thumb" src="data:image/png;base64,') == ROWS


def test_media_refusals(tmp_path: Path, held_out: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    common = ["--model", "assets/tiny-vl", "--prompt-column", "problem", "--rewards", "counting"]
    assert eval_main([*common, "--data", str(held_out), "--engine", "vllm", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "images column 'image'" in err and "--engine hf" in err

    assert eval_main([*common, "--data", str(held_out), "--images-column", "picture", "--out", str(tmp_path / "b")]) == 2
    assert "--images-column 'picture': no such column" in capsys.readouterr().err

    rows = [json.loads(line) for line in held_out.read_text().splitlines()[:2]]
    rows[1]["image"] = "assets/data/count_test/no-such.png"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert eval_main([*common, "--data", str(bad), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "column 'image'" in err and "no such image file" in err and "no-such.png" in err
    assert json.loads((tmp_path / "c/status.json").read_text())["state"] == "failed"


def test_video_column_evaluates_like_its_still_image(tmp_path: Path, held_out: Path, capsys, monkeypatch) -> None:
    """A video of two identical frames is exactly the image of that frame (backend/multimodal/processors.py), so the
    evaluation through --videos-column gives the image evaluation's completions, sample for sample."""
    monkeypatch.chdir(ROOT)
    rows = [json.loads(line) for line in held_out.read_text().splitlines()[:4]]
    data = tmp_path / "video.jsonl"
    data.write_text("".join(json.dumps({**r, "video": [r["image"], r["image"]]}) + "\n" for r in rows))
    common = ["--model", "assets/tiny-vl", "--data", str(data), "--prompt-column", "problem", "--rewards", "counting"]
    _eval(capsys, *common, "--out", str(tmp_path / "image"))
    _eval(capsys, *common, "--videos-column", "video", "--out", str(tmp_path / "video"))
    image, video = ([json.loads(line) for line in (tmp_path / k / "samples.jsonl").read_text().splitlines()]
                    for k in ("image", "video"))
    assert [s["completion"] for s in video] == [s["completion"] for s in image]
    assert all("<|video_pad|>" in s["prompt"] and "<|image_pad|>" not in s["prompt"] for s in video)
    assert all(len(s["videos"]) == 2 and "images" not in s for s in video)
