"""The shared-memory file channel (read in place across updates) and the collective weight channel (gloo on
CPU, the code path NCCL takes on GPUs): buckets pack and unpack exactly, two workers that receive weights over
the channel sample what an in-process engine with the same weights samples, and a worker that dies
mid-broadcast gives a RolloutWorkerError naming it, not a hang."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.project import PROJECT_ROOT
from backend.rollout.base import PromptInput, SamplingParams
from backend.rollout.hf import HFEngine
from backend.rollout.pool import RolloutPool, start_workers
from backend.rollout.weight_sync import ALIGN, SharedWeights, WeightChannel, pack, plan_buckets, unpack
from backend.rollout.worker import RolloutWorkerError, WorkerConfig

TINY = PROJECT_ROOT / "assets/tiny-add"
CFG = WorkerConfig(engine="hf", model=str(TINY), dtype="float32")


def _mixed() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(50, 30, generator=g), "idx": torch.arange(7, dtype=torch.int64),
            "half": torch.randn(3, 5, generator=g).bfloat16(), "odd": torch.randn(13, generator=g).half(),
            "big": torch.randn(400, generator=g), "flag": torch.tensor([True, False, True])}


def test_buckets_keep_order_size_and_alignment() -> None:
    t = _mixed()
    meta = plan_buckets(t.items(), bucket_bytes=2000)
    assert meta.names == list(t)  # every tensor once, in order
    for b in meta.buckets:
        assert all(m.offset % ALIGN == 0 for m in b.tensors)
        # a bucket overflows its size only when it holds a single tensor that is larger by itself
        assert b.nbytes <= 2000 + ALIGN or len(b.tensors) == 1
    sizes = {m.name: m.nbytes for b in meta.buckets for m in b.tensors}
    assert sizes == {"w": 6000, "idx": 56, "half": 30, "odd": 26, "big": 1600, "flag": 3}
    # w alone (larger than a bucket); the rest at aligned offsets: 56 -> 64, 64 + 30 -> 128, 128 + 26 -> 192, 192 + 1600 -> 1792
    assert [[m.offset for m in b.tensors] for b in meta.buckets] == [[0], [0, 64, 128, 192, 1792]]
    assert [b.nbytes for b in meta.buckets] == [6016, 1856]
    with pytest.raises(ValueError, match="complex64"):
        plan_buckets([("c", torch.zeros(2, dtype=torch.complex64))], 100)


def test_pack_unpack_round_trip_is_exact() -> None:
    t = _mixed()
    meta = plan_buckets(t.items(), bucket_bytes=2000)
    back = dict(kv for b in meta.buckets for kv in unpack(b, pack(b, t)))
    assert back.keys() == t.keys()
    for k in t:
        assert back[k].dtype == t[k].dtype and torch.equal(back[k], t[k])


def test_shared_weights_are_read_in_place_across_updates() -> None:
    """The "file" channel: a worker's mapping sees each new write without reopening; a new layout needs a new
    file; closing the trainer's side removes the file."""
    tensors = _mixed()
    shared = SharedWeights.create(tensors.items())
    try:
        shared.write(tensors)
        seen = SharedWeights.open(shared.path, shared.bucket)
        assert all(torch.equal(seen.views[n], t) for n, t in tensors.items())
        doubled = {n: (t * 2 if t.is_floating_point() else t) for n, t in tensors.items()}
        assert shared.fits(doubled)
        shared.write(doubled)
        assert all(torch.equal(seen.views[n], t) for n, t in doubled.items())
        assert not shared.fits({**tensors, "w": torch.zeros(50, 31)})
        assert not shared.fits({n: t for n, t in tensors.items() if n != "flag"})
        seen.close()
        assert os.path.exists(shared.path)  # a reader's close leaves the trainer's file
    finally:
        shared.close()
    assert not os.path.exists(shared.path)


def test_channel_is_a_group_of_its_own() -> None:
    """Three ranks (threads) over gloo: every receiver gets the exact tensors, and torch.distributed's
    default group (what DDP/DeepSpeed use) is neither needed nor created."""
    import torch.distributed as dist

    t = _mixed()
    meta = plan_buckets(t.items(), bucket_bytes=1000)
    host = WeightChannel.host(3, "gloo", 30.0)
    got: dict[int, dict[str, torch.Tensor]] = {}

    def receiver(rank: int) -> None:
        ch = WeightChannel.join("127.0.0.1", host.port, 3, rank, "gloo", 30.0)
        got[rank] = {n: x.clone() for n, x in ch.receive(meta)}
        ch.close()

    threads = [threading.Thread(target=receiver, args=(r,)) for r in (1, 2)]
    for th in threads:
        th.start()
    host.connect()
    host.send(meta, t)
    for th in threads:
        th.join(60)
    host.close()
    assert not dist.is_initialized()
    for r in (1, 2):
        assert all(torch.equal(got[r][k], t[k]) for k in t)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TINY)


