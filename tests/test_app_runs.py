"""Run list, incremental run-directory reading and the samples view, on fabricated run directories."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from app.config import StudioConfig
from app.runlist import find_run, format_duration, progress, run_info, runs_table
from app.samples_view import SampleFilter, group_rows, render_step
from app.store import RunStore
from backend.rundir import RunDir


def make_run(root: Path, rid: str, state: str = "finished", steps: int = 3, pid: int | None = None,
             error: str = "", samples: bool = True, preset: str = "tiny-cpu") -> RunDir:
    run = RunDir(root / rid)
    run.path.mkdir(parents=True)
    run.spec_path.write_text("model:\n  name_or_path: assets/tiny-add\n")
    now = time.time()
    run.write_status(state=state, step=steps, total_steps=10, preset=preset, error=error, started_at=now - 65,
                     reward=0.5 + steps / 10, step_s=2.0, eta_s=14.0, pid=pid,
                     pid_create_time=None)
    run.append_jsonl(run.metrics_path, [{"step": i, "time": now - 60 + i, "reward": i / 10, "loss": 0.1}
                                        for i in range(1, steps + 1)])
    if samples:
        rows = []
        for s in range(1, steps + 1):
            for g in range(2):
                for k in range(4):
                    rows.append({"step": s, "group": g, "prompt": f"{g}+{g}=", "completion": f"<b>{k}</b>",
                                 "solution": str(2 * g), "rewards": {"exact_match": float(k == 0), "digit_match": None},
                                 "reward": float(k == 0) + s, "advantage": 1.0 if k == 0 else -0.3, "length": 3,
                                 "truncated": k == 3})
        run.append_jsonl(run.samples_path, rows)
    return run


def test_runs_table_rows_newest_first_and_dead_process_reads_failed(tmp_path):
    make_run(tmp_path, "20260101-000000-a-0001", "finished")
    make_run(tmp_path, "20260102-000000-b-0002", "running", pid=2**22 + 12345)  # no such process
    (tmp_path / "not-a-run").mkdir()
    infos, rows = runs_table(tmp_path)
    assert [i.run_id for i in infos] == ["20260102-000000-b-0002", "20260101-000000-a-0001"]
    assert infos[0].state == "failed"  # an active state whose process is gone
    assert rows[1][:5] == ["20260101-000000-a-0001", "tiny-cpu", "finished", "3/10", "0.800"]
    assert rows[1][6] in ("1m 05s", "1m 04s", "1m 06s", "0s") or rows[1][6].endswith("s")


def test_progress_and_durations(tmp_path):
    info = run_info(make_run(tmp_path, "r1", "running", steps=4, pid=os.getpid()))
    p = progress(info, tokens_per_s=99.0)
    assert p.fraction == pytest.approx(0.4) and p.eta_s == 14.0 and p.tokens_per_s == 99.0
    assert info.active and p.elapsed_s >= 60
    assert format_duration(5) == "5s" and format_duration(65) == "1m 05s" and format_duration(3 * 3600 + 60) == "3h 01m"
    assert format_duration(None) == "" and format_duration(3 * 86400) == "3d 0h"


def test_find_run_refuses_traversal(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "ok")
    make_run(tmp_path, "outside")
    (runs / "link").symlink_to(tmp_path / "outside")
    assert find_run(runs, "ok") is not None
    for bad in ("../outside", "..", ".", "", "link", "ok/..", "/etc"):
        assert find_run(runs, bad) is None, bad


def test_store_reads_incrementally_and_tolerates_torn_lines(tmp_path):
    run = make_run(tmp_path, "r", steps=2)
    store = RunStore()
    cache = store.get(run.path)
    assert len(cache.refresh_metrics()) == 2
    v = cache.version
    assert len(cache.refresh_metrics()) == 2 and cache.version == v  # nothing new: same version, no redraw
    with run.metrics_path.open("a") as f:
        f.write('{"step": 3, "reward": 0.3}\n{"step": 4, "rew')  # a writer mid-line
    assert len(cache.refresh_metrics()) == 3
    with run.metrics_path.open("a") as f:
        f.write('ard": 0.4}\n')
    table = cache.refresh_metrics()
    assert len(table) == 4 and table.last("reward") == 0.4
    run.truncate_after_step(1)  # resume rewrites the file: the cache starts over
    assert len(cache.refresh_metrics()) == 1
    assert store.get(run.path) is cache


def test_samples_index_and_step_rows(tmp_path):
    run = make_run(tmp_path, "r", steps=3)
    cache = RunStore().get(run.path)
    assert cache.sample_steps() == [1, 2, 3]
    rows = cache.step_rows(2)
    assert len(rows) == 8 and {r["step"] for r in rows} == {2}
    assert sorted(cache.step_rewards(3)) == [3.0] * 6 + [4.0] * 2
    run.append_jsonl(run.samples_path, [{"step": 4, "group": 0, "prompt": "p", "completion": "c", "reward": 9.0}])
    assert cache.sample_steps()[-1] == 4 and cache.step_rows(4)[0]["reward"] == 9.0
    assert cache.step_rows(99) == []


def test_render_step_escapes_and_marks_best_and_worst(tmp_path):
    run = make_run(tmp_path, "r", steps=1)
    rows = RunStore().get(run.path).step_rows(1)
    out = render_step(rows)
    assert "<b>0</b>" not in out and "&lt;b&gt;0&lt;/b&gt;" in out  # model output is escaped
    assert out.count('class="gs-group"') == 2
    assert out.count("gs-best") == 2 and out.count("gs-worst") == 6  # ties for worst are all marked
    assert "exact_match" in out and "–" in out  # a None reward shows as a dash
    assert "✂" in out  # truncated completions are flagged
    assert len(group_rows(rows, SampleFilter(reward_min=1.5))) == 2
    only = group_rows(rows, SampleFilter(text="1+1="))
    assert [g for g, _ in only] == [1]
    assert "No samples" in render_step(rows, SampleFilter(reward_min=100))
    assert "gs-replay" not in out
    rows[0]["replayed"] = True  # put back by success replay: marked, with the label as its tooltip
    marked = render_step(rows, labels={"replayed": "from before"})
    assert marked.count('class="gs-replay"') == 1 and 'title="from before"' in marked


def test_delete_refuses_active_and_outside_runs(tmp_path, monkeypatch):
    from app.fields import Registry
    from app.runs_tab import RunsTab

    config = StudioConfig.create(tmp_path, tmp_path / "runs")
    tab = RunsTab.__new__(RunsTab)  # the handlers only need the config
    tab.config, tab.reg = config, Registry()
    live = make_run(config.runs_dir, "live", "running", pid=os.getpid())
    run = RunDir(live.path)
    run.write_status(pid_create_time=__import__("psutil").Process().create_time())
    done = make_run(config.runs_dir, "done", "finished")
    make_run(tmp_path, "outside")
    _, msg = tab.on_confirm_delete("live", "en")
    assert "still active" in msg and live.path.exists()
    _, msg = tab.on_confirm_delete("../outside", "en")
    assert "Refused" in msg and (tmp_path / "outside").exists()
    _, msg = tab.on_confirm_delete("done", "en")
    assert "Deleted" in msg and not done.path.exists()


def test_refresh_outputs_skip_unchanged(tmp_path):
    """A second tick with nothing new sends no figures (cheap with many open sessions)."""
    import gradio as gr

    from app.compare_tab import CompareTab
    from app.fields import Registry
    from app.page import session_defaults
    from app.runs_tab import RunsTab

    config = StudioConfig.create(tmp_path, tmp_path / "runs")
    rid = "20260101-000000-a-0001"
    make_run(config.runs_dir, rid, "finished", steps=5)
    with gr.Blocks():
        tab = RunsTab(config, Registry(), gr.State("en"))
        cmp = CompareTab(config, Registry(), gr.State("en"))
    m = session_defaults("en", None)
    out1 = tab.refresh(m)
    assert out1[1]["value"] == rid and m["run_id"] == rid
    drawn = [f for f in out1[5:] if hasattr(f, "to_json")]
    assert len(drawn) == 4  # the collapsed "more charts" are not drawn
    out2 = tab.refresh(m)
    skipped = [o for o in out2 if isinstance(o, dict) and o.get("__type__") == "update" and len(o) == 1]
    assert len(skipped) == len(out2)  # nothing changed: nothing sent
    m["panels"] = ["more", "log"]
    out3 = tab.refresh(m)
    assert len([f for f in out3[5:] if hasattr(f, "to_json")]) == 5  # opened: drawn once
    assert isinstance(out3[tab.refresh_outputs().index(tab.log)], str)  # the log tail
    m["x_mode"] = "elapsed"
    assert len([f for f in tab.refresh(m)[5:] if hasattr(f, "to_json")]) == 9  # a view change redraws at once

    s1 = tab.refresh_samples(m)
    assert "gs-group" in s1[1] and s1[0]["value"] == 5 and m["step"] == 5
    m["step"], m["follow"] = 3, False
    s2 = tab.refresh_samples(m)
    assert s2[0]["value"] == 3 and "gs-group" in s2[1]
    assert json.loads(s2[2].to_json())["data"]
    m["text"] = "no such text"
    assert "No samples match" in tab.refresh_samples(m)[1]

    m["cmp_runs"] = [rid, "gone"]
    c1 = cmp.refresh(m)
    assert m["cmp_runs"] == [rid] and c1[2].data
    assert all(isinstance(o, dict) for o in cmp.refresh(m))  # unchanged: all skipped


def test_stop_twice_kills_the_process_group(tmp_path):
    """First Stop asks politely (SIGTERM); a run that does not exit is killed, with its group, by the second."""
    import subprocess
    import sys

    import psutil

    from app.fields import Registry
    from app.runs_tab import RunsTab

    config = StudioConfig.create(tmp_path, tmp_path / "runs")
    tab = RunsTab.__new__(RunsTab)
    tab.config, tab.reg = config, Registry()
    run = make_run(config.runs_dir, "stubborn", "running")
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             "time.sleep(60)"], start_new_session=True)
    try:
        time.sleep(0.5)
        run.write_status(pid=proc.pid, pid_create_time=psutil.Process(proc.pid).create_time())
        assert "Stopping" in tab.on_stop("stubborn", "en")
        time.sleep(0.3)
        assert proc.poll() is None and run.read_status()["state"] == "stopping"
        assert "Killed" in tab.on_stop("stubborn", "en")
        assert proc.wait(10) != 0
        assert run.read_status()["state"] == "stopped"
        assert "not running" in tab.on_stop("stubborn", "en")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_progress_html_shows_failures_prominently(tmp_path):
    from app.runs_tab import progress_html

    info = run_info(make_run(tmp_path, "bad", "failed", error="CUDA out of memory <in> step 3"))
    out = progress_html(info, None, "en")
    assert 'id="run-error"' in out and "Run failed" in out
    assert "CUDA out of memory &lt;in&gt; step 3" in out  # escaped
    zh = progress_html(info, None, "zh")
    assert "运行失败" in zh and "失败" in zh
    ok = progress_html(run_info(make_run(tmp_path, "ok", "running", pid=os.getpid())), 123.0, "en")
    assert "run-error" not in ok and "123 tokens/s" in ok and "ETA" in ok


def test_controls_follow_the_run_state():
    """Issue 29 items 4 and 8: Resume only for stopped or failed runs, Stop only while a run is active."""
    from app.runlist import controls

    for state in ("stopped", "failed"):
        assert controls(state).resume and not controls(state).stop
    for state in ("starting", "running"):
        assert controls(state).stop and not controls(state).resume and controls(state).stop_key == "stop"
    assert controls("stopping").stop_key == "force_kill"
    assert not controls("finished").resume and not controls("finished").stop
    assert not controls(None).resume and not controls(None).stop


def test_first_start_and_training_time_survive_a_resume(tmp_path):
    """Issue 29 item 4: after a resume the table keeps the first start time and the training time summed over
    sessions (status elapsed_s), not the new session's start and its few seconds."""
    from app.runlist import format_time
    from backend.rundir import created_at

    run = make_run(tmp_path, "20260101-000000-a-0001", "finished")
    first = time.time() - 3600
    run.write_status(created_at=first, started_at=time.time() - 12, elapsed_s=148.0)  # the resumed session
    info = run_info(run)
    assert info.row()[5] == format_time(first)
    assert info.row()[6] == "2m 28s"
    # a run written before created_at existed: the time its id names
    assert created_at("20260101-000000-a-0001", {}) == time.mktime((2026, 1, 1, 0, 0, 0, 0, 0, -1))
    assert created_at("odd-name", {}) is None


