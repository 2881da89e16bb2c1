"""Rollout worker: one process holding one engine instance (hf, vllm or lmdeploy), served over a small protocol.

Why a process: an engine in its own process samples on its own cores or GPUs while the trainer
updates (a thread shares the trainer's interpreter lock), engines with their own environment
(LMDeploy pins an older torch) run under their own interpreter, and data-parallel instances are
just several workers (see pool.py).

Protocol: `multiprocessing.connection` over TCP with an HMAC auth key, then messages in a data-only format
(`wire.py`: JSON, tensors as raw bytes; never pickle, so a client holding the key sends values, not code). A
request is `{"op": name, "args": {...}}`, a reply `{"ok": True, "result": ...}` or `{"ok": False, "error": ...,
"traceback": ...}`. Every client gets its own thread: the handshake must finish within HANDSHAKE_TIMEOUT_S
(an idle or unauthenticated connection is dropped, and never holds up another client), and the engine serves
one request at a time.
Ops: generate(prompts, sampling) -> list[list[Completion]]; update_weights(shared + bucket | blob, version, adapter);
init_weight_channel(host, port, world, rank, backend, group_timeout_s); receive_weights(meta, version, adapter)
(adapter: None for full weights, else a LoRA adapter's peft config, for an engine that loads adapters);
sleep(level); wake_up(); health() -> dict; close().

Weights travel one of two ways (rollout.weight_sync):
- file: a worker on this machine maps the trainer's shared-memory file (/dev/shm; weight_sync.SharedWeights,
  reused across updates) and copies from it; a worker reached by URL gets inline safetensors bytes (update_weights);
- collective: the worker joins the trainer's weight channel once (init_weight_channel: a process group
  of its own, NCCL on GPUs, gloo on CPU, see weight_sync.py), then each update is a receive_weights
  op carrying the metadata while the trainer broadcasts the buckets; the engine loads them as they arrive.

Start one by hand (e.g. on another node), then give its URL to the run (rollout.worker_urls):

    GRPO_WORKER_AUTHKEY=secret python -m backend.rollout.worker --engine vllm --model Qwen/Qwen2.5-1.5B \\
        --listen 127.0.0.1:5555 --tensor-parallel-size 2

It prints `GRPO-WORKER-READY <host:port> pid=<pid>` once the engine is loaded. The trainer reads the
same key from GRPO_WORKER_AUTHKEY. The key authenticates but encrypts nothing: across machines, reach the
port through an SSH tunnel (`ssh -N -L 5555:127.0.0.1:5555 gpu-node`, then worker_urls [127.0.0.1:5555]) or
a TLS tunnel rather than listening on an open network (README, "Rollout workers on other machines").

Supervision (WorkerHandle): a worker the trainer starts runs in its own process group and dies with
its parent (a watchdog on its parent pid); every call waits in slices, checking the process, so a worker that dies
or stops answering raises RolloutWorkerError naming the worker, its GPUs and the last lines of its log,
and close() (or interpreter exit) kills the whole group: no process is left behind.
"""

from __future__ import annotations

import argparse
import atexit
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

import torch

from backend.procs import kill_group, spawn_group, watch_parent
from backend.rollout import wire
from backend.rollout.base import Completion, PromptInput, RolloutEngine, SamplingParams

READY = "GRPO-WORKER-READY"
AUTHKEY_ENV = "GRPO_WORKER_AUTHKEY"
HANDSHAKE_TIMEOUT_S = 10.0  # a connection that has not authenticated by then is dropped
MAX_HANDSHAKES = 64  # connections authenticating at once; more are closed at once (a thread each, for 10 s)


@dataclass
class WorkerConfig:
    """What a worker needs to build its engine; mirrors the CLI flags of `python -m backend.rollout.worker`."""

    engine: str = "hf"  # hf | vllm | lmdeploy
    model: str = ""  # a model directory (or hub id where the machine can reach the hub)
    dtype: str = "float32"  # weights' dtype in the engine
    autocast: str = ""  # hf only: compute dtype under autocast ('' = none), as the trainer computes
    device: str = "cpu"  # hf only: cpu or cuda
    threads: int = 1  # torch threads in the worker (CPU engines)
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    enable_sleep: bool = False
    max_model_len: int = 0  # 0 = the engine's default
    lmdeploy_backend: str = "pytorch"
    max_lora_rank: int = 0  # vllm only: > 0 = LoRA enabled, the trainer pushes adapters (update_weights with adapter=)
    seed: int = 0

    def to_args(self) -> list[str]:
        out = []
        for k, v in asdict(self).items():
            flag = "--" + k.replace("_", "-")
            if isinstance(v, bool):
                out += [flag] if v else []
            else:
                out += [flag, str(v)]
        return out


