"""Per-phase peak memory (backend.train.telemetry): each phase reports the peak while it ran, not the process's
lifetime peak, and the trainer's metrics carry the rollout and train phases."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from backend.train import telemetry
from backend.train.telemetry import GB, Telemetry, peak_rss, reset_peak_rss


def _mark_resets() -> bool:
    """Whether this kernel resets the high-water mark: after 128 MB touched and freed, a reset must bring it down."""
    x = torch.ones(128 << 20 >> 2)
    del x
    return reset_peak_rss()


resets = pytest.mark.skipif(not _mark_resets(), reason="this kernel does not reset VmHWM through /proc/self/clear_refs")


def test_a_kernel_that_keeps_the_mark_gets_no_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    # CI's kernel took the clear_refs write and kept the lifetime peak, and every phase reported it
    fake = {"VmHWM": 3 * GB, "VmRSS": 1 * GB}
    monkeypatch.setattr(telemetry, "_vm", fake.get)
    monkeypatch.setattr(telemetry.Path, "write_text", lambda self, text: len(text))
    assert not reset_peak_rss()
    tel = Telemetry()
    with tel.phase("rollout"):
        pass
    assert "system/peak_gb/rollout" not in tel.sample()
    fake["VmHWM"] = 1 * GB + (1 << 20)  # a mark that came down, give or take a thread's megabyte
    assert reset_peak_rss()
    with tel.phase("rollout"):
        pass
    assert tel.sample()["system/peak_gb/rollout"] == pytest.approx(1 + 1 / 1024)


@resets
def test_a_phase_reports_its_own_peak() -> None:
    tel = Telemetry()
    with tel.phase("big"):
        # 256 MB mapped and touched page by page, past malloc: after the trainer's tests have run in this process,
        # its malloc settings (train/memory.py) keep freed memory resident, so a malloc'd 256 MB may not raise RSS
        big_map = mmap.mmap(-1, 256 << 20)
        for i in range(0, 256 << 20, mmap.PAGESIZE):
            big_map[i] = 1
        big_map.close()
    with tel.phase("small"):
        torch.ones(1024).sum()
    with tel.phase("small"):  # a phase that runs twice keeps its larger peak
        torch.ones(8).sum()
    got = tel.sample()
    big, small = got["system/peak_gb/big"], got["system/peak_gb/small"]
    assert big - small > 0.2, (big, small)  # the 256 MB are the big phase's, not the later ones'
    assert small * GB <= (peak_rss() or 0) + 1  # each figure is a high-water mark since its phase began
    assert "system/peak_gb/big" not in tel.sample()  # reported once, with the step that ran it


@resets
def test_the_trainer_logs_the_peak_of_each_phase(tmp_path: Path) -> None:
    from tests.test_trainer import metrics, train

    run, _ = train(tmp_path, "algorithm.max_steps=2", "algorithm.beta=0.04")
    rows = metrics(run)
    for r in rows:
        assert {"system/peak_gb/rollout", "system/peak_gb/reference", "system/peak_gb/train"} <= set(r), r.keys()
        assert 0 < r["system/peak_gb/rollout"] < 64 and 0 < r["system/peak_gb/train"] < 64
