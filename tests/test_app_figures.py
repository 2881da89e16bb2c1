"""Figures: pure functions from metric rows to Plotly figures, fast for long runs."""

from __future__ import annotations

import math
import random
import time

import numpy as np
import pytest

from app.figures import (
    CHART_IDS,
    MAX_POINTS,
    MetricTable,
    build_dashboard,
    compare_figure,
    downsample_mean,
    downsample_minmax,
    ema,
    prepare,
    reward_figure,
    reward_histogram,
    timing_figure,
    x_values,
)


def rows(n: int, start: int = 1, eval_every: int = 0, gpus: int = 0) -> list[dict]:
    rng = random.Random(0)
    out = []
    for i in range(start, start + n):
        r = {"step": i, "time": 1.7e9 + 2.0 * i, "elapsed_s": 2.0 * i, "reward": rng.random(), "reward_std": 0.2,
             "rewards/exact_match/mean": rng.random(), "rewards/digit_match/mean": rng.random(),
             "frac_reward_zero_std": 0.1, "completions/mean_length": 5.0, "completions/min_length": 2.0,
             "completions/max_length": 8.0, "completions/clipped_ratio": 0.05, "entropy": 0.4,
             "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.01, "clip_ratio/region_mean": 0.01,
             "loss": rng.random() / 10, "grad_norm": 1.0, "learning_rate": 1e-4, "timing/rollout_s": 1.0,
             "timing/reward_s": 0.1, "timing/train_s": 0.8, "timing/weight_sync_s": 0.0, "timing/step_s": 2.0,
             "throughput/completion_tokens_per_s": 120.0, "staleness": 0, "system/ram_gb": 2.5,
             "system/cpu_percent": 80.0}
        for g in range(gpus):
            r[f"system/gpu{g}_util"] = 50.0
            r[f"system/gpu{g}_mem_gb"] = 20.0
        if eval_every and i % eval_every == 0:
            r["eval/reward"] = 0.5
        out.append(r)
    return out


def test_table_pads_missing_and_late_keys_and_ignores_junk():
    t = MetricTable([{"step": 1, "reward": 1.0}, {"step": 2, "kl": 0.1, "reward": None}])
    t.extend([{"step": 3, "reward": "oops", "eval/acc": 0.5}])
    assert len(t) == 3
    assert np.isnan(t.get("kl")[0]) and t.get("kl")[1] == pytest.approx(0.1)
    assert np.isnan(t.get("eval/acc")[:2]).all() and t.get("eval/acc")[2] == 0.5
    assert t.get("reward")[0] == 1.0 and np.isnan(t.get("reward")[1:]).all()
    assert t.last("reward") == 1.0 and t.last("nothing") is None
    assert t.metric_names() == ["eval/acc", "kl", "reward"]
    assert np.isnan(t.get("absent")).all()


def test_minmax_downsampling_keeps_spikes_and_bounds_points():
    n = 20_000
    x = np.arange(n, dtype=float)
    y = np.zeros(n)
    y[12_345] = 99.0
    y[777] = -5.0
    xs, ys = downsample_minmax(x, y)
    assert len(xs) <= MAX_POINTS + 1
    assert 99.0 in ys and -5.0 in ys
    assert xs[-1] == n - 1  # the newest point is always drawn
    assert np.all(np.diff(xs) > 0)


def test_mean_downsampling_and_ema():
    x = np.arange(10_001, dtype=float)
    xs, (ys,), size = downsample_mean(x, [np.ones(10_001)], 1000)
    assert len(xs) <= 1001 and size == 11 and np.allclose(ys, 1.0) and xs[-1] == 10_000
    assert np.allclose(ema(np.full(50, 3.0), 0.9), 3.0)  # debiased: no ramp-up from 0
    sm = ema(np.array([0.0, 10.0, 0.0, 10.0]), 0.5)
    assert sm[-1] < 10 and sm[-1] > 0
    assert np.array_equal(ema(np.array([1.0, 2.0]), 0.0), np.array([1.0, 2.0]))
    xs, ys = prepare(np.arange(4.0), np.array([1.0, np.nan, 3.0, 4.0]))
    assert list(xs) == [0.0, 2.0, 3.0]


