"""The Evaluate page's pure helpers, the dashboard's eval curves and best-checkpoint star, and the run
directory's best checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.eval_view import eval_command, progress_html, resolve_data_ref, resolve_model_ref, side_by_side_html
from app.figures import MetricTable, reward_figure
from app.paths import PathError, Workspace
from backend.eval.cli import parser
from backend.eval.compare import Comparison, PromptRow
from backend.eval.options import from_form
from backend.rundir import BestCheckpoint, RunDir

ROOT = Path(__file__).resolve().parent.parent
LABELS = {"none": "none", "running": "running", "finished": "finished", "failed": "failed", "prompts": "prompts",
          "samples_s": "samples/s", "eta": "ETA"}


def _run(tmp_path: Path, evals: list[dict], saved: list[int]) -> RunDir:
    run = RunDir(tmp_path / "r1")
    run.eval_dir.mkdir(parents=True)
    run.spec_path.write_text("{}\n")
    run.append_jsonl(run.eval_dir / "during_training.jsonl", evals)
    for s in saved:
        (run.checkpoints_dir / f"step-{s}").mkdir(parents=True)
        (run.checkpoints_dir / f"step-{s}" / "COMPLETE").write_text(str(s))
    return run


def test_best_checkpoint_is_the_best_saved_step(tmp_path: Path) -> None:
    m = "eval/rewards/exact_match/mean"
    run = _run(tmp_path, [{"step": 10, m: 0.5, "eval/reward": 2.0}, {"step": 20, m: 0.9, "eval/reward": 1.0},
                          {"step": 30, m: 0.6, "eval/reward": 1.5}, {"step": 40, m: 0.6}], saved=[10, 30, 40])
    best = run.best_checkpoint()
    assert (best.step, best.metric, best.value) == (30, m, 0.6)  # step 20 is better but was not saved; 40 ties later
    assert run.best_checkpoint("eval/reward").step == 10
    assert _run(tmp_path / "x", [{"step": 5, m: 1.0}], saved=[]).best_checkpoint() is None


def test_reward_chart_shows_eval_curve_and_best_star() -> None:
    m = "eval/rewards/exact_match/mean"
    table = MetricTable([{"step": 1, "reward": 1.0}, {"step": 2, "reward": 1.1, "eval/reward": 1.2, m: 0.5},
                         {"step": 3, "reward": 1.2}, {"step": 4, "reward": 1.3, "eval/reward": 1.4, m: 0.6}])
    fig = reward_figure(table, "reward", best=BestCheckpoint(4, m, 0.6, Path("x")))
    names = [tr.get("name") for tr in fig.data]
    assert "held-out reward" in names and "held-out rewards/exact_match/mean" in names
    held = next(tr for tr in fig.data if tr.get("name") == "held-out reward")
    assert list(held["x"]) == [2, 4] and list(held["y"]) == [1.2, 1.4]  # only the evaluated steps
    star = next(tr for tr in fig.data if tr.get("name") == "best checkpoint step-4")
    assert list(star["x"]) == [4] and star["y"] == [0.6]


def test_model_and_data_references_stay_in_the_workspace(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    runs = tmp_path / "runs"
    (runs / "r1").mkdir(parents=True)
    (runs / "r1/spec.yaml").write_text("{}\n")
    assert resolve_model_ref("r1:base", runs, ws) == f"{runs / 'r1'}:base"
    assert resolve_model_ref("r1", runs, ws) == str(runs / "r1")
    assert resolve_model_ref(str(ROOT / "assets/tiny-add"), runs, ws) == str((ROOT / "assets/tiny-add").resolve())
    with pytest.raises(PathError, match="outside the workspace"):
        resolve_model_ref("/etc", runs, ws)
    with pytest.raises(PathError, match="outside the workspace"):
        resolve_data_ref("gsm8k=../../etc/passwd", ws)
    assert resolve_data_ref("gsm8k", ws) == "gsm8k" and resolve_data_ref("", ws) == ""
    cmd = eval_command(from_form({"ks": "1,4", "n": 8, "temperature": 0, "limit": 5, "seed": None}, model="m",
                                 data="gsm8k", out="/o"))
    assert cmd[1:] == ["-m", "backend.eval", "--model", "m", "--data", "gsm8k", "--k", "1,4", "--n", "8",
                       "--temperature", "0.0", "--limit", "5", "--out", "/o"]
    # a bare VL model over data with its own column names: the form's columns reach the evaluator
    cmd = eval_command(from_form({"prompt_column": "question", "images_column": " pic ", "audios_column": ""},
                                 model="m", data="d.jsonl"))
    assert cmd[cmd.index("--data"):] == ["--data", "d.jsonl", "--prompt-column", "question", "--images-column", "pic"]
    args = parser().parse_args(cmd[3:])
    assert (args.prompt_column, args.images_column, args.videos_column) == ("question", "pic", "")


def test_progress_reads_the_status_file(tmp_path: Path) -> None:
    assert 'data-state="none"' in progress_html(None, LABELS)
    st = {"state": "running", "pid": os.getpid(), "pid_create_time": None, "done": 3, "total": 12,
          "samples_per_s": 7.5, "eta_s": 65}
    (tmp_path / "status.json").write_text(json.dumps(st))
    out = progress_html(tmp_path, LABELS)
    assert 'data-state="running"' in out and "3/12 prompts" in out and "width:25.0%" in out and "1m 05s" in out
    (tmp_path / "status.json").write_text(json.dumps({**st, "pid": 2 ** 22 + 12345}))  # no such process
    assert 'data-state="failed"' in progress_html(tmp_path, LABELS)


def test_side_by_side_marks_right_wrong_and_differences() -> None:
    rows = [PromptRow(0, "1+1=<b>", "2", ["2", "3"], [True, False], [1.0, 0.0], [1.0, 0.0]),
            PromptRow(1, "2+2=", "4", ["4", "4"], [True, True], [1.0, 1.0], [1.0, 1.0])]
    cmp = Comparison(["base", "trained"], ["accuracy"], [["base", 1.0], ["trained", 0.5]], rows, [[1, 1], [0, 1]])
    out = side_by_side_html(cmp, rows)
    assert "1+1=&lt;b&gt;" in out and out.count("gs-right") == 3 and out.count("gs-wrong") == 1
    assert out.count("gs-diff") == 1
    assert cmp.filtered("base_right_other_wrong") == rows[:1] and cmp.filtered("base_wrong_other_right") == []
    assert cmp.filtered("differ") == rows[:1]


@pytest.mark.slow  # a child process that imports torch and transformers
def test_export_from_the_page_shows_the_saved_size(tmp_path: Path) -> None:
    import gradio as gr

    from app.config import StudioConfig
    from app.eval_tab import EvalTab
    from app.fields import Registry

    config = StudioConfig.create(tmp_path, allow_paths=[str(ROOT / "assets")])
    with gr.Blocks():
        tab = EvalTab(config, Registry(), None)
    msg = tab.on_export(str(ROOT / "assets/tiny-add"), "exports/tiny", "", "en")
    assert "saved model to" in msg and "MB)" in msg, msg
    assert (tmp_path / "exports/tiny/model.safetensors").is_file()
    assert "outside the workspace" in tab.on_export(str(ROOT / "assets/tiny-add"), "/etc/x", "", "en")


def test_chat_two_models_side_by_side(tmp_path: Path) -> None:
    import gradio as gr

    from app.config import StudioConfig
    from app.eval_tab import EvalTab
    from app.fields import Registry

    config = StudioConfig.create(tmp_path)
    with gr.Blocks():
        tab = EvalTab(config, Registry(), None)
    tiny = str(ROOT / "assets/tiny-add")
    steps = list(tab.on_chat("12+34=", [], [], tiny, tiny, 0.0, 1.0, 6, "", "en"))
    a, b, box, _ = steps[-1]
    assert box == "" and len(steps) >= 2  # streamed: one yield per piece, the input box cleared
    assert [m["role"] for m in a] == ["user", "assistant"] and a[1]["content"]
    assert b == a  # the same model greedily: the same reply in both columns
    a2, b2, _, _ = list(tab.on_chat("1+2=", a, b, tiny, "", 0.0, 1.0, 6, "", "en"))[-1]
    assert len(a2) == 4 and b2 == b  # no second model: column B is left as it was
    err = list(tab.on_chat("1+2=", [], [], str(tmp_path / "nope"), "", 0.0, 1.0, 6, "", "en"))[-1][0]
    assert err[-1]["content"].startswith("⚠")


def test_chat_with_an_image_reaches_a_vision_model(tmp_path: Path) -> None:
    import gradio as gr

    from app.config import StudioConfig
    from app.eval_tab import EvalTab
    from app.fields import Registry
    from backend.eval.chat import ChatSettings

    config = StudioConfig.create(tmp_path)
    with gr.Blocks():
        tab = EvalTab(config, Registry(), None)
    vl = str(ROOT / "assets/tiny-vl")
    img = [str(ROOT / f"assets/data/count_test/{k:04d}.png") for k in (0, 2)]
    a, _, box, image = list(tab.on_chat("How many objects are there?", [], [], vl, "", 0.0, 1.0, 12, "", "en",
                                        img[0]))[-1]
    assert box == "" and image is None  # the input box and the image are cleared after sending
    chat = tab._chat_model(vl)
    s = ChatSettings(temperature=0, max_new_tokens=12)
    first = [{"role": "user", "content": "How many objects are there?", "images": [img[0]]}]
    assert a[1]["content"] == list(chat.stream(first, s))[-1]
    # the second turn comes back from the browser in Gradio's normalised form; both images reach the model
    back = [{"role": "user", "content": [{"type": "file", "file": {"path": img[0]}},
                                         {"type": "text", "text": "How many objects are there?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": a[1]["content"]}]}]
    a2 = list(tab.on_chat("And here?", back, [], vl, "", 0.0, 1.0, 12, "", "en", img[1]))[-1][0]
    convo = [*first, {"role": "assistant", "content": a[1]["content"]},
             {"role": "user", "content": "And here?", "images": [img[1]]}]
    assert a2[-1]["content"] == list(chat.stream(convo, s))[-1]
    assert len(chat.inputs(convo)["image_grid_thw"]) == 2
    # a text-only model refuses the image in the chat, the page keeps serving
    err = list(tab.on_chat("1+2=", [], [], str(ROOT / "assets/tiny-add"), "", 0.0, 1.0, 6, "", "en", img[0]))[-1][0]
    assert err[-1]["content"].startswith("⚠") and "takes no images" in err[-1]["content"]


def _finished_eval(folder: Path, model: str, accuracy: float, answers: list[str]) -> Path:
    """An evaluation folder as backend.eval writes it (status.json, results.json, samples.jsonl)."""
    folder.mkdir(parents=True)
    settings = {"model_label": model, "data_label": "add_test"}
    (folder / "status.json").write_text(json.dumps({"state": "finished", "done": 2, "total": 2, "settings": settings}))
    (folder / "results.json").write_text(json.dumps({**settings, "finished_at": 1.7e9,
                                                     "metrics": {"accuracy": accuracy, "prompts": 2}}))
    gold = ["2", "4"]
    (folder / "samples.jsonl").write_text("".join(
        json.dumps({"index": i, "prompt": f"{i}+{i}=", "solution": gold[i], "completion": a, "correct": a == gold[i],
                    "reward": float(a == gold[i])}) + "\n" for i, a in enumerate(answers)))
    return folder


def _pair(run_dir: Path) -> tuple[Path, Path]:
    """What "Base vs this checkpoint" writes: eval/<name>/0 (the base) and /1 (the checkpoint)."""
    out = run_dir / "eval" / "20260101-000000-studio-compare"
    return (_finished_eval(out / "0", "base", 0.5, ["2", "5"]),
            _finished_eval(out / "1", "step-3", 1.0, ["2", "4"]))


def test_pair_members_are_listed_and_labelled(tmp_path: Path) -> None:
    """Issue 29 items 1 and 12: the pair's folders appear in the Compare picker, and the picker names model,
    data and time, not the folder's timestamp."""
    from app.eval_view import all_evals, eval_label
    from app.runlist import format_time

    runs = tmp_path / "runs"
    run = RunDir(runs / "r1")
    run.path.mkdir(parents=True)
    run.spec_path.write_text("{}\n")
    base, ckpt = _pair(run.path)
    single = _finished_eval(tmp_path / "evals" / "20260101-000001-studio-eval", "tiny-add", 0.7, ["2", "4"])
    evals = all_evals(runs, tmp_path / "evals")
    assert evals == {"r1/20260101-000000-studio-compare/0": base, "r1/20260101-000000-studio-compare/1": ckpt,
                     "evals/20260101-000001-studio-eval": single}
    assert eval_label(base, "r1") == f"r1:base · add_test · {format_time(1.7e9)}"
    assert eval_label(single) == f"tiny-add · add_test · {format_time(1.7e9)}"
    (tmp_path / "bare").mkdir()
    assert eval_label(tmp_path / "bare") == "bare"  # no settings: the folder's name


