"""Loss and advantage math against values computed by hand from the formulas (plain Python floats)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from backend.train import grpo

# Two completions, three token slots. Sequence 0 has 2 real tokens, sequence 1 has 3.
LOGPS = [[-1.0, -2.0, -0.5], [-0.5, -1.0, -0.3]]
OLD = [[-1.2, -1.5, -0.5], [-0.1, -1.0, -0.3]]
REF = [[-1.1, -2.0, 0.0], [-0.5, -0.7, -0.3]]
MASK = [[1, 1, 0], [1, 1, 1]]
ADV = [1.0, -2.0]
EPS_LO, EPS_HI = 0.2, 0.2


def hand_token_losses(level: str, beta: float = 0.0) -> list[list[float]]:
    out = []
    for b in range(2):
        n = sum(MASK[b])
        if level == "sequence":
            seq_lr = sum(LOGPS[b][t] - OLD[b][t] for t in range(n)) / n
        row = []
        for t in range(3):
            lr = seq_lr if level == "sequence" else LOGPS[b][t] - OLD[b][t]
            r = math.exp(lr)
            c = min(max(r, 1 - EPS_LO), 1 + EPS_HI)
            loss = -min(r * ADV[b], c * ADV[b])
            if beta:
                d = REF[b][t] - LOGPS[b][t]
                loss += beta * (math.exp(d) - d - 1)
            row.append(loss)
        out.append(row)
    return out


def hand_aggregate(tok: list[list[float]], loss_type: str, max_len: int = 4) -> float:
    lens = [sum(m) for m in MASK]
    total = sum(tok[b][t] for b in range(2) for t in range(lens[b]))
    if loss_type == "grpo":
        return sum(sum(tok[b][:lens[b]]) / lens[b] for b in range(2)) / 2
    if loss_type in ("bnpo", "dapo"):
        return total / sum(lens)
    if loss_type == "dr_grpo":
        return total / (2 * max_len)
    raise AssertionError(loss_type)


def run(loss_type: str, level: str = "token", beta: float = 0.0) -> grpo.LossOut:
    return grpo.policy_loss(
        torch.tensor(LOGPS), torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK),
        loss_type=loss_type, epsilon_low=EPS_LO, epsilon_high=EPS_HI, is_level=level, beta=beta,
        ref_logps=torch.tensor(REF), max_completion_length=4,
    )


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_loss_matches_hand_computation(loss_type: str, level: str, beta: float) -> None:
    expected = hand_aggregate(hand_token_losses(level, beta), loss_type)
    assert run(loss_type, level, beta).loss.item() == pytest.approx(expected, rel=1e-5)


def test_known_values_token_level() -> None:
    # Worked by hand: seq 0 tokens -> -min(e^.2, 1.2) = -1.2 (high clip), -e^-.5 = -0.60653;
    # seq 1 (A=-2) -> -min(-2 e^-.4, -2*0.8) = 1.6 (low clip), 2.0, 2.0.
    assert run("grpo").loss.item() == pytest.approx(((-1.2 - 0.606531) / 2 + (1.6 + 2 + 2) / 3) / 2, rel=1e-5)
    assert run("bnpo").loss.item() == pytest.approx((-1.2 - 0.606531 + 5.6) / 5, rel=1e-5)
    assert run("dr_grpo").loss.item() == pytest.approx((-1.2 - 0.606531 + 5.6) / 8, rel=1e-5)


def test_clip_metrics_both_sides() -> None:
    out = run("grpo")
    # 5 real tokens: token (0,0) clipped high (ratio 1.221 > 1.2, A > 0); (1,0) clipped low (0.670 < 0.8, A < 0).
    assert out.clip_high == pytest.approx(1 / 5)
    assert out.clip_low == pytest.approx(1 / 5)
    assert out.clip_region == pytest.approx(2 / 5)


def test_clipped_tokens_get_no_gradient() -> None:
    logps = torch.tensor(LOGPS, requires_grad=True)
    out = grpo.policy_loss(logps, torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK), loss_type="bnpo",
                           epsilon_low=EPS_LO, epsilon_high=EPS_HI)
    out.loss.backward()
    g = logps.grad
    assert g[0, 0] == 0 and g[1, 0] == 0  # clipped on the high and the low side
    assert g[0, 1] != 0 and g[1, 1] != 0  # inside the trust region
    assert g[0, 2] == 0  # masked padding


def test_kl_k3_value() -> None:
    out = run("grpo", beta=0.1)
    d = [REF[b][t] - LOGPS[b][t] for b in range(2) for t in range(3) if MASK[b][t]]
    assert out.kl.item() == pytest.approx(sum(math.exp(x) - x - 1 for x in d) / len(d), rel=1e-5)


def test_asymmetric_epsilon_high() -> None:
    out = grpo.policy_loss(torch.tensor(LOGPS), torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK),
                           loss_type="bnpo", epsilon_low=0.2, epsilon_high=0.28)
    # ratio 1.2214 is inside 1 + 0.28 now: token (0,0) contributes -1.2214 instead of -1.2
    assert out.loss.item() == pytest.approx((-math.exp(0.2) - 0.606531 + 5.6) / 5, rel=1e-5)
    assert out.clip_high == 0


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_micro_batches_sum_to_the_full_batch(loss_type: str) -> None:
    torch.manual_seed(0)
    B, T = 8, 5
    logps, old = -torch.rand(B, T), -torch.rand(B, T)
    adv = torch.randn(B)
    mask = (torch.rand(B, T) > 0.3).long()
    mask[:, 0] = 1
    kw = dict(loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.2, max_completion_length=T,
              global_num_tokens=float(mask.sum()), global_num_seqs=B)
    full = grpo.policy_loss(logps, old, adv, mask, num_micro_batches=1, **kw).loss
    parts = sum(grpo.policy_loss(logps[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], num_micro_batches=4,
                                 **kw).loss for i in range(0, B, 2))
    assert parts.item() == pytest.approx(full.item(), rel=1e-5)


def test_dapo_normalises_by_global_tokens_bnpo_by_micro_batch() -> None:
    logps, old = torch.zeros(2, 2), torch.zeros(2, 2)
    adv = torch.tensor([1.0, 1.0])
    mask = torch.tensor([[1, 0], [1, 1]])
    # each token loss is -1. Micro-batch 1 = seq 0 (1 token), micro-batch 2 = seq 1 (2 tokens).
    kw = dict(epsilon_low=0.2, epsilon_high=0.2, num_micro_batches=2, global_num_tokens=3.0)
    dapo = sum(grpo.policy_loss(logps[i:i + 1], old[i:i + 1], adv[i:i + 1], mask[i:i + 1], loss_type="dapo",
                                **kw).loss for i in range(2))
    bnpo = sum(grpo.policy_loss(logps[i:i + 1], old[i:i + 1], adv[i:i + 1], mask[i:i + 1], loss_type="bnpo",
                                **kw).loss for i in range(2))
    assert dapo.item() == pytest.approx(-3 / 3)
    assert bnpo.item() == pytest.approx((-1 / 1 + -2 / 2) / 2)


REWARDS = [1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0]


def test_advantages_group_scaling() -> None:
    adv, std = grpo.group_advantages(torch.tensor(REWARDS), 4, "group")
    s = math.sqrt(((1.5**2) * 2 + (0.5**2) * 2) / 3)  # unbiased std of 1, 2, 3, 4
    assert adv[:4].tolist() == pytest.approx([(r - 2.5) / (s + 1e-4) for r in REWARDS[:4]], rel=1e-5)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # zero-std group: no signal, no NaN
    assert std.tolist() == pytest.approx([s, 0.0], rel=1e-5)


def test_advantages_batch_and_none_scaling() -> None:
    mean = sum(REWARDS) / 8
    bstd = math.sqrt(sum((r - mean) ** 2 for r in REWARDS) / 7)
    adv, _ = grpo.group_advantages(torch.tensor(REWARDS), 4, "batch")
    assert adv[:4].tolist() == pytest.approx([(r - 2.5) / (bstd + 1e-4) for r in REWARDS[:4]], rel=1e-5)
    adv, _ = grpo.group_advantages(torch.tensor(REWARDS), 4, "none")
    assert adv.tolist() == pytest.approx([-1.5, -0.5, 0.5, 1.5, 0, 0, 0, 0])


def test_advantage_calibration_by_hand() -> None:
    """NGRPO: a virtual reward-1 completion joins each group's mean and std. 8 rewards per group: one right
    (mean 2/9, unbiased std over 9 = sqrt(126/648)), all right (advantage 0, still skippable), all wrong
    (mean 1/9, std 1/3: each gets -1/3, where plain GRPO gives 0)."""
    one = [1.0] + [0.0] * 7
    adv, std = grpo.group_advantages(torch.tensor(one + [1.0] * 8 + [0.0] * 8), 8, "group", virtual_reward=1.0)
    s1 = math.sqrt(126 / 648)
    assert adv[:8].tolist() == pytest.approx([(7 / 9) / (s1 + 1e-4)] + [(-2 / 9) / (s1 + 1e-4)] * 7, rel=1e-5)
    assert adv[8:16].tolist() == [0.0] * 8
    assert adv[16:].tolist() == pytest.approx([(-1 / 9) / (1 / 3 + 1e-4)] * 8, rel=1e-5)
    assert std.tolist() == pytest.approx([math.sqrt(7 / 64 * 8 / 7), 0.0, 0.0], rel=1e-5)  # the real groups' std
    plain, _ = grpo.group_advantages(torch.tensor(one + [1.0] * 8 + [0.0] * 8), 8, "group")
    assert plain[16:].tolist() == [0.0] * 8
    none, _ = grpo.group_advantages(torch.tensor(one), 8, "none", virtual_reward=1.0)
    assert none.tolist() == pytest.approx([7 / 9] + [-2 / 9] * 7)


def test_combine_rewards_treats_none_as_zero() -> None:
    per_fn = torch.tensor([[1.0, float("nan")], [0.5, 2.0]])
    assert grpo.combine_rewards(per_fn, torch.tensor([2.0, 0.5])).tolist() == pytest.approx([2.0, 2.0])


def test_selective_log_softmax() -> None:
    logits = torch.tensor([[[1.0, 2.0, 3.0]]])
    expected = 2.0 - math.log(math.exp(1) + math.exp(2) + math.exp(3))
    assert grpo.selective_log_softmax(logits, torch.tensor([[1]])).item() == pytest.approx(expected, rel=1e-6)


# ----------------------------------------------------------------------------- the other objectives, by hand

def test_cispo_weights_are_clipped_detached_and_every_token_keeps_a_gradient() -> None:
    logps = torch.tensor(LOGPS, requires_grad=True)
    out = grpo.policy_loss(logps, torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK), loss_type="cispo",
                           epsilon_low=0.2, epsilon_high=1.1)
    out.loss.backward()
    w = [[min(math.exp(LOGPS[b][t] - OLD[b][t]), 1.1) for t in range(3)] for b in range(2)]
    real = [(b, t) for b in range(2) for t in range(3) if MASK[b][t]]
    assert out.loss.item() == pytest.approx(sum(-w[b][t] * ADV[b] * LOGPS[b][t] for b, t in real) / 5, rel=1e-6)
    for b, t in real:  # d/dlogp = -sg(w) A / tokens: no token is cut off, unlike the PPO clip
        assert logps.grad[b, t].item() == pytest.approx(-w[b][t] * ADV[b] / 5, rel=1e-6)
    # ratio e^0.2 = 1.22 > 1.1 with A > 0: the one clipped token of 5
    assert out.metrics == {"cispo_clip_ratio": pytest.approx(1 / 5)}


def test_sapo_gate_value_and_on_policy_gradient_equal_grpo() -> None:
    logps = torch.tensor(LOGPS, requires_grad=True)
    sapo = grpo.policy_loss(logps, logps.detach(), torch.tensor(ADV), torch.tensor(MASK), loss_type="sapo",
                            epsilon_low=0.2, epsilon_high=0.2, sapo_temperature_pos=1.0, sapo_temperature_neg=2.0)
    sapo.loss.backward()
    # r = 1: the gate sigmoid(0) * 4 / tau = 2 / tau; token loss -2A/tau, averaged per sequence then over sequences
    assert sapo.loss.item() == pytest.approx((-2 * 1.0 / 1.0 + -2 * -2.0 / 2.0) / 2, rel=1e-6)
    g_sapo = logps.grad.clone()
    logps.grad = None
    grpo.policy_loss(logps, logps.detach(), torch.tensor(ADV), torch.tensor(MASK), loss_type="grpo",
                     epsilon_low=0.2, epsilon_high=0.2).loss.backward()
    # the gate's slope at r = 1 is sigmoid'(0) * 4 = 1 for any tau: the same step as GRPO on policy
    torch.testing.assert_close(g_sapo, logps.grad)


def test_delta_caps_the_unclipped_term_for_negative_advantages() -> None:
    logps, old, mask = torch.tensor([[0.5]]), torch.zeros(1, 1), torch.ones(1, 1)
    plain = grpo.policy_loss(logps, old, torch.tensor([-1.0]), mask, loss_type="bnpo", epsilon_low=0.2, epsilon_high=0.2)
    capped = grpo.policy_loss(logps, old, torch.tensor([-1.0]), mask, loss_type="bnpo", epsilon_low=0.2,
                              epsilon_high=0.2, delta=1.5)
    assert plain.loss.item() == pytest.approx(math.exp(0.5))  # -min(-1.65, -1.2): the ratio is unbounded
    assert capped.loss.item() == pytest.approx(1.5)  # -min(-min(1.65, 1.5), -1.2)


def test_luspo_sums_each_sequence() -> None:
    out = grpo.policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([1.0, -2.0]), torch.tensor(MASK),
                           loss_type="luspo", epsilon_low=0.2, epsilon_high=0.2, is_level="sequence")
    assert out.loss.item() == pytest.approx((-1.0 * 2 + 2.0 * 3) / 2)  # token losses -A, summed per sequence


def test_high_entropy_mask_keeps_the_top_quantile_of_real_tokens() -> None:
    ent = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 5.0]])  # 5.0 is padding: neither counted nor kept
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # real tokens sorted 0.1 0.3 0.5 0.7 0.9; quantile 0.6 interpolates to 0.58: 0.7 and 0.9 stay
    kept = grpo.high_entropy_mask(ent, mask, 0.4)
    assert kept.tolist() == [[False, False, True], [False, True, False]]


def test_off_policy_mask_drops_only_drifted_negative_advantage_sequences() -> None:
    logps = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    sampling = torch.tensor([[-0.2, -0.4], [-0.2, -0.4], [-1.0, -0.9]])  # mean drift 0.7, 0.7, 0.05
    mask = torch.ones(3, 2)
    keep = grpo.off_policy_mask(torch.tensor([1.0, -1.0, -1.0]), logps, sampling, mask, threshold=0.5)
    assert keep.squeeze(-1).tolist() == [1.0, 0.0, 1.0]


def test_entropy_control_gates_and_steps_the_coefficient() -> None:
    c = grpo.EntropyControl(0.02, adaptive=True, target=1.0, delta=0.01, coef_min=0.0, coef_max=0.035)
    assert c.apply() == 0.0  # nothing measured yet
    c.update(entropy_sum=4.0, tokens=5.0)  # 0.8 <= target: on, and up by delta
    assert (c.apply(), c.coef) == (pytest.approx(0.03), pytest.approx(0.03))
    c.update(entropy_sum=4.0, tokens=5.0)
    assert c.coef == pytest.approx(0.035)  # capped at coef_max
    c.update(entropy_sum=6.0, tokens=5.0)  # 1.2 > target: off, and down
    assert (c.apply(), c.coef) == (0.0, pytest.approx(0.025))
    static = grpo.EntropyControl(0.05)
    static.update(100.0, 1.0)
    assert (static.apply(), static.enabled) == (0.05, True)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e9])
def test_clipped_step_matches_torch(max_norm: float, fused: bool) -> None:
    """dist.clipped_step: clip_grad_norm_'s norm and clip_grad_norm_ + step's parameters, clipped (through the fused
    kernel's grad_scale, or a pass over the gradients), within the bound, or off; a parameter without a gradient."""
    from backend.train.dist import clipped_step

    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)] + [torch.nn.Parameter(torch.randn(4))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt_ours = torch.optim.AdamW(ours, lr=0.1, fused=fused)
    opt_ref = torch.optim.AdamW(ref, lr=0.1, fused=fused)
    for _ in range(3):
        for a, b in zip(ours, ref):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        ours[-1].grad = ref[-1].grad = None
        norm = clipped_step(ours, opt_ours, max_norm)
        expected = torch.nn.utils.clip_grad_norm_(ref, max_norm if max_norm > 0 else float("inf"))
        opt_ref.step()
        assert norm == pytest.approx(float(expected), rel=1e-6) and norm > 0.5  # 0.5 does clip
        assert not hasattr(opt_ours, "grad_scale")
        for a, b in zip(ours, ref):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_keep_freed_memory_serves_large_blocks_from_the_heap_and_keeps_them() -> None:
    """memory.keep_freed_memory: after it, blocks of a few MiB come from malloc's heap rather than a fresh mmap
    each (whose zero-filled pages fault in on every step's reallocation), and freeing them does not hand the
    heap back to the OS. Checked on malloc itself (mallinfo2) in fresh interpreters, since the setting is
    process-wide; the control without it maps the same block. What it saves per step is bench.malloc's figure."""
    import ctypes
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc malloc")
    script = (
        "import ctypes, json, sys\n"
        "from backend.train.memory import keep_freed_memory\n"
        "class Info(ctypes.Structure):\n"
        "    _fields_ = [(n, ctypes.c_size_t) for n in\n"
        "                'arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost'.split()]\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.mallinfo2.restype = Info\n"
        "libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]\n"
        "libc.free.argtypes = [ctypes.c_void_p]\n"
        "on = sys.argv[1] == '1' and keep_freed_memory()\n"
        "h0 = libc.mallinfo2().hblks\n"
        "blocks = [libc.malloc(n << 20) for n in (1, 4, 16)]\n"
        "mapped = libc.mallinfo2().hblks - h0\n"
        "arena = libc.mallinfo2().arena\n"
        "for b in blocks:\n    libc.free(b)\n"
        "print(json.dumps({'on': on, 'mapped': mapped, 'kept': libc.mallinfo2().arena >= arena}))\n")
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc before 2.33 has no mallinfo2")
    root = Path(__file__).resolve().parent.parent
    # glibc's own defaults: no MALLOC_* tunables or preloaded allocator from the calling environment
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD"))}
    out = {on: json.loads(subprocess.run([sys.executable, "-c", script, on], capture_output=True, text=True,
                                         check=True, cwd=root, env={**env, "PYTHONPATH": str(root)}
                                         ).stdout.split("\n")[-2])
           for on in ("0", "1")}
    assert out["1"] == {"on": True, "mapped": 0, "kept": True}, out
    assert out["0"]["mapped"] == 3 and not out["0"]["on"], out  # glibc's default: each block its own mmap


def test_vespo_weight_and_loss_by_hand() -> None:
    """Sequence 0 (A = 1 >= 0: k 2, lambda 3): w = exp(sum of its 2 token log-ratios) = exp(0.2 - 0.5) = e^-0.3;
    sequence 1 (A = -2: k 3, lambda 2): w = exp(-0.4 + 0 + 0). phi(w) = e^lambda w^k e^(-lambda w), detached, so
    d loss / d logp = -phi A / 5 tokens on each real token. Truncated IS weights multiply w, not the loss."""
    logps = torch.tensor(LOGPS, requires_grad=True)
    out = grpo.policy_loss(logps, torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK), loss_type="vespo",
                           epsilon_low=0.2, epsilon_high=0.2)
    out.loss.backward()

    def phi(w: float, k: float, lam: float) -> float:
        return math.exp(lam) * w**k * math.exp(-lam * w)

    p = [phi(math.exp(-0.3), 2.0, 3.0), phi(math.exp(-0.4), 3.0, 2.0)]
    real = [(b, t) for b in range(2) for t in range(3) if MASK[b][t]]
    assert out.loss.item() == pytest.approx(sum(-p[b] * ADV[b] * LOGPS[b][t] for b, t in real) / 5, rel=1e-6)
    want_grad = [[-p[b] * ADV[b] / 5 if MASK[b][t] else 0.0 for t in range(3)] for b in range(2)]
    assert logps.grad.tolist() == [pytest.approx(row, rel=1e-6) for row in want_grad]
    assert out.metrics["vespo/phi_seq_mean"] == pytest.approx(sum(p) / 2, rel=1e-6)
    # the IS weights 0.5 on sequence 0's first token: w halves there, and the loss is not multiplied by them
    weights = torch.tensor([[0.5, 1.0, 1.0], [1.0, 1.0, 1.0]])
    folded = grpo.policy_loss(torch.tensor(LOGPS), torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK),
                              loss_type="vespo", epsilon_low=0.2, epsilon_high=0.2, token_weights=weights,
                              vespo_k_pos=1.0, vespo_lambda_pos=0.5)
    p0 = phi(0.5 * math.exp(-0.3), 1.0, 0.5)
    assert folded.metrics["vespo/phi_seq_mean"] == pytest.approx((p0 + p[1]) / 2, rel=1e-6)
    assert folded.loss.item() == pytest.approx(
        (sum(-p0 * ADV[0] * LOGPS[0][t] for t in range(2)) + sum(-p[1] * ADV[1] * LOGPS[1][t] for t in range(3))) / 5,
        rel=1e-6)