def test_dashboard_has_every_chart_and_the_reward_band():
    t = MetricTable(rows(50, eval_every=10, gpus=2))
    figs = build_dashboard(t, {"reward": "R"})
    assert tuple(figs) == CHART_IDS
    rf = figs["reward"]
    names = [tr.get("name") for tr in rf.data]
    assert "reward" in names and "exact_match" in names and "digit_match" in names
    band_hi, band_lo, mean = rf.data[0], rf.data[1], rf.data[2]
    assert band_lo["fill"] == "tonexty"
    assert np.allclose(np.asarray(band_hi["y"]) - np.asarray(mean["y"]), 0.2)
    assert np.allclose(np.asarray(mean["y"]) - np.asarray(band_lo["y"]), 0.2)
    assert rf.layout["title"]["text"] == "R"
    tele = [tr["name"] for tr in figs["telemetry"].data]
    assert "gpu0 util %" in tele and "gpu1 mem GB" in tele and "RAM GB" in tele
    assert [tr["name"] for tr in figs["eval"].data] == ["eval/reward"]
    assert len(figs["eval"].data[0]["x"]) == 5
    timing = figs["timing"]
    assert all(tr["stackgroup"] == "phases" for tr in timing.data[:4])
    pol = [tr["name"] for tr in figs["policy"].data]
    assert "kl" not in pol and "entropy" in pol  # kl is absent when beta = 0: tolerated, not drawn


@pytest.mark.parametrize("mode, smoothing", [("step", 0.0), ("wall", 0.7), ("elapsed", 0.0)])
def test_every_figure_is_a_valid_plotly_spec(mode, smoothing):
    """The specs are plain dicts for speed: plotly's validators check every property name and value here."""
    t = MetricTable(rows(40, eval_every=7, gpus=1))
    figs = list(build_dashboard(t, {}, x_mode=mode, smoothing=smoothing).values())
    figs += [reward_histogram([("a", [0.0, 1.0])], "h"), compare_figure([("a", t)], "loss", "c"),
             build_dashboard(MetricTable(), {})["reward"]]
    for f in figs:
        f.to_go()  # raises on an invalid property
        text = f.to_json()
        assert "NaN" not in text and "Infinity" not in text  # the page parses it with JSON.parse


def test_empty_and_partial_metrics_give_placeholders():
    figs = build_dashboard(MetricTable(), {}, empty_message="nothing")
    for f in figs.values():
        assert not f.data and f.layout["annotations"][0]["text"] == "nothing"
    t = MetricTable([{"step": 1, "reward": 0.5}])
    assert reward_figure(t, "r").data  # a single step still draws (markers)
    assert not build_dashboard(t, {})["timing"].data


@pytest.mark.parametrize("mode", ["step", "elapsed", "wall"])
def test_x_modes(mode):
    t = MetricTable(rows(10))
    x = x_values(t, mode)
    if mode == "step":
        assert list(x) == list(range(1, 11))
    elif mode == "elapsed":
        assert x[-1] == pytest.approx(20.0 / 3600)
    else:
        assert x.dtype.kind == "M" and not np.isnat(x).any()
    assert build_dashboard(t, {}, x_mode=mode, smoothing=0.6)["reward"].data


def test_histogram_and_compare():
    h = reward_histogram([("first", [0.0, 0.0, 1.0]), ("latest", [1.0, 2.0, None, math.nan]), ("none", [])], "H")
    assert [tr["name"] for tr in h.data] == ["first", "latest"]
    assert h.layout["barmode"] == "overlay"
    assert not reward_histogram([], "H").data
    a, b = MetricTable(rows(30)), MetricTable(rows(10))
    c = compare_figure([("a", a), ("b", b), ("c", MetricTable())], "loss", "cmp")
    assert [tr["name"] for tr in c.data] == ["a", "b"]
    assert not compare_figure([("a", a)], "nope", "cmp").data


def test_twenty_thousand_steps_render_fast():
    t0 = time.perf_counter()
    table = MetricTable(rows(20_000, eval_every=50))
    t_table = time.perf_counter() - t0
    build_dashboard(table, {})  # warm plotly's validators once, as a running studio has
    t1 = time.perf_counter()
    figs = build_dashboard(table, {}, smoothing=0.8)
    payload = sum(len(f.to_json()) for f in figs.values())  # what Gradio sends to the page
    t_figs = time.perf_counter() - t1
    print(f"20k steps: table {t_table:.3f}s, 9 figures + JSON {t_figs:.3f}s, {payload / 1e6:.2f} MB")
    for f in figs.values():
        for tr in f.data:
            assert len(tr["x"]) <= MAX_POINTS + 1
    assert t_figs < 1.0


def test_timing_chart_splits_training_when_the_run_logs_the_split():
    split = rows(5)
    for r in split:
        r.update({"timing/forward_backward_s": 0.6, "timing/optimizer_s": 0.2})
    names = [tr["name"] for tr in timing_figure(MetricTable(split), "t").data]
    assert names == ["rollout", "reward", "forward_backward", "optimizer", "weight_sync", "step"]
    names = [tr["name"] for tr in timing_figure(MetricTable(rows(5)), "t").data]  # an older run: train whole
    assert names == ["rollout", "reward", "train", "weight_sync", "step"]


