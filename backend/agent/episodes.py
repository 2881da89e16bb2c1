"""Multi-turn episodes over any rollout engine: the model writes, the tools or the environment answer, repeat.

    runner = EpisodeRunner(tokenizer, worker, parser="hermes", max_turns=5, max_tokens=256)
    groups = runner.run(engine, prompts, sampling)     # list[list[Completion]], as engine.generate returns

The first turn is one `engine.generate` call with n = G, so a group still shares its prompt's prefill; later turns
continue each episode from its own tokens (n = 1, a seed per episode and turn, so results do not depend on how
episodes are batched). Any engine works, in process or in workers, because an engine takes token ids: the
episode's sequence is the prompt's tokens, then the model's tokens as the engine sampled them, then the inserted
tokens of each answer, tokenized on their own (`inserted_ids`) and appended. The conversation is never
re-tokenized, so the training forward sees exactly the tokens the engine produced, and `Completion.model_mask`
says which are the model's (docs/agent.md).

An episode ends when the model answers without a tool call (tools), the environment says done, its turn ended by
length, `max_turns` turns were written (cut), or the next answer would not fit in `max_tokens` (cut, the answer
dropped, as TRL drops it).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from backend.agent.parsers import PARSERS, ToolCall
from backend.agent.worker import EnvWorker, StepResult
from backend.rollout.base import Completion, PromptInput, RawMedia, RolloutEngine, SamplingParams, derive_seed


@dataclass
class Segment:
    """A stretch of an episode's completion: one assistant turn, or one inserted answer (tool or observation)."""

    role: str  # "assistant", "tool", or "user" (an environment's observation)
    text: str
    tokens: int
    masked: bool  # inserted: not the model's tokens, not trained
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    name: str | None = None
    error: str | None = None

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "text": self.text, "tokens": self.tokens, "masked": self.masked}
        if self.role == "assistant" and self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.role == "tool":
            out["name"], out["error"] = self.name, self.error
        elif self.error:
            out["error"] = self.error
        return out


