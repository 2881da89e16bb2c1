"""GRPO math: rewards to advantages, per-token log-probabilities, and the policy objectives.

Pure tensor functions, no trainer state, so each formula can be checked by hand in tests and against
the reference implementation: the loss equals TRL 1.16's `GRPOTrainer._compute_loss` in value and in
gradient for every loss type and option it takes (tests/test_objectives_trl.py replays recorded TRL cases).
Option names are TRL's GRPOConfig names, so configs and papers carry over.

The objectives are verl-style: a registry (`POLICY_TERMS`) of one small per-token function per loss type of
`spec.LOSS_TYPES`, the table that also says how each is normalised (`aggregate`). The trainer calls
`loss(algorithm, LossInputs(...))`; `policy_loss(...)` is the same under TRL's keyword names, for the parity
tests.
Advantages: `advantages(algorithm, per_fn, weights, G)` is the trainer's entry (advantage_estimator with ms-swift's
semantics, multi_objective_aggregation with TRL's; tests/test_grpo_advantages.py replays TRL's own code for both).
Notation: B completions, T completion tokens (right padded), mask[b, t] = 1 on real tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from backend.spec import CLIPPED_LOSS_TYPES, LOSS_TYPES, AlgorithmSection, Normaliser


def combine_rewards(per_fn: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(B, F) rewards with NaN for 'not scored' -> (B,) weighted sum; NaN counts as 0 (TRL's nansum)."""
    return torch.nansum(per_fn * weights[None, :], dim=1)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str, virtual_reward: float | None = None,
                     estimator: str = "grpo") -> tuple[torch.Tensor, torch.Tensor]:
    """Advantage = reward - a baseline from its group, divided by a std (`scale`: group, batch, or none = 1).

    Returns (advantages (B,), per-group std of the rewards (B / G,)). Groups are consecutive runs of `group_size`.
    Stds are unbiased (as torch.std, TRL and ms-swift), plus 1e-4 so zero-std groups give 0, not NaN.
    A NaN reward is a completion no reward function scored (TRL 1.16's rule, GRPOTrainer and RLOOTrainer
    alike): it is left out of every mean and std and gets advantage 0; so does a group or batch with fewer than
    two scored completions where a std is taken (nanstd is NaN there), and rloo's group with one scored
    completion (its leave-one-out baseline is 0 / 0). ms-swift has no such rule (compute_advantages nansums the
    row to 0 and counts it like any other, for every estimator); we take TRL's for all three estimators, as a
    reward 0 nobody gave biases the baseline and hands the completion a spurious advantage.
    `estimator` (ms-swift's advantage_estimator, swift/rl_core/advantage.py):
        grpo                 r - group mean; scaled by the rewards' group or batch std
        rloo                 r - mean of the group's other n - 1 scored rewards = (r - group mean) n / (n - 1);
                             scaled by the rewards' group or batch std, as grpo (TRL's RLOO with scale none)
        reinforce_plus_plus  r - group mean; scaled by the std of these advantages over the batch (batch: the
                             REINFORCE++ whitening) or within the group (group: the same as grpo's)
    `virtual_reward` (NGRPO's advantage calibration, grpo only) adds one virtual completion with that reward to
    each group's mean and (group-scale) std; it gets no advantage itself. A group all at that reward still gets
    0, a group all below it gets negative advantages. The per-group std returned is always the real group's.
    """
    if estimator not in ("grpo", "rloo", "reinforce_plus_plus"):
        raise ValueError(f"unknown advantage_estimator {estimator!r}")
    if virtual_reward is not None and estimator != "grpo":
        raise ValueError("advantage calibration (virtual_reward) is defined for the grpo estimator only")
    grouped = rewards.view(-1, group_size)
    group_std = grouped.std(dim=1)
    stats = grouped
    if virtual_reward is not None:
        stats = torch.cat([grouped, grouped.new_full((grouped.shape[0], 1), virtual_reward)], dim=1)
    adv = rewards - torch.nanmean(stats, dim=1).repeat_interleave(group_size)
    if estimator == "rloo" and group_size > 1:
        scored = (~torch.isnan(grouped)).sum(dim=1).to(rewards.dtype).repeat_interleave(group_size)
        adv = adv * scored / (scored - 1)
    if scale == "group":
        std = nanstd(adv.view(-1, group_size) if estimator == "reinforce_plus_plus" else stats, dim=1)
        adv = adv / (std.repeat_interleave(group_size) + 1e-4)
    elif scale == "batch":
        adv = adv / (nanstd(adv if estimator == "reinforce_plus_plus" else rewards) + 1e-4)
    elif scale != "none":
        raise ValueError(f"unknown scale_rewards {scale!r}")
    return torch.where(torch.isnan(adv), 0.0, adv), group_std  # an overflow's inf stays for the guard to see


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased std ignoring NaNs (TRL's trainer.utils.nanstd): NaN where fewer than two values are not NaN."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True).to(x.dtype)  # TRL's int division rounds this to float32
    var = var * torch.where(count > 1, count / (count - 1), torch.full_like(var, float("nan")))
    std = var.sqrt()
    if keepdim:
        return std
    return std.squeeze() if dim is None else std.squeeze(dim)


def decoupled_advantages(per_fn: torch.Tensor, weights: torch.Tensor, group_size: int) -> torch.Tensor:
    """multi_objective_aggregation normalize_then_sum (GDPO), TRL 1.16's formula: (B, F) rewards -> (B,) advantages.

    Each function's rewards are normalised within the group, (r - group mean) / (group std + 1e-4), over the
    completions it scored (NaN = not scored: left out of its mean and std, counts 0 in the sum); the weighted sum
    of these is normalised over the batch, (s - mean) / (std + 1e-4). A completion no function scored is left out
    of the batch statistics and gets advantage 0. scale_rewards does not apply (as in TRL).
    """
    G, F = group_size, per_fn.shape[1]
    unscorable = torch.isnan(per_fn).all(dim=1)
    grouped = per_fn.view(-1, G, F)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = nanstd(grouped, dim=1, keepdim=True) if G > 1 else torch.zeros_like(mean)
    normalised = ((grouped - mean) / (std + 1e-4)).view(-1, F)
    summed = torch.nansum(normalised * weights[None, :], dim=1)
    summed[unscorable] = float("nan")
    batch_std = nanstd(summed) if summed.numel() > 1 else torch.zeros_like(summed)
    return torch.nan_to_num((summed - torch.nanmean(summed)) / (batch_std + 1e-4), nan=0.0)


def sequence_kl(old_logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B,): each completion's KL(pi_old || pi_ref) as kl_in_reward charges it, ms-swift's estimate:
    the k1 log-ratio log pi_old - log pi_ref summed (not averaged) over the completion's tokens."""
    return torch.where(mask.bool(), old_logps - ref_logps, 0.0).sum(-1)  # padding's logps may be anything


@dataclass
class Advantages:
    advantages: torch.Tensor  # (B,)
    rewards: torch.Tensor  # (B,): the weighted reward sum (combine_rewards), what is reported
    group_std: torch.Tensor  # (B / G,): the std of `rewards` within each group


def advantages(a: AlgorithmSection, per_fn: torch.Tensor, weights: torch.Tensor, group_size: int,
               kl: torch.Tensor | None = None) -> Advantages:
    """The trainer's entry: (B, F) per-function rewards (NaN = not scored) -> advantages under the algorithm section
    (multi_objective_aggregation, advantage_estimator, scale_rewards, advantage_calibration).

    `kl` (B,), with kl_in_reward (sequence_kl): ms-swift's compute_advantages subtracts beta x kl from the weighted
    reward before the baseline and the std, so the returned `rewards` carry the penalty too. normalize_then_sum
    has no summed reward to charge it to (ms-swift turns kl_in_reward off under gdpo; checks.py refuses it). A
    completion whose KL is not finite gets a NaN advantage, so the batch is skipped (guard.batch_problem)."""
    rewards = combine_rewards(per_fn, weights)
    if kl is not None:
        if a.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError("kl_in_reward needs multi_objective_aggregation sum_then_normalize")
        rewards = rewards - a.beta * kl
    if a.multi_objective_aggregation == "normalize_then_sum":
        return Advantages(decoupled_advantages(per_fn, weights, group_size), rewards,
                          rewards.view(-1, group_size).std(dim=1))
    if a.multi_objective_aggregation != "sum_then_normalize":
        raise ValueError(f"unknown multi_objective_aggregation {a.multi_objective_aggregation!r}")
    unscored = rewards.clone()
    unscored[torch.isnan(per_fn).all(dim=1)] = float("nan")  # no function scored it: out of the statistics
    adv, _ = group_advantages(unscored, group_size, a.scale_rewards,
                              a.solved_reward if a.advantage_calibration else None, a.advantage_estimator)
    if kl is not None:  # a KL that is not finite (a broken reference pass) is no unscored row: the guard skips it
        adv = torch.where(torch.isfinite(kl), adv, float("nan"))
    return Advantages(adv, rewards, rewards.view(-1, group_size).std(dim=1))


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[index] without materialising the full log-softmax for the gradient."""
    return logits.gather(-1, index.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = logits.log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


@dataclass
class LossOut:
    loss: torch.Tensor  # this micro-batch's contribution; summing over micro-batches gives the step's loss
    kl: torch.Tensor  # masked token mean of the (bias-corrected) k3 estimate (0 when beta = 0)
    metrics: dict[str, float]  # TRL-named diagnostics of this micro-batch (clip ratios, masked fractions)
    entropy_sum: float = 0.0  # entropy summed over the tokens the bonus acts on (the adaptive controller's input)
    entropy_tokens: float = 0.0

    @property
    def clip_low(self) -> float:
        return self.metrics["clip_ratio/low_mean"]

    @property
    def clip_high(self) -> float:
        return self.metrics["clip_ratio/high_mean"]

    @property
    def clip_region(self) -> float:
        return self.metrics["clip_ratio/region_mean"]


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """Tokens whose entropy is in the top `top_quantile` of the micro-batch's real tokens ("80/20": 0.2).

    TRL's get_high_entropy_mask: threshold = quantile(entropies of real tokens, 1 - top_quantile); ties kept.
    """
    real = mask.bool()
    values = entropies.detach()[real].float()
    if values.numel() == 0:
        return torch.zeros_like(real)
    threshold = torch.quantile(values, 1 - top_quantile)
    return ((entropies.detach() * mask) >= threshold) & real


def off_policy_mask(advantages: torch.Tensor, logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
                    threshold: float) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask, (B, 1): drop a sequence when its advantage is negative and the
    mean over its tokens of log pi_sampling - log pi_theta (a KL estimate) exceeds `threshold`."""
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)  # unscored tokens give no evidence
    seq_kl = (kl * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return ((advantages.unsqueeze(-1) >= 0) | (seq_kl <= threshold)).to(mask.dtype)


def entropy_coef_to_apply(coef: float, last_entropy: float, *, adaptive: bool, target: float) -> float:
    """The coefficient this step's entropy bonus uses. Adaptive (Skywork-OR1): only while the entropy measured at
    the previous step is at or below the target (the first step has none: inf, no bonus)."""
    if not adaptive:
        return coef
    return coef if last_entropy <= target else 0.0


def next_entropy_coef(coef: float, entropy: float, *, target: float, delta: float, coef_min: float,
                      coef_max: float) -> float:
    """Adaptive entropy control after an optimizer step: raise the coefficient by `delta` when the step's entropy
    is at or below the target, lower it otherwise, within [coef_min, coef_max]."""
    if entropy <= target:
        return min(coef + delta, coef_max)
    return max(coef - delta, coef_min)


@dataclass
class EntropyControl:
    """The entropy bonus's coefficient across optimizer steps (TRL's entropy_coef / _last_world_entropy).

    Static: `coef` throughout. Adaptive: `apply()` gives the coefficient for this step's micro-batches and
    `update(entropy_sum, tokens)` (the whole step's totals) moves it for the next step.
    """

    coef: float
    adaptive: bool = False
    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    last_entropy: float = math.inf

    @property
    def enabled(self) -> bool:
        return self.coef != 0.0 or self.adaptive

    def apply(self) -> float:
        return entropy_coef_to_apply(self.coef, self.last_entropy, adaptive=self.adaptive, target=self.target)

    def update(self, entropy_sum: float, tokens: float) -> None:
        if not self.adaptive:
            return
        entropy = entropy_sum / max(tokens, 1.0)
        self.coef = next_entropy_coef(self.coef, entropy, target=self.target, delta=self.delta,
                                      coef_min=self.coef_min, coef_max=self.coef_max)
        self.last_entropy = entropy


# ----------------------------------------------------------------------------- the objectives
# verl-style: one small function per objective's per-token term, registered under the loss type's name in
# spec.LOSS_TYPES (tests/test_loss_types.py holds the keys equal), and one aggregation that reads the table's
# normaliser. Everything else (masks, importance weights, KL, entropy bonus) is the same for every loss type.


@dataclass(frozen=True)
class Objective:
    """The algorithm options the loss math reads, resolved (TRL's GRPOConfig names): `Objective.of(algorithm)`."""

    loss_type: str
    epsilon_low: float
    epsilon_high: float  # the upper clip range in effect (AlgorithmSection.upper_clip); cispo: the weight's cap
    is_level: str = "token"  # importance_sampling_level
    beta: float = 0.0
    delta: float | None = None  # two-sided clip (None = off)
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    use_bias_correction_kl: bool = False
    off_policy_mask_threshold: float | None = None  # None = off
    top_entropy_quantile: float = 1.0
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0

    @classmethod
    def of(cls, a: AlgorithmSection) -> Objective:
        return cls(loss_type=a.loss_type, epsilon_low=a.epsilon, epsilon_high=a.upper_clip,
                   is_level=a.importance_sampling_level, beta=0.0 if a.kl_in_reward else a.beta,  # in the reward
                   delta=a.delta or None,
                   sapo_temperature_pos=a.sapo_temperature_pos, sapo_temperature_neg=a.sapo_temperature_neg,
                   use_bias_correction_kl=a.use_bias_correction_kl,
                   off_policy_mask_threshold=a.off_policy_mask_threshold or None,
                   top_entropy_quantile=a.top_entropy_quantile, vespo_k_pos=a.vespo_k_pos,
                   vespo_lambda_pos=a.vespo_lambda_pos, vespo_k_neg=a.vespo_k_neg, vespo_lambda_neg=a.vespo_lambda_neg)


@dataclass
class LossInputs:
    """One micro-batch's tensors and the step's counts. B rows, T completion tokens (right padded)."""

    logps: torch.Tensor  # (B, T) under the policy being trained, with grad
    old_logps: torch.Tensor | None  # (B, T) of the policy before this batch's updates; None = logps (ratio 1)
    advantages: torch.Tensor  # (B,)
    mask: torch.Tensor  # (B, T): 1 on the tokens the loss acts on
    ref_logps: torch.Tensor | None = None  # (B, T) of the reference model (needed when beta > 0)
    sampling_logps: torch.Tensor | None = None  # (B, T) from the engine, for the off-policy mask (else old_logps)
    entropies: torch.Tensor | None = None  # (B, T): the entropy bonus and the top-entropy mask read them
    token_weights: torch.Tensor | None = None  # (B, T) or (B, 1): truncated importance sampling (importance_weights)
    entropy_coef: float = 0.0  # the coefficient to apply now (EntropyControl.apply)
    global_num_tokens: float | None = None  # loss tokens in the whole step, all ranks (None: this micro-batch's x count)
    global_num_seqs: int | None = None  # sequences in the whole step, all ranks (None: B x num_micro_batches)
    num_micro_batches: int = 1  # micro-batches in the step (gradient accumulation)
    max_completion_length: int | None = None  # dr_grpo's normaliser


@dataclass
class TermInputs:
    """What a per-token term reads. B rows, T tokens."""

    ratio: torch.Tensor  # (B, T), or (B, 1) at importance_sampling_level sequence
    adv: torch.Tensor  # (B, 1)
    logps: torch.Tensor  # (B, T), with grad
    log_ratio: torch.Tensor  # (B, T): logps - old_logps per token, whatever the level
    mask: torch.Tensor  # (B, T)
    token_weights: torch.Tensor | None  # truncated IS weights; handed only to terms that fold them in (LOSS_TYPES)
    metrics: dict[str, float]  # a term's own diagnostics (TRL's names) go here


# (inputs, objective) -> the per-token loss before masks, (B, T) or (B, 1)
PolicyTerm = Callable[[TermInputs, Objective], torch.Tensor]
POLICY_TERMS: dict[str, PolicyTerm] = {}


def register_term(*loss_types: str) -> Callable[[PolicyTerm], PolicyTerm]:
    """Register `fn` as the per-token term of `loss_types` (names of spec.LOSS_TYPES)."""
    def deco(fn: PolicyTerm) -> PolicyTerm:
        for name in loss_types:
            if name not in LOSS_TYPES:
                raise ValueError(f"{name!r} is not in spec.LOSS_TYPES")
            POLICY_TERMS[name] = fn
        return fn
    return deco


@register_term(*CLIPPED_LOSS_TYPES)
def clipped_term(t: TermInputs, o: Objective) -> torch.Tensor:
    """PPO's clipped surrogate: -min(r' A, clip(r, 1 - eps_low, 1 + eps_high) A), r' = min(r, delta) when `delta`
    is set (INTELLECT-2's two-sided clip), else r."""
    clipped = torch.clamp(t.ratio, 1 - o.epsilon_low, 1 + o.epsilon_high)
    unclipped = torch.clamp(t.ratio, max=o.delta) if o.delta is not None else t.ratio
    return -torch.min(unclipped * t.adv, clipped * t.adv)


@register_term("cispo")
def cispo_term(t: TermInputs, o: Objective) -> torch.Tensor:
    """MiniMax-M1's CISPO: -sg(min(r, eps_high)) A logp; the IS weight is clipped and detached, eps_high is the cap."""
    weight = torch.clamp(t.ratio, max=o.epsilon_high).detach()
    return -weight * t.adv * t.logps


@register_term("sapo")
def sapo_term(t: TermInputs, o: Objective) -> torch.Tensor:
    """SAPO's soft gate: -sigmoid(tau (r - 1)) 4 / tau A, tau = sapo_temperature_pos if A > 0 else _neg."""
    tau = torch.where(t.adv > 0, o.sapo_temperature_pos, o.sapo_temperature_neg)
    return -(torch.sigmoid(tau * (t.ratio - 1)) * 4 / tau) * t.adv


_LOG_1E8 = math.log(1e-8)  # VESPO's lower clamp of log w (TRL's, from the paper's code)


@torch.no_grad()
def vespo_weights(log_ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, token_weights: torch.Tensor | None,
                  o: Objective) -> torch.Tensor:
    """VESPO's Gamma weight per sequence, (B, 1), detached (TRL's get_gamma_weights):
    phi(w) = exp(lambda) w^k exp(-lambda w), so phi(1) = 1, computed in log space: log phi = lambda + k log w - lambda w.

    w is the sequence's whole importance ratio, exp of the SUM of its token log-ratios (each clamped to [-20, 20]),
    times the truncated IS weights' product when given (log-clamped to [log 1e-8, 20]); log w is clamped to
    [log 1e-8, 20]. k, lambda are the _pos pair for A >= 0, the _neg pair for A < 0; lambda at least 1e-4.
    A non-finite phi is 0. The IS weights are summed over the loss mask (TRL: over all positions, where padding
    holds weight 1, the same).
    """
    seq = (log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True)
    if token_weights is not None:
        seq = seq + (torch.log(token_weights).clamp(_LOG_1E8, 20.0) * mask).sum(-1, keepdim=True)
    log_w = seq.clamp(_LOG_1E8, 20.0)
    nonneg = adv >= 0
    k = torch.where(nonneg, o.vespo_k_pos, o.vespo_k_neg)
    lam = torch.where(nonneg, o.vespo_lambda_pos, o.vespo_lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@register_term("vespo")
def vespo_term(t: TermInputs, o: Objective) -> torch.Tensor:
    """VESPO: -sg(phi(w)) A logp, phi the sequence's Gamma weight (vespo_weights), which takes the truncated IS
    weights in (so they do not multiply the loss as well: LOSS_TYPES["vespo"].folds_is_weights)."""
    phi = vespo_weights(t.log_ratio, t.adv, t.mask, t.token_weights, o)
    t.metrics["vespo/phi_seq_mean"] = float(phi.mean())
    return -phi * t.adv * t.logps


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, normaliser: Normaliser, x: LossInputs) -> torch.Tensor:
    """This micro-batch's share of the step's loss under `normaliser` (see spec.Normaliser): summed over the
    step's micro-batches (and ranks, for a global normaliser) it gives the step's loss."""
    n_seqs = x.global_num_seqs if x.global_num_seqs is not None else x.logps.shape[0] * x.num_micro_batches
    if normaliser == "sequence_mean":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / n_seqs
    if normaliser == "micro_batch_tokens":
        return (per_token * mask).sum() / mask.sum().clamp(min=1) / x.num_micro_batches
    if normaliser == "constant":
        if x.max_completion_length is None:
            raise ValueError("a constant normaliser (dr_grpo) needs max_completion_length")
        return (per_token * mask).sum() / (n_seqs * x.max_completion_length)
    if normaliser == "global_tokens":
        tokens = x.global_num_tokens if x.global_num_tokens is not None else float(mask.sum()) * x.num_micro_batches
        return (per_token * mask).sum() / max(tokens, 1.0)
    if normaliser == "sequence_sum":
        return (per_token * mask).sum(-1).sum() / n_seqs
    raise ValueError(f"unknown normaliser {normaliser!r}")


def loss(a: AlgorithmSection, x: LossInputs) -> LossOut:
    """The policy objective of one micro-batch under the spec's algorithm section (the trainer's entry)."""
    return objective_loss(Objective.of(a), x)


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str,
    epsilon_low: float,
    epsilon_high: float,
    is_level: str = "token",
    beta: float = 0.0,
    ref_logps: torch.Tensor | None = None,
    num_micro_batches: int = 1,
    max_completion_length: int | None = None,
    global_num_tokens: float | None = None,
    global_num_seqs: int | None = None,
    delta: float | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    use_bias_correction_kl: bool = False,
    off_policy_mask_threshold: float | None = None,
    sampling_logps: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
    entropies: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
) -> LossOut:
    """`objective_loss` under TRL's keyword names, one argument per GRPOConfig option: the form the TRL parity
    tests (tests/test_objectives_trl.py, tests/test_grpo_math.py) replay recorded cases through."""
    objective = Objective(loss_type, epsilon_low, epsilon_high, is_level, beta, delta, sapo_temperature_pos,
                          sapo_temperature_neg, use_bias_correction_kl, off_policy_mask_threshold, top_entropy_quantile,
                          vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg)
    return objective_loss(objective, LossInputs(
        logps, old_logps, advantages, mask, ref_logps=ref_logps, sampling_logps=sampling_logps, entropies=entropies,
        token_weights=token_weights, entropy_coef=entropy_coef, global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs, num_micro_batches=num_micro_batches,
        max_completion_length=max_completion_length))