def test_policy_chart_draws_each_objectives_own_metrics():
    base = rows(20)
    cispo = [{k: v for k, v in r.items() if not k.startswith("clip_ratio/")}
             | {"cispo_clip_ratio": 0.02, "entropy_coef": 0.01 + 0.001 * r["step"],
                "off_policy_mask/masked_ratio": 0.1, "entropy_mask/masked_ratio": 0.8} for r in base]
    names = [tr["name"] for tr in build_dashboard(MetricTable(cispo), {})["policy"].data]
    assert names == ["entropy", "entropy coef", "cispo clip", "off-policy masked", "low-entropy masked"]
    fig = build_dashboard(MetricTable(cispo), {})["policy"]
    fig.to_go()
    secondary = {tr["name"] for tr in fig.data if tr.get("yaxis") == "y2"}
    assert secondary == {"cispo clip", "off-policy masked", "low-entropy masked"}  # fractions on the right axis
    # a plain GRPO run keeps its chart as it was: no empty traces for metrics it does not log
    names = [tr["name"] for tr in build_dashboard(MetricTable(base), {})["policy"].data]
    assert names == ["entropy", "clip low", "clip high", "clip region"]


def test_telemetry_chart_draws_the_peak_of_each_phase():
    t = MetricTable([{"step": s, "system/ram_gb": 1.0, "system/peak_gb/rollout": 1.5, "system/peak_gb/train": 2.0,
                      "system/peak_gpu_gb/train": 3.0} for s in (1, 2)])
    tele = [tr["name"] for tr in build_dashboard(t, {})["telemetry"].data]
    assert {"peak GB rollout", "peak GB train", "GPU peak GB train", "RAM GB"} <= set(tele)


@pytest.mark.parametrize("n", [3, 40])
def test_step_axis_ticks_are_whole_steps(n):
    """Issue 29 item 10: a short run's step axis showed ticks like 1.5; step ticks are whole numbers."""
    table = MetricTable(rows(n))
    xaxis = reward_figure(table, "reward").to_plotly_json()["layout"]["xaxis"]
    assert xaxis["tickformat"] == "d"
    if n < 10:  # a few steps: one tick per step, not Plotly's halves
        assert xaxis["dtick"] == 1
    elapsed = reward_figure(table, "reward", x_mode="elapsed").to_plotly_json()["layout"]["xaxis"]
    assert "dtick" not in elapsed and elapsed.get("tickformat") != "d"  # hours stay fractional


def test_every_chart_word_follows_the_language():
    """Issue 29 item 11: in Chinese no legend name or axis title is left in English (metric keys that are
    identifiers, reward function names and GPU names stay as they are)."""
    from types import SimpleNamespace

    from app.locales import CHART_WORDS, chart_words

    table = MetricTable([{**r, "kl": 0.01, "entropy_coef": 0.01, "system/peak_gb/rollout": 1.5}
                         for r in rows(20, eval_every=5, gpus=1)])
    best = SimpleNamespace(step=10, metric="eval/reward", value=0.5)
    zh, english = chart_words("zh"), set(CHART_WORDS["zh"]) - set(CHART_WORDS["zh"].values())
    figs = {**build_dashboard(table, {}, x_mode="elapsed", best=best, names=zh),
            "hist": reward_histogram([("a", [0.1, 0.5])], "h", names=zh),
            "cmp": compare_figure([("run1", table)], "reward", "c", x_mode="elapsed", names=zh)}
    shown = []
    for fig in figs.values():
        shown += [tr["name"] for tr in fig.data if tr.get("name")]
        shown += [tr["text"][0] for tr in fig.data if tr.get("text")]
        shown += [ax["title"]["text"] for k, ax in fig.layout.items() if k.startswith(("xaxis", "yaxis"))
                  and isinstance(ax, dict) and ax.get("title")]
    assert {"奖励", "± 标准差", "小时", "秒", "回答数", "留出集 reward", "最佳检查点 step-10", "峰值 GB rollout",
            "gpu0 显存 GB", "gpu0 利用率 %", "学习率", "采样"} <= set(shown), shown
    left = [s for s in shown if s in english or any(w in s for w in ("held-out", "best", "peak", "mem GB", "util"))]
    assert not left, left
    # English stays English
    en = build_dashboard(table, {}, x_mode="elapsed", names=chart_words("en"))
    assert en["reward"].layout["xaxis"]["title"]["text"] == "hours"