@dataclass
class Episode:
    segments: list[Segment] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the episode as chat messages (TRL's completions)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    cut: bool = False
    env_reward: float | None = None
    tool_seconds: float = 0.0

    @property
    def final_text(self) -> str:
        """The last assistant turn's text: what built-in rewards score."""
        return next((s.text for s in reversed(self.segments) if s.role == "assistant"), "")

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [c for m in self.messages if m["role"] == "assistant" for c in m.get("tool_calls", [])]


@dataclass
class _Live:
    """An episode being played: where it is in the batch and what it has produced so far."""

    index: int  # episode number in the batch (group-major): its seeds
    prompt: PromptInput
    eid: int = 0  # its id in the worker (unique across batches: an environment instance is the episode's own)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    finish: str = "stop"
    episode: Episode = field(default_factory=Episode)
    calls: list[ToolCall] = field(default_factory=list)  # the last turn's tool calls


class EnvironmentFailed(RuntimeError):
    """The environment cannot start an episode (reset() raised, or disagrees within a group)."""


class TemplateError(ValueError):
    """The model's chat template cannot render what the episode inserts."""


def inserted_ids(tokenizer: Any, messages: list[dict[str, Any]], end_token: str, tools: list[dict[str, Any]] | None,
                 template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """The tokens the chat template puts after an assistant turn that ended with `end_token` for `messages`
    (tool results or an observation), up to and including the next assistant header: the rendering of a dummy
    conversation with and without them, the difference after the dummy turn's last `end_token` (TRL's
    `_get_tool_suffix_ids`). Tokenized on their own: the model's tokens before them stay as sampled."""
    kw = dict(template_kwargs or {})
    if tools:
        kw["tools"] = tools
    calls = [{"type": "function", "function": {"name": m.get("name") or "tool", "arguments": {}}}
             for m in messages if m["role"] == "tool"]
    dummy: list[dict[str, Any]] = [{"role": "user", "content": "dummy"},
                                   {"role": "assistant", "content": "", **({"tool_calls": calls} if calls else {})}]
    try:
        before = tokenizer.apply_chat_template(dummy, tokenize=False, add_generation_prompt=False, **kw)
        after = tokenizer.apply_chat_template(dummy + messages, tokenize=False, add_generation_prompt=True, **kw)
    except Exception as err:  # jinja's TemplateError, a template that raises on a role it does not know
        raise TemplateError(f"the chat template cannot render {[m['role'] for m in messages]} messages: {err}") from err
    cut = before.rfind(end_token) if end_token else -1
    if cut < 0:
        raise TemplateError(f"the chat template does not end an assistant turn with the token the model stops on "
                            f"({end_token!r}); set data.chat_template or use a model whose template does")
    before = before[:cut + len(end_token)]
    if not after.startswith(before):
        raise TemplateError("the chat template renders the earlier conversation differently once more messages "
                            "follow, so inserted tokens cannot be appended")
    return tokenizer(after[len(before):], add_special_tokens=False)["input_ids"]


class EpisodeRunner:
    def __init__(self, tokenizer: Any, worker: EnvWorker, parser: str, max_turns: int, max_tokens: int,
                 template_kwargs: dict[str, Any] | None = None, context: int | None = None):
        self.tok, self.worker, self.parse = tokenizer, worker, PARSERS[parser]
        self.max_turns, self.max_tokens = max_turns, max_tokens
        self.context = context  # the model's context window (prompt + completion): vLLM refuses a longer input
        self.template_kwargs = template_kwargs or {}
        self._ids = itertools.count(1)
        self._ids_lock = threading.Lock()

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return self.worker.schemas or None

    def run(self, engine: RolloutEngine, prompts: list[PromptInput], sampling: SamplingParams,
            rows: list[dict[str, Any]] | None = None,
            reprompt: Callable[[int, str], PromptInput] | None = None) -> list[list[Completion]]:
        """Each prompt's `sampling.n` episodes, as completions with `model_mask` and `episode` set. With an
        environment, each episode's instance is reset with its prompt's row (`rows`), and a first observation is
        put into the prompt by `reprompt(prompt index, text)` (appended to the user's message)."""
        G = sampling.n
        with self._ids_lock:
            eids = [next(self._ids) for _ in range(len(prompts) * G)]
        live = [_Live(k * G + j, p, eids[k * G + j]) for k, p in enumerate(prompts) for j in range(G)]
        if self.worker.stateful:
            prompts = self._reset(live, prompts, rows or [{} for _ in prompts], G, reprompt)
            for e in live:
                e.prompt = prompts[e.index // G]
        first_room = max(self._room(e) for e in live)
        first = engine.generate(prompts, replace(sampling, max_tokens=max(1, min(sampling.max_tokens, first_room))))
        self._append_turns(live, [c for g in first for c in g])
        active = live
        turn_seed = sampling.seed
        for turn in range(1, self.max_turns + 1):
            active = self._answer(active, turn)
            if not active:
                break
            room = max(self._room(e) for e in active)
            step = replace(sampling, n=1, max_tokens=max(room, 1), seed=None)
            inputs = [self._continuation(e, turn_seed, turn) for e in active]
            self._append_turns(active, [g[0] for g in engine.generate(inputs, step)])
        if self.worker.stateful:
            self.worker.end([e.eid for e in live])
        return [[self._completion(e) for e in live[k * G:(k + 1) * G]] for k in range(len(prompts))]

    def _reset(self, live: list[_Live], prompts: list[PromptInput], rows: list[dict[str, Any]], G: int,
               reprompt: Callable[[int, str], PromptInput] | None) -> list[PromptInput]:
        results = self.worker.reset([(e.eid, rows[e.index // G]) for e in live])
        out = list(prompts)
        for k in range(len(prompts)):
            texts = {"\n".join(m["content"] for m in r.messages) for r in results[k * G:(k + 1) * G]}
            errors = [err for r in results[k * G:(k + 1) * G] for err in r.errors]
            if errors:
                raise EnvironmentFailed(f"the environment's reset() failed: {errors[0]}")
            if len(texts) > 1:
                raise EnvironmentFailed("the environment's reset() gave different first observations to one prompt's "
                                        "episodes: GRPO compares the answers to one prompt, so reset(row) must depend "
                                        "on the row only")
            text = texts.pop()
            if text:
                if reprompt is None:
                    raise EnvironmentFailed("the environment's reset() gave a first observation, and this caller "
                                            "cannot put it into the prompt")
                out[k] = reprompt(k, text)
        return out

    # ------------------------------------------------------------------------- one round

    def _append_turns(self, episodes: list[_Live], turns: list[Completion]) -> None:
        for e, c in zip(episodes, turns):
            ids, lps = list(c.token_ids), c.logprobs
            room = self._room(e)
            finish = c.finish_reason
            if len(ids) > room:  # a later turn, sampled to the longest episode's room: cut to this one's
                ids, lps, finish = ids[:room], None if lps is None else lps[:room], "length"
            e.ids += ids
            e.mask += [1] * len(ids)
            e.logprobs = None if e.logprobs is None or lps is None else e.logprobs + list(lps)
            e.finish = finish
            text = self.tok.decode(ids, skip_special_tokens=True)
            calls = self.parse(text) if finish == "stop" else []
            e.episode.turns += 1
            e.episode.segments.append(Segment("assistant", text, len(ids), False, [_call_row(x) for x in calls]))
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                msg["tool_calls"] = [x.as_message_call() for x in calls]
            e.episode.messages.append(msg)
            e.calls = calls

    def _room(self, e: _Live) -> int:
        """How many more tokens the episode may take: the completion budget, and the model's context."""
        room = self.max_tokens - len(e.ids)
        if self.context is not None:
            room = min(room, self.context - len(e.prompt.token_ids) - len(e.ids))
        return room

    def _answer(self, episodes: list[_Live], turn: int) -> list[_Live]:
        """Run the tools / environment for the episodes whose last turn asks for it; the ones that go on."""
        want = []
        for e in episodes:
            if e.finish != "stop":
                continue  # cut by length inside the model's turn: nothing to answer
            if not self.worker.stateful and not e.calls:
                continue  # the model answered: the episode is over
            if not self.worker.stateful and turn >= self.max_turns:
                e.episode.cut = True  # it still wants a tool, but has no turn left to read the answer
                continue
            want.append(e)
        if not want:
            return []
        t0 = time.perf_counter()
        results = self.worker.step([(e.eid, self._step_arg(e)) for e in want])
        seconds = time.perf_counter() - t0
        going = []
        for e, r in zip(want, results):
            e.episode.tool_seconds += seconds / len(want)
            self._record(e, r)
            if r.done or r.lost or not r.messages:
                continue
            if turn >= self.max_turns:
                e.episode.cut = True  # the model still had something to say: cut at the turn limit
                continue
            if not self._insert(e, r):
                continue
            going.append(e)
        return going

    def _step_arg(self, e: _Live) -> dict[str, Any]:
        msg = dict(e.episode.messages[-1])
        msg["tool_calls"] = [{"name": c.name, "arguments": c.arguments, "error": c.error} for c in e.calls]
        return msg

    def _record(self, e: _Live, r: StepResult) -> None:
        ep = e.episode
        ep.tool_calls += r.calls
        ep.tool_errors += len(r.errors) if r.calls else 0
        if r.reward is not None:
            ep.env_reward = (ep.env_reward or 0.0) + r.reward
        if not r.calls and r.errors:  # an environment that failed: shown on the episode, counted as an error
            ep.tool_errors += len(r.errors)
            ep.segments.append(Segment("user", "", 0, True, error="; ".join(r.errors)))

    def _insert(self, e: _Live, r: StepResult) -> bool:
        """Append the answer's tokens (masked) when they fit, with room for a token of the model's after them."""
        end = self.tok.convert_ids_to_tokens(e.ids[-1]) if e.ids else ""
        ids = inserted_ids(self.tok, r.messages, end, self.tools, self.template_kwargs)
        too_long = self.context is not None and len(e.prompt.token_ids) + len(e.ids) + len(ids) >= self.context
        if len(e.ids) + len(ids) >= self.max_tokens or too_long:
            e.episode.cut = True
            return False
        for m in r.messages:
            err = m.pop("error", None)  # the worker marks a failed call's message; the chat message has no such key
            e.episode.segments.append(Segment(m["role"], m["content"], 0, True, name=m.get("name"), error=err))
            e.episode.messages.append(dict(m))
        e.episode.segments[-1].tokens = len(ids)  # one tokenization for the whole answer: its tokens go on the last
        e.ids += ids
        e.mask += [0] * len(ids)
        if e.logprobs is not None:
            e.logprobs += [0.0] * len(ids)
        return True

    def _continuation(self, e: _Live, seed: int | None, turn: int) -> PromptInput:
        p = e.prompt
        raw = None if p.raw_media is None else RawMedia(p.raw_media.prompt_ids + e.ids, p.raw_media.images)
        return PromptInput(p.token_ids + e.ids, p.multi_modal, None if seed is None else derive_seed(seed, e.index, turn),
                           raw)

    def _completion(self, e: _Live) -> Completion:
        return Completion(e.ids, self.tok.decode(e.ids, skip_special_tokens=True), e.finish,  # type: ignore[arg-type]
                          e.logprobs, model_mask=e.mask, episode=e.episode)


def _call_row(c: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = {"name": c.name, "arguments": c.arguments}
    if c.error:
        out["error"] = c.error
    return out


def score_inputs(completions: list[Completion], rows: list[dict[str, Any]]
                 ) -> tuple[list[str], list[dict[str, Any]], list[list[dict[str, Any]]] | None]:
    """What the reward functions get of each completion (docs/agent.md): the text built-ins score (an episode's
    final answer), the per-completion rows with the columns `tool_calls` and `env_reward` added, and the
    episodes as chat messages for plugins (None when no completion is an episode)."""
    if not any(c.episode is not None for c in completions):
        return [c.text for c in completions], rows, None
    texts, out_rows, chats = [], [], []
    for c, row in zip(completions, rows):
        ep: Episode | None = c.episode
        if ep is None:
            texts.append(c.text)
            out_rows.append(row)
            chats.append([{"role": "assistant", "content": c.text}])
            continue
        texts.append(ep.final_text)
        out_rows.append({**row, "tool_calls": ep.calls, "env_reward": ep.env_reward})
        chats.append([dict(m) for m in ep.messages])
    return texts, out_rows, chats


def episode_metrics(episodes: list[Episode | None]) -> dict[str, float]:
    """The rollout's tool and episode metrics (docs/agent.md; TRL's names where TRL has them)."""
    eps = [e for e in episodes if e is not None]
    if not eps:
        return {}
    n = len(eps)
    calls = sum(e.tool_calls for e in eps)
    return {
        "tools/call_frequency": calls / n,
        "tools/failure_frequency": sum(e.tool_errors for e in eps) / calls if calls else 0.0,
        "episode/turns_mean": sum(e.turns for e in eps) / n,
        "episode/cut_frequency": sum(e.cut for e in eps) / n,
        "episode/errors_mean": sum(e.tool_errors for e in eps) / n,  # tool and environment failures per episode
        "episode/model_tokens_mean": sum(s.tokens for e in eps for s in e.segments if not s.masked) / n,
    }


def sample_fields(episode: Episode | None) -> dict[str, Any]:
    """The keys an episode adds to its samples.jsonl row."""
    if episode is None:
        return {}
    return {"episode": [s.row() for s in episode.segments], "turns": episode.turns, "tool_calls": episode.tool_calls,
            "tool_errors": episode.tool_errors, "cut": episode.cut}