def _halved() -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    return model


@pytest.mark.slow
def test_two_workers_take_weights_over_the_channel_and_sample_like_the_engine(tmp_path, tok) -> None:
    pool = start_workers(CFG, 2, tmp_path, start_timeout_s=300, weight_sync="collective", bucket_mb=0.5)
    try:
        prompts = [PromptInput(tok(t, add_special_tokens=False)["input_ids"]) for t in ["12+34=", "9+9=", "71+18="]]
        sp = SamplingParams(n=4, max_tokens=6, temperature=1.2, seed=11)
        before = pool.generate(prompts, sp)
        model = _halved()
        pool.update_weights(model.named_parameters(), version=3)
        assert pool.channel is not None and pool.channel.backend == "gloo"
        assert [h.health()["version"] for h in pool.instances] == [3, 3]
        local = HFEngine(model, tok).generate(prompts, sp)
        after = pool.generate(prompts, sp)
        assert [[c.token_ids for c in g] for g in after] == [[c.token_ids for c in g] for g in local]
        assert [[c.token_ids for c in g] for g in after] != [[c.token_ids for c in g] for g in before]
        for ga, gb in zip(after, local):
            for a, b in zip(ga, gb):
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        # the channel is reused: the original weights again give the original samples
        pool.update_weights(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).named_parameters(), version=4)
        again = pool.generate(prompts, sp)
        assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in before]
    finally:
        pool.close()


@pytest.mark.slow
def test_worker_dying_during_a_broadcast_is_named_not_a_hang(tmp_path) -> None:
    pool = start_workers(CFG, 2, tmp_path, start_timeout_s=300, call_timeout_s=60, weight_sync="collective",
                         bucket_mb=0.05)
    try:
        model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
        pool.update_weights(model.named_parameters(), version=1)  # the channel forms and works
        victim = pool.instances[1].proc.pid
        # worker 1 stops (its socket buffers fill, the broadcast stalls on it), then dies mid-broadcast
        os.kill(victim, signal.SIGSTOP)
        threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
        t0 = time.time()
        with pytest.raises(RolloutWorkerError, match=r"(?s)rollout worker rollout-1 \(CPU.*pid .*(died|lost its connection)"):
            pool.update_weights(model.named_parameters(), version=2)
        assert time.time() - t0 < 50  # well inside the 60 s worker and group timeouts: noticed, not waited out
        assert pool.channel is None  # a broken channel is not reused
    finally:
        pool.close()


def test_collective_needs_workers(tok) -> None:
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32), tok)
    with pytest.raises(ValueError, match="rollout.weight_sync: collective needs every engine instance to be a rollout worker"):
        RolloutPool([engine], weight_sync="collective")


def test_the_one_check_resolves_and_states_the_weight_path() -> None:
    """auto = collective on GPUs, file on CPU; collective without workers is refused naming the field; the
    planner says which path (and, for LoRA, that the merged weights are pushed)."""
    from backend.checks import check_spec
    from backend.machine import GPU, Machine
    from backend.plan import plan
    from backend.spec import load_spec

    preset = PROJECT_ROOT / "presets/tiny-cpu.yaml"
    sep = load_spec(preset, ["rollout.placement=separate", "resources.device=cpu"])
    assert sep.weight_sync_mode(on_gpu=False) == "file" and sep.weight_sync_mode(on_gpu=True) == "collective"
    assert "one shared-memory file the workers keep mapped" in "\n".join(plan(sep, Machine(), PROJECT_ROOT).lines)
    coll = load_spec(preset, ["rollout.placement=separate", "resources.device=cpu", "rollout.weight_sync=collective",
                              "rollout.weight_sync_bucket_mb=64", "model.finetune=lora"])
    lines = "\n".join(plan(coll, Machine(), PROJECT_ROOT).lines)
    assert "gloo broadcast from the trainer in 64 MB buckets" in lines and "adapter is merged" in lines
    gpu = load_spec(preset, ["rollout.placement=separate", "rollout.engine=vllm", "resources.device=cuda",
                             "resources.train_gpus=[0]", "resources.rollout_gpus=[1]"])
    machine = Machine(tuple(GPU(i, "H100", 80.0) for i in range(2)), frozenset({"hf", "vllm"}))
    assert "NCCL broadcast from the trainer in 256 MB buckets" in "\n".join(plan(gpu, machine, PROJECT_ROOT).lines)
    colo = load_spec(preset, ["rollout.weight_sync=collective"])
    assert [i.field for i in check_spec(colo, PROJECT_ROOT)] == ["rollout.weight_sync"]