def objective_loss(o: Objective, x: LossInputs) -> LossOut:
    """The policy objective of one micro-batch, TRL 1.16's `_compute_loss` term by term.

    ratio r = exp(logps - old_logps) per token, or for is_level='sequence' (GSPO) one ratio per sequence,
    exp(mean over its tokens of the log-ratio). The per-token loss is the loss type's registered term
    (POLICY_TERMS: clipped_term, cispo_term, sapo_term, vespo_term), then times the off-policy sequence mask
    (off_policy_mask_threshold, against `sampling_logps`, else old_logps) and the high-entropy token mask
    (top_entropy_quantile < 1, from `entropies`), plus the truncated importance sampling weights
    (`token_weights`, see importance_weights; vespo folds them into its weight instead), plus beta * k3 KL to the reference (times r when
    use_bias_correction_kl: DeepSeek-V3.2's unbiased estimate).
    Aggregation over the step (all micro-batches of one optimizer step) is the table's normaliser (`aggregate`):
        grpo, sapo:   mean over sequences of each sequence's token mean
        bnpo:         token mean within each micro-batch, averaged over micro-batches
        dr_grpo:      token sum / (sequences in the step x max_completion_length)
        dapo, cispo, vespo: token sum / tokens in the whole step
        luspo:        mean over sequences of each sequence's token sum
    Entropy bonus: minus entropy_coef x the mean entropy of the tokens the loss acts on, per micro-batch,
    averaged over micro-batches (the same for every loss type). `entropy_coef` is the coefficient to apply now
    (see entropy_coef_to_apply). The returned loss is this micro-batch's share, so gradients accumulate to the
    step's loss.
    """
    term = POLICY_TERMS.get(o.loss_type)
    if term is None:
        raise ValueError(f"unknown loss_type {o.loss_type!r}")
    logps, entropies, num_micro_batches = x.logps, x.entropies, x.num_micro_batches
    mask = x.mask.to(logps.dtype)
    adv = x.advantages.unsqueeze(-1)
    old_logps = x.old_logps if x.old_logps is not None else logps.detach()

    entropy_mask = None
    if o.top_entropy_quantile < 1.0:
        if entropies is None:
            raise ValueError("top_entropy_quantile < 1 needs per-token entropies")
        entropy_mask = high_entropy_mask(entropies, mask, o.top_entropy_quantile).to(mask.dtype)
    seq_mask = None
    if o.off_policy_mask_threshold is not None:
        reference = x.sampling_logps if x.sampling_logps is not None else old_logps
        seq_mask = off_policy_mask(x.advantages, logps, reference, mask, o.off_policy_mask_threshold)

    log_ratio = log_ratio_tokens = logps - old_logps
    if o.is_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    elif o.is_level != "token":
        raise ValueError(f"unknown importance_sampling_level {o.is_level!r}")
    ratio = torch.exp(log_ratio)

    per_token_kl = None
    if o.beta != 0.0:
        if x.ref_logps is None:
            raise ValueError("beta > 0 needs reference logprobs")
        d = x.ref_logps - logps
        per_token_kl = torch.exp(d) - d - 1
        if o.use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio

    folds = LOSS_TYPES[o.loss_type].folds_is_weights
    term_metrics: dict[str, float] = {}
    per_token = term(TermInputs(ratio, adv, logps, log_ratio_tokens, mask, x.token_weights if folds else None,
                                term_metrics), o)
    if seq_mask is not None:
        per_token = per_token * seq_mask
    if entropy_mask is not None:
        per_token = per_token * entropy_mask
    if x.token_weights is not None and not folds:  # truncated importance sampling (importance_weights), as TRL: not on the KL term
        per_token = per_token * x.token_weights
    if per_token_kl is not None:
        per_token = per_token + o.beta * per_token_kl
    per_token = per_token.expand_as(logps)
    total = aggregate(per_token, mask, LOSS_TYPES[o.loss_type].normaliser, x)

    entropy_sum = entropy_tokens = 0.0
    if entropies is not None:
        effective = mask if entropy_mask is None else mask * entropy_mask
        bonus_tokens = effective.sum()
        if x.entropy_coef != 0.0:
            total = total - x.entropy_coef * (entropies * effective).sum() / bonus_tokens.clamp(min=1.0) / num_micro_batches
        entropy_sum, entropy_tokens = float((entropies.detach() * effective).sum()), float(bonus_tokens)

    with torch.no_grad():
        metrics = _metrics(o.loss_type, ratio, adv, mask, o.epsilon_low, o.epsilon_high, seq_mask, entropy_mask)
        metrics.update(term_metrics)
        kl = _masked_mean_any(per_token_kl.detach(), mask) if per_token_kl is not None else torch.zeros((), dtype=logps.dtype)
    return LossOut(total, kl, metrics, entropy_sum, entropy_tokens)


