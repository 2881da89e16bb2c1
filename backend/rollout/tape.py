"""The rollout's linear-layer outputs, kept so the training pass skips its forward matrix products.

A sync rollout on the policy's own weights runs, token by token, the same forward the training pass then runs
over the same tokens: every linear layer's output for every prompt and completion token is computed twice. The
hf engine's lean passes can record them (`TapeRecorder`, handed to fast_decode as its `linear`); the trainer's
packed forward then replays them (`ReplayLinear`: the output is the recorded one, the backward is the linear's
own, dX = dY W and dW = dY^T X over the training pass's recomputed inputs). Everything between the linears
(norms, rotary embedding, attention, activations) is recomputed, so the autograd graph is the ordinary one; a
forward pass costs its elementwise work and attention, and a training step about a third fewer FLOPs.

Exact when the weights are unchanged since the rollout (`ActivationTape.valid_for` compares every parameter's
version counter, which any in-place update bumps) and the replayed rows are the completions the engine sampled
(`row_of`, by identity: a completion put back from an earlier step by success replay is not on the tape). The
recorded numbers come from the decode's matrix products, which differ from one packed product by float32
rounding only (tests/test_tape.py compares logits and gradients with the plain pass).

Layout of `outputs[module]`, one (rows, out_features) tensor per linear: first the prefill (prompt p's padded
column j at p * width + j; for the LM head, which the prefill runs on the last position only, row p), then
decode step t (fed completion token t) of batch row b at first + t * rows + b.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from backend.rollout.base import Completion


def parameter_versions(model: torch.nn.Module) -> tuple[int, ...]:
    """Every parameter's in-place version counter: an optimizer step (or a weight load) changes one."""
    return tuple(p._version for p in model.parameters())


def tape_bytes(model: torch.nn.Module, prompts: int, width: int, rows: int, steps: int) -> int:
    """Bytes a tape of this rollout takes: each layer linear's outputs for prompts x width prefill tokens and rows x
    steps decoded ones, the LM head's for prompts + rows x steps positions (float32)."""
    head = model.lm_head.out_features
    per_token = sum(m.out_features for layer in model.model.layers for m in layer.modules()
                    if isinstance(m, torch.nn.Linear))
    return 4 * ((prompts * width + rows * steps) * per_token + (prompts + rows * steps) * head)


def linear_into(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """out (R, N) = x (R, K) @ weight^T + bias, written in place, through F.linear's own products (addmm / mm), so
    the recorded numbers are the lean passes' own."""
    if bias is not None:
        torch.addmm(bias, x, weight.t(), out=out)
    else:
        torch.mm(x, weight.t(), out=out)


def linear_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, has_bias: bool,
                    needs: tuple[bool, ...]) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The gradients of y = x W^T + b for x, W and b (None where not needed): grad_x = dY W, grad_W = dY^T x,
    grad_b = the column sums of dY."""
    g = grad.reshape(-1, grad.shape[-1])
    gx = (g @ weight).view(*grad.shape[:-1], weight.shape[1]) if needs[0] else None
    gw = g.t() @ x.reshape(-1, x.shape[-1]) if needs[1] else None
    gb = g.sum(0) if has_bias and needs[2] else None
    return gx, gw, gb


class TapeRecorder:
    """A fast_decode `linear` that computes F.linear straight into its module's buffer, in call order: the
    prefill's, then one decode step's after another (the layout in the module docstring).

    prompts, width: the prefill batch; rows: decode rows; steps: decode steps at most."""

    def __init__(self, model: torch.nn.Module, prompts: int, width: int, rows: int, steps: int):
        self.model, self.prompts, self.width, self.rows, self.steps = model, prompts, width, rows, steps
        self.versions = parameter_versions(model)
        self.outputs: dict[torch.nn.Module, torch.Tensor] = {}
        self.filled: dict[torch.nn.Module, int] = {}

    def __call__(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        buf = self.outputs.get(module)
        if buf is None:  # the first call is the prefill's: its rows, then room for every decode step
            buf = x.new_empty((flat.shape[0] + self.rows * self.steps, module.out_features))
            self.outputs[module], self.filled[module] = buf, 0
        at = self.filled[module]
        out = buf[at:at + flat.shape[0]]
        linear_into(out, flat, module.weight, module.bias)  # the lean passes' own product, written in place
        self.filled[module] = at + flat.shape[0]
        return out.view(*x.shape[:-1], module.out_features)

    def finish(self, groups: list[list[Completion]]) -> ActivationTape:
        """The tape of the rollout that returned `groups` (prompt p's completion j is batch row p * n + j)."""
        n = len(groups[0]) if groups else 0
        row_of = {id(c): p * n + j for p, g in enumerate(groups) for j, c in enumerate(g)}
        return ActivationTape(weakref.ref(self.model), self.versions, self.outputs, self.prompts, self.width,
                              self.rows, n, row_of, [c for g in groups for c in g])


@dataclass
class ActivationTape:
    """One rollout's recorded linear outputs (module docstring), for `ReplayLinear`."""

    model: weakref.ReferenceType[torch.nn.Module]
    versions: tuple[int, ...]  # parameter versions when recorded
    outputs: dict[torch.nn.Module, torch.Tensor]
    prompts: int  # prefill rows (one per prompt)
    width: int  # prefill width (left padded)
    rows: int  # decode rows: prompts x n
    n: int  # completions per prompt
    row_of: dict[int, int]  # id(Completion) -> decode row
    completions: list[Completion] = field(repr=False)  # keeps the ids in row_of alive and unique

    def valid_for(self, model: torch.nn.Module) -> bool:
        """Whether `model` is the recorded one with the recorded weights (no update since)."""
        return self.model() is model and parameter_versions(model) == self.versions

    def row(self, completion: Completion) -> int:
        """The completion's decode row, -1 when it was not sampled in this rollout."""
        return self.row_of.get(id(completion), -1)


class ReplayLinear(torch.autograd.Function):
    """F.linear(x, weight, bias) whose forward returns the recorded output `y` (no matrix product) and whose
    backward is the linear's (`linear_backward`: grad_x = grad_y W, grad_W = grad_y^T x, grad_b = sum grad_y)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,  # noqa: ANN001
                y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        x, weight = ctx.saved_tensors
        return *linear_backward(grad, x, weight, ctx.has_bias, ctx.needs_input_grad[:3]), None


class TapeReplay:
    """A fast_decode `linear` for the training pass: each module's recorded outputs gathered at `index` (packed
    slots -> tape rows; `head_index` for the LM head), through ReplayLinear."""

    def __init__(self, tape: ActivationTape, index: torch.Tensor, head_index: torch.Tensor):
        self.tape, self.index, self.head_index = tape, index.reshape(-1), head_index.reshape(-1)
        self.head = tape.model().lm_head

    def __call__(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        idx = self.head_index if module is self.head else self.index
        y = self.tape.outputs[module].index_select(0, idx).view(*x.shape[:-1], -1)
        return ReplayLinear.apply(x, module.weight, module.bias, y)