class RolloutWorkerError(RuntimeError):
    """A worker died, hung, or failed a request; the message names it, its GPUs and its last log lines."""


# ----------------------------------------------------------------------------- engine construction (worker side)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def build_engine(cfg: WorkerConfig):
    """The engine a worker holds. Imports the engine's library only here, so a worker needs only its own."""
    if cfg.engine == "hf":
        from transformers import AutoModelForCausalLM

        from backend.models import load_tokenizer
        from backend.rollout.hf import HFEngine

        tok = load_tokenizer(cfg.model, cfg.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=_DTYPES[cfg.dtype],
                                                     trust_remote_code=cfg.trust_remote_code).to(cfg.device).eval()
        model.requires_grad_(False)
        return HFEngine(model, tok, autocast_dtype=_DTYPES[cfg.autocast] if cfg.autocast else None)
    if cfg.engine == "vllm":
        from backend.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(cfg)
    if cfg.engine == "lmdeploy":
        from backend.rollout.lmdeploy_engine import LMDeployEngine

        return LMDeployEngine(cfg)
    raise ValueError(f"unknown engine {cfg.engine!r} (hf, vllm, lmdeploy)")


# ----------------------------------------------------------------------------- the server (worker side)


class _Server:
    def __init__(self, engine, cfg: WorkerConfig, authkey: bytes):
        self.engine, self.cfg, self.authkey = engine, cfg, authkey
        self.version = 0  # policy version of the weights loaded last
        self.closing = False
        self.lock = threading.Lock()  # one request at a time reaches the engine, whichever client sent it
        self.served = threading.Event()  # an authenticated client has come and gone
        self.closed = threading.Event()  # the reply to close() has been sent: the worker may exit
        self.handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self.channel = None  # the weight channel (weight_sync.WeightChannel) once the trainer sets it up
        self.shared = None  # the trainer's mapped weights file (weight_sync.SharedWeights), once one arrived

    def handle(self, op: str, args: dict[str, Any]) -> Any:
        if op == "generate":
            return self.engine.generate(args["prompts"], args["sampling"])
        if op == "update_weights":
            if args.get("shared"):  # the trainer's mapped file (weight_sync.SharedWeights): mapped once, read in place
                self._load(self._shared_weights(args["shared"], args["bucket"]).views.items(), args)
            else:
                from safetensors.torch import load

                self._load(load(args["blob"]).items(), args)
            return self.version
        if op == "init_weight_channel":
            from backend.rollout.weight_sync import WeightChannel

            if self.channel is not None:
                self.channel.close()
                self.channel = None
            self.channel = WeightChannel.join(args["host"], int(args["port"]), int(args["world"]), int(args["rank"]),
                                              args["backend"], float(args["group_timeout_s"]))
            return {"rank": self.channel.rank, "backend": self.channel.backend}
        if op == "receive_weights":
            if self.channel is None:
                raise RuntimeError("receive_weights before init_weight_channel: this worker has no weight channel")
            self._load(self.channel.receive(args["meta"]), args)
            return self.version
        if op == "sleep":
            self.engine.sleep()
            return None
        if op == "wake_up":
            self.engine.wake_up()
            return None
        if op == "health":
            return {"pid": os.getpid(), "engine": self.cfg.engine, "version": self.version, "device": self.cfg.device,
                    "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
        if op == "close":
            self.closing = True
            return None
        raise ValueError(f"unknown op {op!r}")

    def _shared_weights(self, path: str, bucket):  # noqa: ANN001, ANN202 - weight_sync types, imported lazily
        from backend.rollout.weight_sync import SharedWeights

        if self.shared is None or self.shared.path != path or self.shared.bucket != bucket:
            if self.shared is not None:
                self.shared.close()
            self.shared = SharedWeights.open(path, bucket)
        return self.shared

    def _load(self, tensors: Iterable[tuple[str, torch.Tensor]], args: dict[str, Any]) -> None:
        """Full weights, or (args["adapter"]: its peft config) a LoRA adapter for an engine that takes one."""
        self.version = int(args.get("version", self.version + 1))
        self.engine.update_weights(tensors, self.version, args.get("adapter"))

    def serve(self, conn: Connection) -> None:
        while not self.closing:
            try:
                req = wire.recv(conn)
            except (EOFError, OSError):
                return
            except wire.WireError as err:  # not the protocol: say so, and drop the client
                self._reply(conn, {"ok": False, "error": f"WireError: {err}", "traceback": ""})
                return
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                    raise ValueError("a request is {'op': name, 'args': {...}}")
                with self.lock:
                    result = self.handle(req["op"], req.get("args") or {})
                # the engine's own wall time, and this process's CPU time for the call (what benchmarks compare)
                reply = {"ok": True, "result": result, "seconds": time.perf_counter() - t0,
                         "cpu_seconds": time.process_time() - c0}
            except Exception as err:  # the client raises it with the worker's name and log
                reply = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
                print(reply["traceback"], file=sys.stderr, flush=True)
            if not self._reply(conn, reply):
                return
        self.closed.set()

    @staticmethod
    def _reply(conn: Connection, reply: dict[str, Any]) -> bool:
        try:
            try:
                wire.send(conn, reply)
            except wire.WireError as err:  # a result the format does not carry is the engine's bug: report it
                wire.send(conn, {"ok": False, "error": f"WireError: {err}", "traceback": ""})
        except OSError:
            return False
        return True

    def client(self, sock: socket.socket, peer: Any) -> None:
        """One client, on its own thread: the handshake within HANDSHAKE_TIMEOUT_S, then its requests. The caller
        holds one of `handshakes` for it, released here once the handshake is over."""
        timer = threading.Timer(HANDSHAKE_TIMEOUT_S, _drop, [sock])  # unblocks a read from a silent peer
        timer.start()
        conn = Connection(os.dup(sock.fileno()))
        try:
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
        except (AuthenticationError, OSError, EOFError) as err:
            print(f"refused a connection from {peer}: {type(err).__name__}: {err or 'no handshake in time'}",
                  file=sys.stderr, flush=True)
            conn.close()
            sock.close()
            return
        finally:
            timer.cancel()
            self.handshakes.release()
        with conn, sock:
            self.serve(conn)
        self.served.set()


def _drop(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # a blocked read on the connection returns EOF
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backend.rollout.worker", description=__doc__.split("\n\n")[0])
    for k, v in asdict(WorkerConfig()).items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            ap.add_argument(flag, action="store_true")
        else:
            ap.add_argument(flag, type=type(v), default=v)
    ap.add_argument("--listen", default="127.0.0.1:0", help="host:port to listen on (port 0 = any free port)")
    ap.add_argument("--parent-pid", type=int, default=0, help="exit when this process dies; serve one client only")
    ns = vars(ap.parse_args(argv))
    listen, parent = ns.pop("listen"), ns.pop("parent_pid")
    cfg = WorkerConfig(**ns)
    if parent:
        watch_parent(parent)
    torch.set_num_threads(max(1, cfg.threads))
    key = os.environ.get(AUTHKEY_ENV)
    if not key:
        raise SystemExit(f"set {AUTHKEY_ENV} to the key the trainer will use")
    t0 = time.time()
    engine = build_engine(cfg)
    host, _, port = listen.rpartition(":")
    server = _Server(engine, cfg, key.encode())
    with socket.create_server((host or "127.0.0.1", int(port))) as listener:
        h, p = listener.getsockname()[:2]
        print(f"{READY} {h}:{p} pid={os.getpid()} engine={cfg.engine} loaded in {time.time() - t0:.1f}s", flush=True)
        listener.settimeout(0.5)  # to see the events; accepted sockets stay blocking
        while not server.closed.is_set() and not (parent and server.served.is_set()):  # supervised: its trainer only
            try:
                sock, peer = listener.accept()
            except TimeoutError:
                continue
            if not server.handshakes.acquire(blocking=False):
                sock.close()
                continue
            threading.Thread(target=server.client, args=(sock, peer), daemon=True, name=f"client-{peer}").start()
    if server.channel is not None:
        server.channel.close()
    engine.close()
    return 0


# ----------------------------------------------------------------------------- the handle (trainer side)


def _log_tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not path.exists():
        return "(no log)"
    text = path.read_bytes()[-8000:].decode("utf-8", "replace").splitlines()
    return "\n".join(text[-lines:]) or "(empty log)"


def shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@dataclass
class WorkerHandle(RolloutEngine):
    """The trainer's side of one worker: calls with supervision. Either spawned (proc set) or reached by URL."""

    name: str
    address: tuple[str, int]
    authkey: bytes
    gpus: list[int] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    timeout_s: float = 600.0  # longest a call may take before the worker counts as hung
    conn: Connection | None = None
    last_engine_s: float = 0.0  # the worker's own time for the last call (the rest is protocol and transfer)
    last_cpu_s: float = 0.0  # the worker process's CPU time for the last call (all its threads)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def where(self) -> str:
        gpus = f"GPUs {self.gpus}" if self.gpus else "CPU"
        pid = f", pid {self.proc.pid}" if self.proc else ""
        return f"rollout worker {self.name} ({gpus}, {self.address[0]}:{self.address[1]}{pid})"

    def _fail(self, what: str) -> RolloutWorkerError:
        return RolloutWorkerError(f"{self.where} {what}; last lines of {self.log_path or 'its log'}:\n{_log_tail(self.log_path)}")

    def connect(self) -> None:
        try:
            self.conn = Client(self.address, authkey=self.authkey)
        except AuthenticationError as err:
            raise self._fail(f"refused the connection ({err}); check {AUTHKEY_ENV}") from err
        except (OSError, EOFError) as err:
            raise self._fail(f"cannot be reached: {err}") from err

    def call(self, op: str, timeout_s: float | None = None, **args: Any) -> Any:
        with self._lock:
            if self.conn is None:
                raise self._fail("is closed")
            limit = self.timeout_s if timeout_s is None else timeout_s
            try:
                wire.send(self.conn, {"op": op, "args": args})
                t0 = time.time()
                while not self.conn.poll(0.2):
                    if self.proc is not None and self.proc.poll() is not None:
                        raise self._fail(f"died during {op} with exit code {self.proc.returncode}")
                    if time.time() - t0 > limit:
                        self.kill()
                        raise self._fail(f"did not answer {op} within {limit:.0f}s (killed)")
                reply = wire.recv(self.conn)
            except (EOFError, OSError, BrokenPipeError) as err:
                code = self.proc.poll() if self.proc is not None else None
                raise self._fail(f"lost its connection during {op}" + (f" (exit code {code})" if code is not None else "")
                                 + f": {type(err).__name__}") from err
        if not reply["ok"]:
            raise self._fail(f"failed {op}: {reply['error']}\n{reply.get('traceback', '')}")
        self.last_engine_s = reply.get("seconds", 0.0)
        self.last_cpu_s = reply.get("cpu_seconds", 0.0)
        return reply["result"]

    # the engine interface
    def generate(self, prompts: list[PromptInput], sampling: SamplingParams) -> list[list[Completion]]:
        return self.call("generate", prompts=prompts, sampling=sampling)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int = 0,
                       adapter: dict | None = None) -> None:
        """New weights (or, with `adapter` = its peft config, a LoRA adapter): through a shared-memory file to a
        worker this process started (a pool keeps one mapped across updates), inline bytes to one reached by URL."""
        tensors = {n: t.detach().to("cpu").contiguous() for n, t in named_tensors}
        if self.proc is not None:
            from backend.rollout.weight_sync import SharedWeights

            shared = SharedWeights.create(tensors.items(), shm_dir())
            try:
                shared.write(tensors)
                self.update_weights_shared(shared, version, adapter)
            finally:
                shared.close()
        else:
            from safetensors.torch import save

            self.call("update_weights", blob=save(tensors), version=version, adapter=adapter)

    def update_weights_shared(self, shared, version: int = 0, adapter: dict | None = None) -> None:  # noqa: ANN001
        """Load the weights `shared` (a weight_sync.SharedWeights this process wrote) holds."""
        self.call("update_weights", shared=shared.path, bucket=shared.bucket, version=version, adapter=adapter)

    def init_weight_channel(self, host: str, port: int, world: int, rank: int, backend: str, timeout_s: float) -> None:
        """Join the trainer's weight channel as `rank` (returns once every rank has joined)."""
        self.call("init_weight_channel", host=host, port=port, world=world, rank=rank, backend=backend,
                  group_timeout_s=timeout_s)

    def receive_weights(self, meta, version: int = 0, adapter: dict | None = None) -> None:
        """Take one broadcast update described by `meta` (weight_sync.WeightsMeta); the trainer sends meanwhile."""
        self.call("receive_weights", meta=meta, version=version, adapter=adapter)

    @property
    def local(self) -> bool:
        """Started by this trainer on this machine (not reached by URL)."""
        return self.proc is not None

    def sleep(self) -> None:
        self.call("sleep")

    def wake_up(self) -> None:
        self.call("wake_up")

    def health(self) -> dict[str, Any]:
        return self.call("health", timeout_s=30.0)

    def close(self) -> None:
        """Ask the worker to exit, then make sure its whole process group is gone."""
        if self.conn is not None:
            try:
                if self.proc is None or self.proc.poll() is None:
                    self.call("close", timeout_s=10.0)
            except RolloutWorkerError:
                pass
            try:
                self.conn.close()
            except OSError:
                pass
            self.conn = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                pass
            self.kill()

    def kill(self) -> None:
        """End the worker's whole process group (the engine's own children too): SIGTERM, then SIGKILL."""
        kill_group(self.proc, grace_s=5.0)


_LIVE: list[WorkerHandle] = []


@atexit.register
def _kill_live() -> None:
    for h in list(_LIVE):
        h.kill()


def spawn_worker(cfg: WorkerConfig, name: str, log_path: Path, gpus: list[int] | None = None, python: str = "",
                 start_timeout_s: float = 600.0, call_timeout_s: float = 600.0) -> WorkerHandle:
    """Start a worker in its own process group (stdout and stderr to log_path), wait until it serves, connect."""
    key = secrets.token_hex(16)
    extra = {AUTHKEY_ENV: key, "OMP_NUM_THREADS": str(max(1, cfg.threads))}
    if gpus:  # indices are the trainer's (visible) numbering: map them through its own CUDA_VISIBLE_DEVICES
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        extra["CUDA_VISIBLE_DEVICES"] = ",".join(visible[g] if g < len(visible) else str(g) for g in gpus)
    if cfg.engine == "vllm" and cfg.device == "cpu":
        extra.setdefault("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        extra.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    cmd = [python or sys.executable, "-m", "backend.rollout.worker", *cfg.to_args(),
           "--listen", "127.0.0.1:0", "--parent-pid", str(os.getpid())]
    proc = spawn_group(cmd, stdout=log, env=extra)
    log.close()
    handle = WorkerHandle(name, ("127.0.0.1", 0), key.encode(), list(gpus or []), proc, log_path, call_timeout_s)
    _LIVE.append(handle)
    t0 = time.time()
    start = log_path.stat().st_size if log_path.exists() else 0
    while True:
        text = log_path.read_bytes()[max(0, start - 1):].decode("utf-8", "replace") if log_path.exists() else ""
        line = next((ln for ln in text.splitlines() if ln.startswith(READY)), None)
        if line:
            host, _, port = line.split()[1].rpartition(":")
            handle.address = (host, int(port))
            break
        if proc.poll() is not None:
            _LIVE.remove(handle)
            raise handle._fail(f"exited with code {proc.returncode} while starting")
        if time.time() - t0 > start_timeout_s:
            handle.kill()
            _LIVE.remove(handle)
            raise handle._fail(f"did not start within {start_timeout_s:.0f}s (killed)")
        time.sleep(0.1)
    handle.connect()
    return handle


def connect_worker(url: str, name: str, timeout_s: float = 600.0) -> WorkerHandle:
    """A worker started by hand elsewhere: url is host:port (tcp:// optional); the key comes from GRPO_WORKER_AUTHKEY."""
    key = os.environ.get(AUTHKEY_ENV)
    if not key:
        raise RolloutWorkerError(f"rollout worker {name} at {url}: set {AUTHKEY_ENV} to the key it was started with")
    host, _, port = url.removeprefix("tcp://").rpartition(":")
    if not host or not port.isdigit():
        raise RolloutWorkerError(f"rollout.worker_urls: {url!r} is not host:port")
    handle = WorkerHandle(name, (host, int(port)), key.encode(), timeout_s=timeout_s)
    handle.connect()
    handle.health()
    return handle


def release(handle: WorkerHandle) -> None:
    """Close a worker and forget it (used by pools and tests)."""
    handle.close()
    if handle in _LIVE:
        _LIVE.remove(handle)


if __name__ == "__main__":
    sys.exit(main())
