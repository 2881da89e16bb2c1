"""Record TRL 1.16's GRPO objectives as an oracle: tests/data/trl_objectives.json.

    python tests/data/record_trl_objectives.py     # needs trl==1.16.0 (the bench extra)

TRL's `GRPOTrainer._compute_loss` runs unmodified on fixed random batches with uneven completion lengths; only
its model call, `_get_per_token_logps_and_entropies`, is patched to return fixed per-token logprobs and
entropies (leaf tensors), so the loss value and its gradient with respect to those logprobs and entropies are
TRL's own. A step is two micro-batches (gradient accumulation), called the way TRL's Trainer calls them; adaptive
entropy cases run two steps so the controller's gating and update are recorded too.
tests/test_objectives_trl.py replays every case through backend.train.grpo and compares.

Advantages ("advantage_cases"): the rewards-to-advantages block of TRL's own source, cut verbatim out of
`GRPOTrainer._generate_and_score_completions` (multi_objective_aggregation x scale_rewards) and
`RLOOTrainer._generate_and_score_completions` (the leave-one-out baseline) and run on fixed reward matrices with
unscored (None) entries; tests/test_grpo_advantages.py replays them through backend.train.grpo.advantages.
"""

from __future__ import annotations

import inspect
import json
import math
import textwrap
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch
import trl
from trl import GRPOTrainer, RLOOTrainer
from trl.trainer.utils import nanstd

OUT = Path(__file__).with_name("trl_objectives.json")
B, T, GA = 6, 5, 2  # 6 completions of up to 5 tokens, two micro-batches of 3
LENGTHS = [[5, 2, 4, 1, 3, 5], [3, 5, 1, 4, 5, 2]]
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo"]
IS_CAP = 2.0  # the truncated importance sampling cases' cap
CLIPPED = ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"]


def make_batch(seed: int) -> dict[str, list]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T)
    for b, n in enumerate(LENGTHS[seed % 2]):
        mask[b, :n] = 1
    logps = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    # old and sampling policies some way off, so ratios cross both clip bounds and some sequences drift
    old = logps + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.35
    sampling = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    ref = logps + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.25
    entropies = torch.rand(B, T, generator=g, dtype=torch.float64) * 2.5
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[0], adv[1] = abs(adv[0]) + 0.1, -abs(adv[1]) - 0.1  # both signs in the first micro-batch
    # vLLM's truncated importance sampling ratios pi_old / pi_sampler (token_truncate, token_mask), 1 on padding
    ratio = torch.exp((old - sampling) * mask)
    is_truncate, is_mask = ratio.clamp(max=IS_CAP), ratio.masked_fill(ratio > IS_CAP, 0.0)
    return {k: v.tolist() for k, v in dict(logps=logps, old=old, sampling=sampling, ref=ref, entropies=entropies,
                                           advantages=adv, mask=mask, is_truncate=is_truncate,
                                           is_mask=is_mask).items()}