def test_pair_results_read_as_a_comparison() -> None:
    from app.eval_view import comparison_table, results_table

    table = results_table([("r1:base", {"metrics": {"accuracy": 0.446}}), ("r1:step-3", {"metrics": {"accuracy": 0.692}})])
    assert table["headers"] == ["metric", "r1:base", "r1:step-3", "Δ r1:step-3 − r1:base"]
    assert table["data"][0][0] == "accuracy" and table["data"][0][3] == pytest.approx(0.246)
    cmp = Comparison(["a", "b"], ["accuracy"], [["a", 0.5], ["b", 0.75]], [], [[], []])
    assert comparison_table(cmp)["data"][-1] == ["Δ b − a", 0.25]


def test_page_opens_the_pair_as_a_comparison_and_refreshes_models(tmp_path: Path) -> None:
    """The tick: a finished pair fills the Results panel with both models labelled and the difference, and
    opens in the Compare picker; a run created after the page was built shows up in the model lists; the empty
    tables are hidden (no placeholder headers "1 2 3")."""
    import gradio as gr

    from app.config import StudioConfig
    from app.eval_tab import EvalTab
    from app.fields import Registry
    from app.session import SessionMemo

    config = StudioConfig.create(tmp_path, tmp_path / "runs")
    with gr.Blocks():
        tab = EvalTab(config, Registry(), None)
    assert tab.results.visible is False and tab.cmp_table.visible is False
    run = RunDir(config.runs_dir / "r1")
    run.path.mkdir(parents=True)
    run.spec_path.write_text("{}\n")
    base, ckpt = _pair(run.path)
    tab.memo = SessionMemo({"lang": "en", "eval_out": None, "eval_sess": {}, "cmp_sel": []})
    m = tab.memo.get(None)
    m.update(eval_out=str(base), pair=[str(base), str(ckpt)], pair_shown=False)
    out = dict(zip(["progress", "results", "cmp", "model", "chat_a", "chat_b", "export"], tab.tick(m), strict=True))
    assert m["eval_out"] == str(ckpt)  # the base finished: the page follows the checkpoint
    assert out["results"]["visible"] and out["results"]["value"]["headers"][1:] == ["base", "step-3", "Δ step-3 − base"]
    assert out["cmp"]["value"] == ["r1/20260101-000000-studio-compare/0", "r1/20260101-000000-studio-compare/1"]
    assert {label.rsplit(" · ", 1)[0] for label, _ in out["cmp"]["choices"]} == {"r1:base · add_test",
                                                                                 "r1:step-3 · add_test"}
    assert "r1" in out["model"]["choices"] and "r1" in out["chat_b"]["choices"]
    shown = tab.on_compare(out["cmp"]["value"], "base_wrong_other_right", "en")
    assert shown[1]["visible"] and shown[1]["value"]["data"][-1][0].startswith("Δ")
    assert "1 of 2 prompts shown" in shown[0]
    again = tab.tick(m)
    assert all(o == gr.skip() for o in again[1:])  # nothing new: nothing sent