def _masked_mean_any(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's metric mean: over real tokens, or over sequences when x holds one value per sequence (B, 1)."""
    if x.shape[-1] == 1 and mask.shape[-1] != 1:
        return x.mean()
    return masked_mean(x, mask)


def _metrics(loss_type: str, ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, epsilon_low: float,
             epsilon_high: float, seq_mask: torch.Tensor | None, entropy_mask: torch.Tensor | None) -> dict[str, float]:
    out: dict[str, float] = {}
    info = LOSS_TYPES[loss_type]
    if info.clipped:
        low = ((ratio < 1 - epsilon_low) & (adv < 0)).to(mask.dtype)
        high = ((ratio > 1 + epsilon_high) & (adv > 0)).to(mask.dtype)
        out["clip_ratio/low_mean"] = float(_masked_mean_any(low, mask))
        out["clip_ratio/high_mean"] = float(_masked_mean_any(high, mask))
        out["clip_ratio/region_mean"] = float(_masked_mean_any(((low + high) > 0).to(mask.dtype), mask))
    elif info.weight_cap:  # TRL's name for the fraction of weights at the cap
        out["cispo_clip_ratio"] = float(_masked_mean_any(((ratio > epsilon_high) & (adv > 0)).to(mask.dtype), mask))
    if seq_mask is not None:  # fraction of sequences dropped as too far off-policy
        out["off_policy_mask/masked_ratio"] = float(1 - seq_mask.mean())
    if entropy_mask is not None:  # fraction of real tokens left out as low-entropy
        out["entropy_mask/masked_ratio"] = float(1 - entropy_mask.sum() / mask.sum().clamp(min=1))
    return out


@dataclass
class ISWeights:
    weights: torch.Tensor  # (B, L) or (B, 1): multiplies the per-token policy loss
    metrics: dict[str, float]


@torch.no_grad()
def importance_weights(train_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                       cap: float) -> ISWeights:
    """Truncated importance sampling between the trainer's and the sampler's policies (TIS; TRL's
    vllm_importance_sampling_*, verl's rollout correction).

    ratio = pi_train / pi_sample = exp(train_logps - sampling_logps) per token ('token_*'), or the product
    over a sequence's tokens ('sequence_*', exp of the summed difference). '*_truncate' clips the ratio at
    `cap`; '*_mask' sets ratios above `cap` to 0 (the token or the sequence drops out of the loss).
    Metrics (TRL's names): sampling/sampling_logp_difference/{mean,max} (|train - sample| over real tokens),
    sampling/importance_sampling_ratio/{min,mean,max}, and sampling/is_masked_fraction (our name).
    """
    m = mask.to(train_logps.dtype)
    diff = (train_logps - sampling_logps) * m
    level, _, how = mode.partition("_")
    if level == "sequence":
        log_ratio = diff.sum(-1, keepdim=True)
        valid = m.sum(-1, keepdim=True) > 0
    elif level == "token":
        log_ratio, valid = diff, m > 0
    else:
        raise ValueError(f"unknown importance sampling mode {mode!r}")
    ratio = torch.exp(log_ratio.clamp(max=80.0))
    if how == "truncate":
        weights, dropped = ratio.clamp(max=cap), torch.zeros_like(valid)
    elif how == "mask":
        dropped = ratio > cap
        weights = ratio.masked_fill(dropped, 0.0)
    else:
        raise ValueError(f"unknown importance sampling mode {mode!r}")
    r = ratio[valid.expand_as(ratio)]
    absdiff = diff.abs()[m > 0]
    metrics = {
        "sampling/sampling_logp_difference/mean": absdiff.mean().item() if absdiff.numel() else 0.0,
        "sampling/sampling_logp_difference/max": absdiff.max().item() if absdiff.numel() else 0.0,
        "sampling/importance_sampling_ratio/min": r.min().item() if r.numel() else 1.0,
        "sampling/importance_sampling_ratio/mean": r.mean().item() if r.numel() else 1.0,
        "sampling/importance_sampling_ratio/max": r.max().item() if r.numel() else 1.0,
        "sampling/is_masked_fraction": (dropped & valid).sum().item() / max(1, int(valid.sum())),
    }
    return ISWeights(weights, metrics)