class Accel:
    """The accelerator calls _compute_loss makes, for one process."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def trl_trainer(opts: dict) -> GRPOTrainer:
    t = GRPOTrainer.__new__(GRPOTrainer)
    cfg = SimpleNamespace(delta=opts.get("delta"), sapo_temperature_pos=opts.get("sapo_temperature_pos", 1.0),
                          sapo_temperature_neg=opts.get("sapo_temperature_neg", 1.05),
                          use_bias_correction_kl=opts.get("use_bias_correction_kl", False), steps_per_generation=GA,
                          entropy_target=opts.get("entropy_target", 0.2),
                          entropy_coef_delta=opts.get("entropy_coef_delta", 0.005),
                          entropy_coef_min=opts.get("entropy_coef_min", 0.0),
                          entropy_coef_max=opts.get("entropy_coef_max", 1.0),
                          vespo_k_pos=opts.get("vespo_k_pos", 2.0), vespo_lambda_pos=opts.get("vespo_lambda_pos", 3.0),
                          vespo_k_neg=opts.get("vespo_k_neg", 3.0), vespo_lambda_neg=opts.get("vespo_lambda_neg", 2.0))
    t.__dict__.update(
        args=cfg, accelerator=Accel(), model=SimpleNamespace(training=True), _metrics={"train": defaultdict(list)},
        loss_type=opts["loss_type"], importance_sampling_level=opts.get("importance_sampling_level", "token"),
        beta=opts.get("beta", 0.0), epsilon_low=opts.get("epsilon", 0.2),
        epsilon_high=opts.get("epsilon_high", opts.get("epsilon", 0.2)),
        off_policy_mask_threshold=opts.get("off_policy_mask_threshold"),
        top_entropy_quantile=opts.get("top_entropy_quantile", 1.0), entropy_coef=opts.get("entropy_coef", 0.0),
        use_adaptive_entropy=opts.get("use_adaptive_entropy", False), _last_world_entropy=float("inf"),
        _entropy_window_stats=None, aux_loss_enabled=False, use_vllm="is_ratio" in opts,
        vllm_importance_sampling_correction="is_ratio" in opts,
        current_gradient_accumulation_steps=GA, max_completion_length=T)
    t._entropy_bonus_enabled = t.entropy_coef != 0.0 or t.use_adaptive_entropy
    return t


def run_case(batch: dict[str, list], opts: dict) -> dict:
    t = trl_trainer(opts)
    logps = torch.tensor(batch["logps"], dtype=torch.float64, requires_grad=True)
    entropies = torch.tensor(batch["entropies"], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor(batch["mask"]).long()
    mb = B // GA
    current: dict[str, slice] = {}

    def fake_logps(model, input_ids, attention_mask, logits_to_keep, **_):
        sl = current["sl"]
        return logps[sl], entropies[sl], None

    t._get_per_token_logps_and_entropies = fake_logps
    steps = []
    for _ in range(opts.get("steps", 1)):
        logps.grad = entropies.grad = None
        t._metrics["train"].clear()
        total = 0.0
        for i in range(GA):
            sl = slice(i * mb, (i + 1) * mb)
            current["sl"] = sl
            t.accelerator.sync_gradients = i == GA - 1
            inputs = {
                "prompt_ids": torch.zeros(mb, 2, dtype=torch.long), "prompt_mask": torch.ones(mb, 2, dtype=torch.long),
                "completion_ids": torch.zeros(mb, T, dtype=torch.long), "completion_mask": mask[sl],
                "advantages": torch.tensor(batch["advantages"], dtype=torch.float64)[sl],
                "num_items_in_batch": mask.sum().to(torch.float64),
            }
            if opts.get("old", True):
                inputs["old_per_token_logps"] = torch.tensor(batch["old"], dtype=torch.float64)[sl]
            if opts.get("sampling", False):
                inputs["sampling_per_token_logps"] = torch.tensor(batch["sampling"], dtype=torch.float64)[sl]
            if "is_ratio" in opts:  # "truncate" or "mask": the batch's is_truncate / is_mask
                inputs["importance_sampling_ratio"] = torch.tensor(batch[f"is_{opts['is_ratio']}"],
                                                                   dtype=torch.float64)[sl]
            if opts.get("beta", 0.0):
                inputs["ref_per_token_logps"] = torch.tensor(batch["ref"], dtype=torch.float64)[sl]
            loss = t._compute_loss(None, inputs)
            loss.backward()
            total += loss.item()
        metrics = {k: sum(v) / len(v) for k, v in t._metrics["train"].items()
                   if k in ("kl", "cispo_clip_ratio", "entropy_coef") or k.endswith("_mean")}
        steps.append({
            "loss": total, "grad_logps": logps.grad.tolist(),
            "grad_entropies": entropies.grad.tolist() if entropies.grad is not None else [[0.0] * T] * B,
            "metrics": metrics, "entropy_coef_after": t.entropy_coef,
        })
    return {"options": opts, "steps": steps}


def cases() -> list[dict]:
    out: list[dict] = []

    def add(batch: int, **opts) -> None:
        out.append({"batch": batch, **opts})

    for lt in LOSS_TYPES:
        for level in ("token", "sequence"):
            add(0, loss_type=lt, importance_sampling_level=level)  # every loss type at both ratio levels
            add(1, loss_type=lt, importance_sampling_level=level, beta=0.05, use_bias_correction_kl=True)
        add(1, loss_type=lt, beta=0.05)  # KL without the bias correction
        add(0, loss_type=lt, old=False)  # on policy: old logprobs are the policy's own, detached
        add(0, loss_type=lt, off_policy_mask_threshold=0.05, sampling=True)
        add(1, loss_type=lt, off_policy_mask_threshold=0.0)  # no sampling logprobs: old ones stand in
        add(0, loss_type=lt, top_entropy_quantile=0.4)
        add(1, loss_type=lt, entropy_coef=0.03)
        add(0, loss_type=lt, entropy_coef=0.02, use_adaptive_entropy=True, entropy_target=2.0,
            entropy_coef_delta=0.01, steps=3)  # entropy ~1.25 <= target: off at step 1, then on and growing
        add(1, loss_type=lt, entropy_coef=0.02, use_adaptive_entropy=True, entropy_target=0.5,
            entropy_coef_delta=0.015, entropy_coef_min=0.01, steps=2)  # above target: coefficient decays to min
        add(0, loss_type=lt, importance_sampling_level="sequence", top_entropy_quantile=0.5, entropy_coef=0.01,
            off_policy_mask_threshold=0.02, sampling=True, beta=0.04, use_bias_correction_kl=True)
    for lt in CLIPPED:
        add(0, loss_type=lt, delta=1.3)
        add(1, loss_type=lt, delta=1.25, epsilon_high=0.28, importance_sampling_level="sequence")
    add(0, loss_type="grpo", epsilon=0.2, epsilon_high=0.28)
    add(0, loss_type="cispo", epsilon_high=5.0)
    add(1, loss_type="cispo", epsilon_high=1.1, top_entropy_quantile=0.0)  # quantile 0: only the top token
    add(0, loss_type="sapo", sapo_temperature_pos=2.0, sapo_temperature_neg=3.5)
    add(1, loss_type="sapo", sapo_temperature_pos=0.5, sapo_temperature_neg=1.05, importance_sampling_level="sequence",
        top_entropy_quantile=1.0, off_policy_mask_threshold=0.1)
    for lt in LOSS_TYPES:  # truncated importance sampling: vespo folds the ratios into its weight, the rest multiply
        add(1, loss_type=lt, is_ratio="truncate")
    add(0, loss_type="vespo", is_ratio="mask")
    add(0, loss_type="vespo", vespo_k_pos=1.0, vespo_lambda_pos=0.5, vespo_k_neg=4.0, vespo_lambda_neg=5.0)
    add(1, loss_type="vespo", vespo_k_pos=0.0, vespo_lambda_pos=0.0, vespo_k_neg=0.5, vespo_lambda_neg=1.5,
        beta=0.03, use_bias_correction_kl=True)  # lambda 0: TRL's floor of 1e-4
    add(0, loss_type="dapo", epsilon_high=0.28, delta=1.5, off_policy_mask_threshold=0.05, sampling=True,
        top_entropy_quantile=0.3, entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=2.0, beta=0.02,
        use_bias_correction_kl=True, steps=2)
    return out


ADV_G = 4  # completions per group in the advantage cases
ADV_WEIGHTS = [1.0, 0.5, -2.0]


def reward_matrix(seed: int, unscorable: int) -> torch.Tensor:
    """(12, 3) rewards of 3 groups of 4: 0/1 correctness, a graded score, a penalty; some None (NaN), one group
    where a function scores all alike, and `unscorable` completions no function scored: 1 (row 6), or 4 (row 6
    and rows 8-10, so the last group has a single scored completion: no std, no leave-one-out baseline)."""
    g = torch.Generator().manual_seed(100 + seed)
    r = torch.stack([(torch.rand(12, generator=g, dtype=torch.float64) > 0.5).double(),
                     torch.rand(12, generator=g, dtype=torch.float64) * 3,
                     -torch.rand(12, generator=g, dtype=torch.float64) * 0.5], dim=1)
    r[4:8, 0] = 1.0  # the whole group solved: that function carries no signal there
    r[1, 1] = r[9, 2] = r[10, 2] = float("nan")
    if unscorable:
        r[6] = float("nan")
    if unscorable > 1:
        r[8:11] = float("nan")
    return r


def trl_block(cls: type, start: str, end: str) -> str:
    """The lines of `cls._generate_and_score_completions` from the one holding `start` to the one holding `end`."""
    src = inspect.getsource(cls._generate_and_score_completions)
    i = src.rfind("\n", 0, src.index(start)) + 1
    j = src.index("\n", src.index(end, i))
    return textwrap.dedent(src[i:j])


def trl_advantages(cls: type, rewards_per_func: torch.Tensor, **attrs) -> list[float]:
    block = trl_block(cls, "unscorable_mask = torch.isnan(rewards_per_func)", "advantages = torch.nan_to_num(")
    me = SimpleNamespace(reward_weights=torch.tensor(ADV_WEIGHTS, dtype=torch.float64),
                         reward_funcs=[None] * len(ADV_WEIGHTS), beta=0.0, reward_clip_range=None, **attrs)
    scope = {"torch": torch, "nanstd": nanstd, "self": me, "rewards_per_func": rewards_per_func,
             "num_generations": ADV_G, "device": "cpu"}
    exec(block, scope)  # noqa: S102 - TRL's own source, cut out of the installed package
    return scope["advantages"].tolist()


def advantage_cases() -> list[dict]:
    """Both aggregations x scale_rewards, and RLOO, on matrices with and without completions no function scored
    (TRL 1.16 leaves those out of the statistics and gives them advantage 0, GRPOTrainer and RLOOTrainer alike)."""
    out = []
    for seed, unscorable in ((0, 0), (1, 0), (2, 1), (3, 4)):
        r = reward_matrix(seed, unscorable)
        for agg in ("sum_then_normalize", "normalize_then_sum"):
            for scale in ("group", "batch", "none"):
                adv = trl_advantages(GRPOTrainer, r, multi_objective_aggregation=agg, scale_rewards=scale)
                out.append({"trainer": "grpo", "multi_objective_aggregation": agg, "scale_rewards": scale,
                            "rewards": r.tolist(), "advantages": adv})
        adv = trl_advantages(RLOOTrainer, r, normalize_advantages=False)
        out.append({"trainer": "rloo", "rewards": r.tolist(), "advantages": adv})
    return out


def main() -> None:
    torch.manual_seed(0)
    batches = [make_batch(s) for s in range(2)]
    recorded = []
    for c in cases():
        c = dict(c)
        batch = c.pop("batch")
        rec = run_case(batches[batch], c)
        for s in rec["steps"]:
            assert math.isfinite(s["loss"]), c
        recorded.append({"batch": batch, **rec})
    OUT.write_text(json.dumps({"trl_version": trl.__version__, "B": B, "T": T, "gradient_accumulation_steps": GA,
                               "batches": batches, "cases": recorded, "advantage_group_size": ADV_G,
                               "advantage_weights": ADV_WEIGHTS, "advantage_cases": advantage_cases()},
                              separators=(",", ":")) + "\n")
    print(f"{len(recorded)} cases from TRL {trl.__version__} -> {OUT} ({OUT.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