def test_refresh_greys_resume_and_clears_the_kill_hint(tmp_path):
    """The tick's controls: a finished run offers neither Stop nor Resume and says why; when the selected run
    leaves the active states the 'Click again to kill it now' message is cleared."""
    import gradio as gr

    from app.fields import Registry
    from app.page import session_defaults
    from app.runs_tab import RunsTab

    config = StudioConfig.create(tmp_path, tmp_path / "runs")
    run = make_run(config.runs_dir, "20260101-000000-a-0001", "stopping", pid=os.getpid())
    with gr.Blocks():
        tab = RunsTab(config, Registry(), gr.State("en"))
    assert tab.stop_btn.interactive and not tab.resume_btn.interactive  # the page as first drawn
    names = ["table", "select", "progress", "stop", "resume", "hint", "msg"]
    m = session_defaults("en", None)
    out = dict(zip(names, tab.refresh(m), strict=False))
    assert out["stop"]["value"] == "Force kill" and out["stop"]["interactive"] and not out["resume"]["interactive"]
    assert "stopping" in out["hint"]
    run.write_status(state="stopped")
    out = dict(zip(names, tab.refresh(m), strict=False))
    assert not out["stop"]["interactive"] and out["resume"]["interactive"] and out["hint"] == ""
    assert out["msg"] == ""  # the stop message spoke of a run that has now stopped
    out = dict(zip(names, tab.refresh(m), strict=False))
    assert out["msg"] == gr.skip() and out["stop"] == gr.skip()  # nothing changed: nothing sent
    run.write_status(state="finished")
    out = dict(zip(names, tab.refresh(m), strict=False))
    assert not out["resume"]["interactive"] and "finished" in out["hint"]
    assert "finished" in tab.on_resume(run.run_id, "en")  # a click from a stale page is refused, saying why


