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
