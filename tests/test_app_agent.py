"""The studio's agentic side (docs/agent.md), on fabricated run directories: the multi-turn sample view (turn by
turn, escaped, masked segments marked, errors highlighted), the Tools chart, and the Tools & environment section's
tool file save and upload (good code, syntax errors, no function, paths that try to leave the workspace)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from app.config import StudioConfig
from app.figures import CHART_IDS, MetricTable, build_dashboard, has_tool_metrics, timing_figure
from app.samples_view import SampleFilter, episode_segments, render_episode, render_step
from app.sections.tools import (
    EXAMPLE_TOOL,
    ToolFileError,
    add_items,
    inspect_tool_source,
    on_save,
    on_upload,
    save_tool_file,
    use_tool_file,
)
from backend.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent
INJECT = '<script>alert(1)</script><img src=x onerror="alert(2)">'


def episode_row(step: int = 1, group: int = 0, k: int = 0, error: str | None = None, cut: bool = False) -> dict:
    """One multi-turn sample as docs/agent.md writes it: a call, the tool's answer (inserted), the final answer."""
    return {"step": step, "group": group, "prompt": f"{group}+{group}=", "completion": "3", "solution": "3",
            "rewards": {"exact_match": float(k == 0)}, "reward": float(k == 0), "advantage": 0.5 - k, "length": 42,
            "truncated": False,
            "episode": [
                {"role": "assistant", "text": '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
                 "tokens": 31, "masked": False, "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
                {"role": "tool", "name": "add", "text": "3" if error is None else "", "tokens": 9, "masked": True,
                 "error": error},
                {"role": "user", "text": "observation: keep going", "tokens": 5, "masked": True},
                {"role": "assistant", "text": f"answer {k}", "tokens": 2, "masked": False}],
            "turns": 2, "tool_calls": 1, "tool_errors": int(error is not None), "cut": cut}


def make_agent_run(root: Path, rid: str, steps: int = 3) -> RunDir:
    """A finished agentic run: tools in its spec, episode metrics, multi-turn samples (one with a tool error and
    one whose text tries to inject HTML)."""
    run = RunDir(root / rid)
    run.path.mkdir(parents=True)
    spec = (ROOT / "presets" / "tiny-cpu.yaml").read_text()
    run.spec_path.write_text(spec + "\ntools:\n  functions: [add]\n  files: [tools/my_tools.py]\n")
    now = time.time()
    run.write_status(state="finished", step=steps, total_steps=steps, preset="tiny-cpu", started_at=now - 65,
                     reward=0.5, step_s=2.0, pid=None, pid_create_time=None)
    run.append_jsonl(run.metrics_path, [
        {"step": i, "time": now - 60 + i, "reward": i / 10, "loss": 0.1, "timing/rollout_s": 1.0,
         "timing/reward_s": 0.1, "timing/train_s": 0.5, "timing/step_s": 1.7, "timing/tools_s": 0.3,
         "tools/call_frequency": 1.0 + i / 10, "tools/failure_frequency": 0.25, "episode/turns_mean": 2.0,
         "episode/cut_frequency": 0.1, "episode/model_tokens_mean": 33.0} for i in range(1, steps + 1)])
    rows = []
    for s in range(1, steps + 1):
        for k in range(2):
            rows.append(episode_row(s, 0, k, error="TypeError: add() missing 1 required positional argument: 'b'"
                                    if k == 1 else None, cut=k == 1))
        inj = episode_row(s, 1, 0)
        inj["episode"][0]["text"] = INJECT
        inj["episode"][0]["tool_calls"] = [{"name": INJECT, "arguments": {"x": INJECT}}]
        inj["episode"][1]["text"] = INJECT
        rows.append(inj)
    run.append_jsonl(run.samples_path, rows)
    return run


# ----------------------------------------------------------------------------- the episode view

def test_episode_renders_turn_by_turn_in_order_with_roles_and_calls():
    out = render_episode(episode_row())
    roles = [chunk.split('"', 1)[0] for chunk in out.split('data-role="')[1:]]
    assert roles == ["assistant", "tool", "user", "assistant"]
    assert out.index("<tool_call>".replace("<", "&lt;").replace(">", "&gt;")) < out.index("answer 0")
    assert '<code class="gs-call-name">add</code>' in out
    assert html_unescape(out.split('class="gs-call-args">')[1].split("</pre>")[0]) == '{"a": 1, "b": 2}'
    assert ">environment<" in out and ">tool<" in out and ">assistant<" in out  # role "user" is an observation
    head = out.split('<ol class="gs-episode">')[0]
    assert "turns <b>2</b>" in head and "tool calls <b>1</b>" in head and "errors <b>0</b>" in head
    assert "cut" not in head


def test_masked_segments_are_marked_not_trained_and_model_segments_are_not():
    out = render_episode(episode_row())
    segs = out.split("<li ")[1:]
    masked = [s for s in segs if "gs-masked" in s.split(">", 1)[0]]
    assert len(masked) == 2 and all("not trained" in s for s in masked)
    assert all('data-role="assistant"' not in s.split(">", 1)[0] for s in masked)
    trained = [s for s in segs if "gs-masked" not in s.split(">", 1)[0]]
    assert len(trained) == 2 and not any("not trained" in s for s in trained)


def test_tool_errors_and_cut_are_highlighted():
    out = render_episode(episode_row(error="ValueError: <bad> & worse", cut=True))
    tool = [s for s in out.split("<li ")[1:] if 'data-role="tool"' in s][0]
    assert "gs-seg-error" in tool.split(">", 1)[0] and "gs-masked" in tool.split(">", 1)[0]
    assert '<div class="gs-tool-error">⚠ error: ValueError: &lt;bad&gt; &amp; worse</div>' in tool
    head = out.split('<ol class="gs-episode">')[0]
    assert 'gs-ep-bad">errors <b>1</b>' in head and "gs-ep-cut" in head


def test_every_field_of_an_episode_is_escaped():
    row = episode_row()
    row["episode"][0]["text"] = INJECT
    row["episode"][0]["tool_calls"] = [{"name": INJECT, "arguments": {"q": INJECT}}, {"name": "f", "arguments": INJECT}]
    row["episode"][1].update(name=INJECT, text=INJECT, error=INJECT)
    row["episode"][2]["role"] = INJECT
    out = render_step([row])
    assert "<script" not in out and "<img" not in out and "onerror=\"" not in out
    assert out.count("&lt;script&gt;") >= 6


def test_a_malformed_episode_falls_back_and_never_raises():
    for ep in ("text", 3, None, [1, "x", None], [{"role": None, "text": None, "tool_calls": "nope", "tokens": "9"}]):
        row = {**episode_row(), "episode": ep, "turns": "two", "tool_errors": None}
        html_out = render_step([row])
        assert "gs-group" in html_out
        if not episode_segments(row):
            assert "gs-episode" not in html_out and "<pre>3</pre>" in html_out
    row = episode_row()
    row["episode"][0]["tool_calls"] = [{"name": "add", "arguments": '{"a": 1,'}]  # the model's bad JSON, as it came
    assert '{&quot;a&quot;: 1,' in render_episode(row)


def test_single_turn_samples_look_as_before():
    row = {"step": 1, "group": 0, "prompt": "1+1=", "completion": "<b>2</b>", "solution": "2",
           "rewards": {"exact_match": 1.0}, "reward": 1.0, "advantage": 0.0, "length": 3, "truncated": False}
    out = render_step([row])
    assert "<td><pre>&lt;b&gt;2&lt;/b&gt;</pre></td>" in out
    assert "gs-episode" not in out and "gs-ep-head" not in out and "gs-group-episodes" not in out
    assert render_episode(row) == ""


def test_episode_groups_are_wider_and_the_text_filter_reads_the_episode():
    rows = [episode_row(k=0), episode_row(k=1)]
    assert "gs-group gs-group-episodes" in render_step(rows)
    assert "gs-row" in render_step(rows, SampleFilter(text="observation: keep"))
    assert "No samples match" in render_step(rows, SampleFilter(text="not anywhere"))


def test_episode_labels_follow_the_language():
    from app.runs_tab import episode_labels

    out = render_step([episode_row()], labels=episode_labels("zh"))
    assert "未训练" in out and "环境观察" in out and "助手" in out and "轮数" in out


def html_unescape(s: str) -> str:
    import html

    return html.unescape(s)


# ----------------------------------------------------------------------------- the Tools chart

def test_tools_chart_draws_episode_metrics_with_rates_on_the_right():
    run_rows = [{"step": i, "tools/call_frequency": 1.5, "tools/failure_frequency": 0.2, "episode/turns_mean": 2.5,
                 "episode/cut_frequency": 0.1, "timing/rollout_s": 1.0, "timing/tools_s": 0.4} for i in range(1, 6)]
    table = MetricTable(run_rows)
    assert has_tool_metrics(table) and not has_tool_metrics(MetricTable([{"step": 1, "reward": 0.1}]))
    figs = build_dashboard(table, {"tools": "Tools"})
    assert tuple(figs) == CHART_IDS
    tools = figs["tools"]
    by_name = {tr["name"]: tr for tr in tools.data}
    assert set(by_name) == {"tool calls / episode", "turns / episode", "failed calls / calls", "episodes cut"}
    assert by_name["failed calls / calls"]["yaxis"] == "y2" and by_name["tool calls / episode"].get("yaxis") is None
    assert tools.layout["title"]["text"] == "Tools" and tools.layout["yaxis2"]["title"]["text"] == "rate"
    tools.to_go()
    timing = figs["timing"]
    tools_s = [tr for tr in timing.data if tr["name"].startswith("tools")]
    assert len(tools_s) == 1 and "stackgroup" not in tools_s[0] and tools_s[0]["line"]["dash"] == "dot"
    timing.to_go()
    assert timing_figure(MetricTable([{"step": 1, "timing/tools_s": 0.2}]), "t").data  # tools alone still draw


def test_tools_chart_speaks_chinese():
    from app.locales import chart_words
    from app.runs_tab import chart_titles

    table = MetricTable([{"step": i, "tools/call_frequency": 1.0, "tools/failure_frequency": 0.0,
                          "episode/turns_mean": 2.0, "episode/cut_frequency": 0.0, "timing/tools_s": 0.1}
                         for i in range(1, 4)])
    figs = build_dashboard(table, chart_titles("zh"), names=chart_words("zh"))
    names = [tr["name"] for tr in figs["tools"].data]
    assert names == ["每回合工具调用数", "每回合轮数", "工具调用失败率", "被截断回合比例"]
    assert figs["tools"].layout["title"]["text"].startswith("工具") and figs["tools"].layout["yaxis2"]["title"]["text"] == "比例"
    assert any(tr["name"] == "工具（含于采样）" for tr in figs["timing"].data)


def test_runs_tab_shows_the_tools_chart_only_for_agentic_runs(tmp_path):
    import gradio as gr

    from app.fields import Registry
    from app.page import session_defaults
    from app.runs_tab import RunsTab
    from tests.test_app_runs import make_run

    config = StudioConfig.create(tmp_path, tmp_path / "runs")
    make_run(config.runs_dir, "20260101-000000-plain-0001", "finished", steps=3)
    with gr.Blocks():
        tab = RunsTab(config, Registry(), gr.State("en"))
    idx = tab.refresh_outputs().index(tab.plots["tools"])
    m = session_defaults("en", "20260101-000000-plain-0001")
    assert tab.refresh(m)[idx]["visible"] is False
    agent = make_agent_run(config.runs_dir, "20260102-000000-agent-0002")
    m = session_defaults("en", agent.run_id)
    up = tab.refresh(m)[idx]
    assert up["visible"] is True and up["value"].data
    samples = tab.refresh_samples(m)[1]
    assert "gs-episode" in samples and "not trained" in samples and "<script" not in samples


# ----------------------------------------------------------------------------- the tool file editor

@pytest.fixture
def ws(tmp_path):
    return StudioConfig.create(tmp_path / "ws", tmp_path / "ws" / "runs").workspace


def test_the_example_tool_saves_and_is_used(ws):
    saved = save_tool_file(ws, "my_tools", EXAMPLE_TOOL)
    assert saved.rel == "tools/my_tools.py" and (ws.root / "tools" / "my_tools.py").read_text() == EXAMPLE_TOOL
    assert saved.source.functions == ["add"] and saved.source.warnings == []
    change = use_tool_file(saved, "tools/other.py", "python", "", "en")
    assert change.files == "tools/other.py, tools/my_tools.py" and change.functions == "python, add"
    assert change.environment == "" and "tools/my_tools.py" in change.message and "add" in change.message
    again = use_tool_file(saved, change.files, change.functions, "", "en")  # saving twice adds nothing twice
    assert again.files == change.files and again.functions == change.functions


def test_the_example_tool_has_a_schema_transformers_accepts():
    pytest.importorskip("transformers")
    from transformers.utils import get_json_schema

    scope: dict = {}
    exec(EXAMPLE_TOOL, scope)  # the example, as the worker will load it
    schema = get_json_schema(scope["add"])
    assert schema["function"]["name"] == "add" and set(schema["function"]["parameters"]["required"]) == {"a", "b"}


def test_a_syntax_error_is_refused_with_its_line_and_nothing_is_written(ws):
    with pytest.raises(ToolFileError) as err:
        save_tool_file(ws, "broken", "def add(a: int, b: int) -> int:\n    return a +\n")
    assert "line 2" in err.value.text("en") and "第 2 行" in err.value.text("zh")
    assert not (ws.root / "tools").exists()
    files, fns, env, msg = on_save(ws, "broken", "def f(:\n", "tools/keep.py", "python", "", "en")
    assert all(isinstance(x, dict) and x == {"__type__": "update"} for x in (files, fns, env))  # gr.skip: form kept
    assert msg.startswith("⚠ Tool file not saved: syntax error on line 1")


def test_code_without_a_function_is_refused(ws):
    for code in ("x = 1\n", "", "def _private(a: int) -> int:\n    return a\n", "class NotAnEnv:\n    def step(self): ...\n"):
        with pytest.raises(ToolFileError) as err:
            save_tool_file(ws, "empty", code)
        assert err.value.key == "tool_nofn"
    _, _, _, msg = on_save(ws, "empty", "x = 1\n", "", "", "", "zh")
    assert "没有顶层函数" in msg
    assert not (ws.root / "tools").exists()


@pytest.mark.parametrize("name", ["../x", "../../x.py", "/etc/x", "..\\..\\x", "tools/../../x", ".hidden"])
def test_a_file_name_never_leaves_the_tools_folder(ws, name):
    saved = save_tool_file(ws, name, EXAMPLE_TOOL)
    dest = (ws.root / saved.rel).resolve()
    assert dest.parent == (ws.root / "tools").resolve() and dest.suffix == ".py"
    assert not (ws.root.parent / "x.py").exists() and not (ws.root.parent / "x").exists()


def test_a_tools_folder_that_links_outside_is_refused(ws, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    ws.root.mkdir(parents=True, exist_ok=True)
    (ws.root / "tools").symlink_to(outside)
    _, _, _, msg = on_save(ws, "my_tools", EXAMPLE_TOOL, "", "", "", "en")
    assert msg.startswith("⚠ Tool file not saved") and not list(outside.iterdir())


def test_an_environment_file_sets_the_environment_not_the_tools(ws):
    code = ("class Guess:\n    def reset(self, row):\n        return 'guess'\n"
            "    def step(self, message):\n        return {'observation': None, 'done': True, 'reward': 1.0}\n\n"
            "def helper(x):\n    return x\n")
    src = inspect_tool_source(code)
    assert src.environments == ["Guess"] and src.functions == ["helper"]
    files, fns, env, msg = on_save(ws, "guess_env", code, "", "", "", "en")
    assert files == "tools/guess_env.py" and fns == "" and env == "Guess" and "Guess" in msg
    _, _, env2, _ = on_save(ws, "guess_env", code, "", "", "Mine", "en")
    assert env2 == "Mine"  # an environment already named is kept


def test_functions_get_json_schema_would_refuse_are_saved_with_a_warning(ws):
    files, fns, _, msg = on_save(ws, "loose", "def shout(text):\n    return text.upper()\n", "", "", "", "en")
    assert files == "tools/loose.py" and fns == "shout"
    assert "shout: no docstring" in msg and "shout: no type hint for text" in msg


def test_upload_checks_the_file_before_keeping_it(ws, tmp_path):
    good = tmp_path / "up_tools.py"
    good.write_text(EXAMPLE_TOOL)
    files, fns, _, msg = on_upload(ws, str(good), "", "python", "", "en")
    assert files == "tools/up_tools.py" and fns == "python, add" and (ws.root / "tools" / "up_tools.py").is_file()
    bad = tmp_path / "bad_tools.py"
    bad.write_text("def f(:\n")
    _, _, _, msg = on_upload(ws, str(bad), "", "", "", "en")
    assert "syntax error on line 1" in msg and not (ws.root / "tools" / "bad_tools.py").exists()
    assert on_upload(ws, None, "", "", "", "en")[3] == ""


def test_add_items():
    assert add_items("a, b\nc", ["b", "d", "d"]) == "a, b, c, d"
    assert add_items("", []) == ""


# ----------------------------------------------------------------------------- the Build form

def test_build_form_has_the_tools_section_with_each_field_once(tmp_path):
    import gradio as gr

    from app.build_tab import SECTIONS, BuildTab
    from app.fields import Registry
    from app.form import fields

    assert "tools" in [name for name, _, _ in SECTIONS]
    config = StudioConfig.create(ROOT, tmp_path / "runs")
    with gr.Blocks():
        tab = BuildTab(config, Registry(), gr.State("en"))
    comps = tab.form.comps
    assert set(comps) == {f.path for f in fields()}  # every field has exactly one widget
    for path in ("tools.functions", "tools.files", "tools.environment", "tools.parser", "tools.timeout_s",
                 "tools.max_result_chars", "rollout.max_turns"):
        assert comps[path].elem_id == "field-" + path.replace(".", "-")
    assert len({id(c) for c in comps.values()}) == len(comps)


def test_the_tools_section_round_trips_through_the_form():
    from app.form import spec_to_values, values_to_spec
    from backend.spec import RunSpec

    data = RunSpec().model_dump(mode="json")
    data["tools"].update(functions=["add", "python"], files=["tools/my_tools.py"], environment="", parser="hermes",
                         timeout_s=3.5, max_result_chars=500)
    data["rollout"]["max_turns"] = 4
    spec = RunSpec.model_validate(data)
    vals = spec_to_values(spec)
    assert vals["tools.functions"] == "add, python"
    assert values_to_spec(vals) == spec
    assert json.loads(json.dumps(vals))  # plain widget values