def test_the_runs_table_and_the_status_line_show_one_reading(tmp_path):
    """A new step of the selected run redraws its table row on the same tick as the status line, from the same
    read (the table's throttle once left the row a few steps behind: reward 1.109 beside a status line's 1.250)."""
    import gradio as gr
    import psutil

    from app.fields import Registry
    from app.page import session_defaults
    from app.runs_tab import RunsTab

    config = StudioConfig.create(tmp_path, tmp_path / "runs")
    run = make_run(config.runs_dir, "20260101-000000-a-0001", "running", steps=3, pid=os.getpid())
    run.write_status(pid_create_time=psutil.Process().create_time(), reward=1.109)
    with gr.Blocks():
        tab = RunsTab(config, Registry(), gr.State("en"))
    m = session_defaults("en", None)
    outs = tab.refresh_outputs()
    first = tab.refresh(m)
    assert first[outs.index(tab.table)]["data"][0][4] == "1.109" and "reward 1.109" in first[outs.index(tab.progress)]
    run.write_status(step=4, reward=1.25)  # the next step, a moment later (within the table's throttle)
    second = tab.refresh(m)
    row = second[outs.index(tab.table)]["data"][0]
    assert row[3:5] == ["4/10", "1.250"] and "reward 1.250" in second[outs.index(tab.progress)]
    info = run_info(run)
    assert info.latest().reward == info.row()[4] == "1.250"
