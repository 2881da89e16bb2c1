"""Hostile input: a spec nobody vetted (a form reachable from a network, a run directory copied into runs/)
cannot make the studio or the trainer read, load or run anything outside the workspace.

Each case is refused before anything runs, with the field named; a marker file that the hostile program
would write shows that it never ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.form import spec_to_values, validate_values
from app.paths import Workspace
from backend import launcher
from backend.checks import check_resume, resume_workspace
from backend.project import child_env
from backend.rundir import RunDir
from backend.spec import SpecError, load_spec, save_spec

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "presets" / "tiny-cpu.yaml"


def _workspace(tmp_path: Path) -> Path:
    """A workspace holding a copy of the tiny model and its data, and a runs folder."""
    ws = tmp_path / "ws"
    (ws / "runs").mkdir(parents=True)
    for name in ("tiny-add", "data"):
        shutil.copytree(ROOT / "assets" / name, ws / "assets" / name)
    return ws


def _hostile_program(where: Path, marker: Path) -> Path:
    """An executable script that leaves `marker` behind when it runs."""
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(f"#!/bin/sh\ntouch {marker}\n")
    where.chmod(0o755)
    return where


def _copied_run(ws: Path, overrides: list[str]) -> RunDir:
    """A stopped run directory as someone could copy it into runs/: spec.yaml and status.json, nothing else."""
    run = RunDir(ws / "runs" / "20260101-000000-copied-beef")
    run.path.mkdir(parents=True)
    save_spec(load_spec(TINY, overrides), run.spec_path)
    run.write_status(state="stopped", step=3, base_dir="/")  # base_dir "/" would put every path "inside"
    return run


def _hostile_resumes(tmp_path: Path) -> list[tuple[list[str], str]]:
    outside = tmp_path / "outside"
    marker = tmp_path / "ran"
    plugin = outside / "evil.py"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef evil(completions, **kw):\n    return [0.0] * len(completions)\n")
    script = _hostile_program(outside / "python", marker)
    return [([f"rewards.plugins=[{plugin}]", "rewards.functions=[{name: exact_match}, {name: evil}]"], "rewards.plugins"),
            (["rollout.placement=separate", f"rollout.worker_python={script}"], "rollout.worker_python"),
            ([f"model.name_or_path={ROOT / 'assets' / 'tiny-add'}"], "model.name_or_path")]


@pytest.mark.parametrize("case", [0, 1, 2], ids=["plugin-outside", "worker-python-outside", "model-outside"])
def test_resume_of_a_copied_run_runs_starts_check(tmp_path: Path, case: int) -> None:
    ws = _workspace(tmp_path)
    overrides, field = _hostile_resumes(tmp_path)[case]
    run = _copied_run(ws, overrides)
    with pytest.raises(SpecError) as err:
        launcher.resume(run, ws)
    assert [i.field for i in err.value.issues] == [field] and "outside the workspace" in str(err.value)
    assert run.read_status()["state"] == "stopped" and "pid" not in run.read_status()  # nothing was spawned
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("case", [0, 1, 2], ids=["plugin-outside", "worker-python-outside", "model-outside"])
def test_cli_resume_runs_starts_check(tmp_path: Path, case: int) -> None:
    ws = _workspace(tmp_path)
    overrides, field = _hostile_resumes(tmp_path)[case]
    run = _copied_run(ws, overrides)
    proc = subprocess.run([sys.executable, "-m", "backend.train", "--resume", str(run.path)], cwd=ws,
                          capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == 2, proc.stderr
    assert f"- {field}:" in proc.stderr and "outside the workspace" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "ran").exists()


def test_code_inside_a_run_directory_is_never_run(tmp_path: Path) -> None:
    """The runs folder is inside the workspace, so a copied run can carry its plugin, or model code for
    trust_remote_code, inside itself: refused on Resume (launcher and CLI) and at Start (a clone into the form)."""
    ws = _workspace(tmp_path)
    marker = tmp_path / "ran"
    run = _copied_run(ws, [])
    (run.path / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n\ndef evil(completions, **kw):\n"
                                      "    return [0.0] * len(completions)\n")
    save_spec(load_spec(TINY, [f"rewards.plugins=[{run.path / 'evil.py'}]",
                               "rewards.functions=[{name: exact_match}, {name: evil}]"]), run.spec_path)
    with pytest.raises(SpecError, match="inside the run directory 20260101-000000-copied-beef: code in a run directory"):
        launcher.resume(run, ws)
    proc = subprocess.run([sys.executable, "-m", "backend.train", "--resume", str(run.path)], cwd=ws,
                          capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == 2 and "- rewards.plugins:" in proc.stderr and "inside the run directory" in proc.stderr
    spec = load_spec(run.spec_path)
    v = validate_values(spec_to_values(spec), ws, Workspace(ws))
    assert any("inside the run directory" in m for m in v.by_field.get("rewards.plugins", [])), v.by_field
    assert not marker.exists()

    trusting = run  # the same copied run, now asking to trust the model code in its checkpoint
    save_spec(load_spec(TINY, ["model.trust_remote_code=true"]), trusting.spec_path)
    code = trusting.checkpoints_dir / "step-3" / "model" / "modeling_evil.py"
    code.parent.mkdir(parents=True)
    code.write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(SpecError, match="checkpoints hold Python files .*modeling_evil.py"):
        launcher.resume(trusting, ws)
    assert not marker.exists() and trusting.read_status()["state"] == "stopped"


def test_resume_inside_the_workspace_passes_the_same_check(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    run = _copied_run(ws, [])
    assert check_resume(run, resume_workspace(run, ws)).model.name_or_path == "assets/tiny-add"


def test_form_never_runs_the_worker_interpreter(tmp_path: Path) -> None:
    """Validating the form (every change) does not run rollout.worker_python, even one inside the workspace."""
    ws = _workspace(tmp_path)
    script = _hostile_program(ws / "envs" / "python", tmp_path / "ran")
    spec = load_spec(TINY, ["rollout.placement=separate", f"rollout.worker_python={script}", "output.runs_dir=runs"])
    validate_values(spec_to_values(spec), ws, Workspace(ws))
    assert not (tmp_path / "ran").exists()


def test_worker_interpreter_outside_is_refused_at_start_without_running(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    script = _hostile_program(tmp_path / "outside" / "python", tmp_path / "ran")
    spec = load_spec(TINY, ["rollout.placement=separate", f"rollout.worker_python={script}", "output.runs_dir=runs"])
    v = validate_values(spec_to_values(spec), ws, Workspace(ws))
    assert any("outside the workspace" in m for m in v.by_field.get("rollout.worker_python", [])), v.by_field
    with pytest.raises(SpecError) as err:
        launcher.launch(spec, ws, workspace=Workspace(ws))
    assert [i.field for i in err.value.issues] == ["rollout.worker_python"]
    assert not (tmp_path / "ran").exists() and not any((ws / "runs").iterdir())


def test_deepspeed_config_outside_is_confined_and_does_not_tell_whether_it_exists(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    real = tmp_path / "outside" / "secret.json"
    real.parent.mkdir(parents=True)
    real.write_text("[1]")

    def messages(path: Path) -> list[str]:
        spec = load_spec(TINY, ["resources.deepspeed_stage=1", f"resources.deepspeed_config={path}", "output.runs_dir=runs"])
        v = validate_values(spec_to_values(spec), ws, Workspace(ws))
        return [m.replace(str(path), "PATH") for m in v.by_field.get("resources.deepspeed_config", [])]

    there, missing = messages(real), messages(real.with_name("missing.json"))
    assert there == missing and len(there) == 1 and "outside the workspace" in there[0]


def test_a_link_out_of_the_workspace_is_a_path_not_a_hub_id(tmp_path: Path) -> None:
    """With the workspace elsewhere than the working directory, dir/file.jsonl linking outside is confined."""
    ws = _workspace(tmp_path)
    (ws / "dir").mkdir()
    os.symlink(ROOT / "assets" / "data" / "add_train.jsonl", ws / "dir" / "file.jsonl")
    assert Path.cwd() != ws
    spec = load_spec(TINY, ["data.sources=[dir/file.jsonl]", "data.eval_sources=[]", "output.eval_steps=0",
                            "output.runs_dir=runs"])
    v = validate_values(spec_to_values(spec), ws, Workspace(ws))
    assert any("outside the workspace" in m for m in v.by_field.get("data.sources", [])), v.by_field


# ----------------------------------------------------------------------------- the rollout worker's port


def test_rollout_worker_speaks_data_only_and_an_idle_connection_blocks_no_one(tmp_path: Path, monkeypatch) -> None:
    """A worker started by hand: a silent TCP connection neither blocks a real client nor stays past the
    handshake timeout, and a client holding the key that sends a pickle gets an error, not code run."""
    import pickle
    import signal
    import socket
    import time
    from concurrent.futures import ThreadPoolExecutor
    from multiprocessing.connection import Client

    from backend.rollout.worker import HANDSHAKE_TIMEOUT_S, RolloutWorkerError, connect_worker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path / "w.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "backend.rollout.worker", "--engine", "hf", "--model",
                                 str(ROOT / "assets" / "tiny-add"), "--listen", f"127.0.0.1:{port}"], stdout=log,
                                stderr=subprocess.STDOUT, env=child_env({"GRPO_WORKER_AUTHKEY": "s3cret"}),
                                start_new_session=True)
    try:
        t0 = time.time()
        while "GRPO-WORKER-READY" not in log_path.read_text():
            assert proc.poll() is None and time.time() - t0 < 120, log_path.read_text()
            time.sleep(0.2)
        idle = socket.create_connection(("127.0.0.1", port))  # never answers the challenge
        monkeypatch.setenv("GRPO_WORKER_AUTHKEY", "s3cret")
        t0 = time.time()
        pool = ThreadPoolExecutor(1)  # a worker serving one handshake at a time would hang here: fail instead
        try:
            h = pool.submit(connect_worker, f"127.0.0.1:{port}", "remote", 30).result(timeout=HANDSHAKE_TIMEOUT_S / 2)
        finally:
            pool.shutdown(wait=False)
        assert h.health()["engine"] == "hf" and time.time() - t0 < 5  # not held up by the idle connection

        marker = tmp_path / "ran"

        class Payload:
            def __reduce__(self):  # what unpickling would run
                return (open, (str(marker), "w"))

        evil = Client(("127.0.0.1", port), authkey=b"s3cret")
        evil.send_bytes(pickle.dumps({"op": "health", "args": {"x": Payload()}}))
        assert evil.poll(10) and b"WireError" in evil.recv_bytes()
        evil.close()
        assert not marker.exists() and h.health()["engine"] == "hf"

        idle.settimeout(HANDSHAKE_TIMEOUT_S + 10)
        data = b""
        while chunk := idle.recv(4096):  # the challenge, then EOF once the handshake timeout has passed
            data += chunk
        assert data and time.time() - t0 < HANDSHAKE_TIMEOUT_S + 10
        idle.close()
        with pytest.raises(RolloutWorkerError, match="refused"):
            monkeypatch.setenv("GRPO_WORKER_AUTHKEY", "wrong")
            connect_worker(f"127.0.0.1:{port}", "stranger")
        h.close()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_wire_carries_the_protocols_values_and_builds_nothing_else() -> None:
    """Round trip of what the ops carry; a forged header naming another type, or a value the format does not
    carry, is a WireError, not a constructed object."""
    import json
    from multiprocessing import Pipe

    import torch
    from PIL import Image

    from backend.rollout import wire
    from backend.rollout.base import Completion, PromptInput, RawMedia, SamplingParams
    from backend.rollout.weight_sync import plan_buckets

    a, b = Pipe()
    meta = plan_buckets([("w", torch.zeros(3, 4, dtype=torch.bfloat16))], 1 << 20)
    pixels = torch.randn(2, 3).bfloat16()
    msg = {"op": "generate", "args": {
        "prompts": [PromptInput([1, 2], {"pixel_values": pixels}, seed=5,
                                raw_media=RawMedia([1], [Image.new("RGB", (3, 2), (1, 2, 3))]))],
        "sampling": SamplingParams(2, 4), "meta": meta, "blob": b"\x00safetensors", "empty": torch.zeros(0, 3),
        "adapter": {"target_modules": ["q_proj"], "r": 8}, "ids": (1, 2)}}
    wire.send(a, msg)
    got = wire.recv(b)["args"]
    p = got["prompts"][0]
    assert torch.equal(p.multi_modal["pixel_values"], pixels) and p.raw_media.images[0].getpixel((0, 0)) == (1, 2, 3)
    assert got["meta"] == meta and got["sampling"] == SamplingParams(2, 4) and got["blob"] == b"\x00safetensors"
    assert got["empty"].shape == (0, 3) and got["adapter"] == {"target_modules": ["q_proj"], "r": 8} and got["ids"] == (1, 2)
    wire.send(a, [[Completion([1, 2], "x", "stop", [0.1, 0.2])]])
    assert wire.recv(b) == [[Completion([1, 2], "x", "stop", [0.1, 0.2])]]

    for forged in ({"$": "dc", "type": "Popen", "v": {"args": ["sh"]}}, {"$": "dc", "type": "SamplingParams",
                                                                         "v": {"n": 1, "max_tokens": 1, "__class__": 1}},
                   {"$": "pickle", "v": ""}, {"$": "tensor", "dtype": "object", "shape": [1], "i": 0}):
        a.send_bytes(json.dumps({"v": forged, "parts": [0]}).encode())
        a.send_bytes(b"")
        with pytest.raises(wire.WireError):
            wire.recv(b)
    with pytest.raises(wire.WireError, match="not carried"):
        wire.send(a, {"x": object()})
