"""Agentic rollouts (backend/agent, docs/agent.md): tool-call parsing, the inserted tokens, the tool worker's
containment of failures, episodes over a scripted engine and over the real hf engine (its logprobs against the
training forward's on multi-turn episodes), and a short training run with tools and with a 3-turn environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.agent import EnvWorker, EpisodeRunner, TemplateError, choose_parser, inserted_ids
from backend.agent.episodes import episode_metrics, sample_fields, score_inputs
from backend.agent.parsers import parse_hermes, parse_llama3
from backend.models import load_tokenizer
from backend.rollout.base import Completion, PromptInput, RolloutEngine, SamplingParams
from backend.rollout.hf import HFEngine
from backend.train.grpo import selective_log_softmax

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "assets" / "tiny-add"
TOOLS = str(ROOT / "tests" / "data" / "agent" / "tools.py")

# ChatML-like, ending the assistant's turn with the EOS the tiny model stops on, then a newline the suffix must skip
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nT:{% for t in tools %}{{ t.function.name }} {% endfor %}<|im_end|>\n{% endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|endoftext|>\n"
    "{% elif m.role == 'tool' -%}<|im_start|>tool\n{{ m.content }}<|im_end|>\n"
    "{% else -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")


@pytest.fixture(scope="module")
def tok():
    t = load_tokenizer(TINY)
    t.chat_template = TEMPLATE
    return t


def _worker(functions=(), environment="", timeout_s=2.0) -> EnvWorker:
    w = EnvWorker([TOOLS], list(functions), environment, timeout_s, 200)
    w.start()
    return w


# ----------------------------------------------------------------------------- parsers

def test_hermes_parses_calls_and_reports_broken_ones() -> None:
    text = ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}</tool_call>'
            '<tool_call>{"name": "add", "arguments": {"a": 1,}</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "x", "arguments": {"a": 1}}')
    calls = parse_hermes(text)
    assert [(c.name, c.arguments, c.error is None) for c in calls[:2]] == [("add", {"a": 1, "b": 2}, True),
                                                                           ("add", {"a": 3, "b": 4}, True)]
    assert "not valid JSON" in calls[2].error
    assert "no \"name\"" in calls[3].error
    assert calls[4].name == "x" and "no closing" in calls[4].error
    assert parse_hermes("the answer is 3") == []


def test_llama3_parses_a_bare_json_turn() -> None:
    [c] = parse_llama3('<|python_tag|>{"name": "add", "parameters": {"a": 5, "b": 6}}<|eom_id|>')
    assert (c.name, c.arguments, c.error) == ("add", {"a": 5, "b": 6}, None)
    assert parse_llama3("It is 11.") == []
    assert [c.name for c in parse_llama3('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}')] == ["a", "b"]


def test_parser_chosen_from_the_chat_template() -> None:
    assert choose_parser("auto", "... <tool_call> ...") == "hermes"
    assert choose_parser("auto", "{{- '<|python_tag|>' }} ipython") == "llama3"
    assert choose_parser("llama3", "<tool_call>") == "llama3"


# ----------------------------------------------------------------------------- inserted tokens

def test_inserted_tokens_continue_the_conversation_exactly(tok) -> None:
    """prompt + the model's turn (ending in EOS) + inserted tokens == the template's rendering of the whole
    conversation, token for token: nothing is re-tokenized and the newline after EOS is not lost."""
    schemas = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    user = [{"role": "user", "content": "12+34="}]
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 12, "b": 34}}}
    turn = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 34}}</tool_call>'
    tool_msg = [{"role": "tool", "name": "add", "content": "46"}]
    prompt = tok.apply_chat_template(user, tools=schemas, add_generation_prompt=True, tokenize=False)
    ids = tok(prompt + turn, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids += inserted_ids(tok, tool_msg, tok.eos_token, schemas)
    whole = tok.apply_chat_template(user + [{"role": "assistant", "content": "", "tool_calls": [call]}] + tool_msg,
                                    tools=schemas, add_generation_prompt=True, tokenize=False)
    whole = whole.replace('{"arguments": {"a": 12, "b": 34}, "name": "add"}', '{"name": "add", "arguments": {"a": 12, "b": 34}}')
    assert ids == tok(whole, add_special_tokens=False)["input_ids"]
    with pytest.raises(TemplateError, match="does not end an assistant turn"):
        inserted_ids(tok, tool_msg, "<|nothing|>", schemas)


# ----------------------------------------------------------------------------- the tool worker

def test_tool_failures_are_contained_and_counted() -> None:
    w = _worker(["add", "explode", "hang", "swallow"], timeout_s=0.5)
    try:
        assert [s["function"]["name"] for s in w.schemas] == ["add", "explode", "hang", "swallow"]
        calls = [{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "explode", "arguments": {"x": 1}},
                 {"name": "hang", "arguments": {"x": 1}}, {"name": "swallow", "arguments": {"x": 1}},
                 {"name": "nope", "arguments": {}}, {"name": "add", "arguments": {"a": 1}},
                 {"name": "", "arguments": {}, "error": "the tool call is not valid JSON"}]
        [r] = w.step([(1, {"role": "assistant", "content": "", "tool_calls": calls})])
        contents = [m["content"] for m in r.messages]
        assert contents[0] == "5" and r.calls == 7 and len(r.errors) == 6 and not r.done
        assert "boom 1" in contents[1] and "timed out" in contents[2] and "timed out" in contents[3]
        assert "unknown tool 'nope'" in contents[4] and "bad arguments" in contents[5] and "not valid JSON" in contents[6]
        assert all(json.loads(c)["error"] for c in contents[1:])
        assert w.starts == 1  # the timeouts were the child's own: the worker lived
    finally:
        w.close()


def test_a_tool_that_kills_its_worker_is_an_error_and_the_next_call_works() -> None:
    w = _worker(["add", "die"])
    try:
        [r] = w.step([(1, {"role": "assistant", "content": "", "tool_calls": [{"name": "die", "arguments": {"x": 0}}]})])
        assert r.calls == 1 and "exited with code 3" in r.errors[0] and not r.lost
        [r] = w.step([(2, {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}]})])
        assert r.messages[0]["content"] == "2" and w.starts == 2
    finally:
        w.close()


def test_a_broken_tool_file_fails_at_start_with_the_reason(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x):\n    return x\n")
    w = EnvWorker([str(bad)], ["f"], "", 1.0, 100)
    with pytest.raises(Exception, match="tool 'f'.*type hints|tool 'f'.*docstring"):
        w.start()
    w = EnvWorker([str(bad)], ["g"], "", 1.0, 100)
    with pytest.raises(Exception, match="tool 'g' is not a built-in"):
        w.start()


def test_a_failing_environment_ends_its_episode_and_is_counted(tok) -> None:
    w = _worker(environment="Broken")
    try:
        runner = EpisodeRunner(tok, w, "hermes", max_turns=3, max_tokens=100)
        ids = tok("1+1=", add_special_tokens=False)["input_ids"]
        [[c]] = runner.run(Scripted(tok, ["2"]), [PromptInput(ids)], SamplingParams(n=1, max_tokens=100), [{}])
        assert c.episode.turns == 1 and c.episode.tool_errors == 1 and "env broke" in c.episode.segments[-1].error
        assert episode_metrics([c.episode])["episode/errors_mean"] == 1.0
    finally:
        w.close()


def test_a_first_observation_goes_into_the_prompt(tok) -> None:
    """reset(row) -> "hello <prompt>": the caller re-renders the prompt with it; step() ends with reward 0.5."""
    w = _worker(environment="Greeter")
    try:
        runner = EpisodeRunner(tok, w, "hermes", max_turns=3, max_tokens=100)
        seen = []

        def reprompt(k, text):
            seen.append((k, text))
            return PromptInput(tok(f"1+1= {text}", add_special_tokens=False)["input_ids"])

        [[a, b]] = runner.run(Scripted(tok, ["2", "3"]), [PromptInput(tok("1+1=")["input_ids"])],
                              SamplingParams(n=2, max_tokens=100), [{"prompt": "1+1="}], reprompt)
        assert seen == [(0, "hello 1+1=")]
        assert a.episode.env_reward == 0.5 and b.episode.env_reward == 0.5 and a.episode.turns == 1
    finally:
        w.close()


def test_environment_instances_are_per_episode() -> None:
    w = _worker(environment="Countdown")
    try:
        w.reset([(1, {}), (2, {})])
        msg = {"role": "assistant", "content": "x"}
        assert [r.messages[0]["content"] for r in w.step([(1, msg)])] == ["again 2"]
        [a, b] = w.step([(1, msg), (2, msg)])
        assert a.messages[0]["content"] == "again 1" and b.messages[0]["content"] == "again 2"
        [a] = w.step([(1, msg)])
        assert a.done and a.reward == 3.0
    finally:
        w.close()


# ----------------------------------------------------------------------------- episodes, scripted

class Scripted(RolloutEngine):
    """Answers each call from a script of texts (one per completion, in order), with EOS and logprob -1."""

    def __init__(self, tok, script: list[str], length: set[int] = frozenset()):
        self.tok, self.script, self.length, self.calls = tok, list(script), length, []

    def generate(self, prompts, sampling):
        self.calls.append((len(prompts), sampling.n, sampling.max_tokens))
        out = []
        for _ in prompts:
            group = []
            for _j in range(sampling.n):
                text = self.script.pop(0)
                ids = self.tok(text, add_special_tokens=False)["input_ids"]
                finish = "stop"
                if len(ids) + 1 > sampling.max_tokens:
                    ids, finish = ids[:sampling.max_tokens], "length"
                else:
                    ids = ids + [self.tok.eos_token_id]
                group.append(Completion(ids, text, finish, [-1.0] * len(ids)))
            out.append(group)
        return out


def _call(a: int, b: int) -> str:
    return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def test_an_episode_masks_the_tool_result_and_records_the_turns(tok) -> None:
    w = _worker(["add"])
    try:
        runner = EpisodeRunner(tok, w, "hermes", max_turns=3, max_tokens=200)
        prompt = tok.apply_chat_template([{"role": "user", "content": "12+34="}], tools=w.schemas,
                                         add_generation_prompt=True, tokenize=False)
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        eng = Scripted(tok, [_call(12, 34), "43", "46"])  # episode 0 calls the tool, episode 1 answers at once
        [[a, b]] = runner.run(eng, [PromptInput(ids)], SamplingParams(n=2, max_tokens=200, seed=3))
        assert eng.calls[0] == (1, 2, 200) and eng.calls[1][:2] == (1, 1)  # one shared first call, then per episode
        ep = a.episode
        assert [s.role for s in ep.segments] == ["assistant", "tool", "assistant"]
        assert ep.segments[1].text == "46" and ep.final_text == "46" and ep.tool_calls == 1 and ep.turns == 2
        first = len(tok(_call(12, 34), add_special_tokens=False)["input_ids"]) + 1
        inserted = ep.segments[1].tokens
        assert a.model_mask == [1] * first + [0] * inserted + [1] * (len(a.token_ids) - first - inserted)
        assert a.logprobs[first:first + inserted] == [0.0] * inserted
        # the training sequence is prompt + these tokens: the template's rendering of the conversation
        assert tok.decode(ids + a.token_ids).endswith("<|im_start|>tool\n46<|im_end|>\n<|im_start|>assistant\n46<|endoftext|>")
        assert b.model_mask is not None and set(b.model_mask) == {1} and b.episode.turns == 1
        texts, rows, chats = score_inputs([a, b], [{"solution": "46"}] * 2)
        assert texts == ["46", "43"] and rows[0]["tool_calls"][0]["function"]["arguments"] == {"a": 12, "b": 34}
        assert [m["role"] for m in chats[0]] == ["assistant", "tool", "assistant"]
        m = episode_metrics([a.episode, b.episode])
        assert m["tools/call_frequency"] == 0.5 and m["tools/failure_frequency"] == 0 and m["episode/turns_mean"] == 1.5
        row = sample_fields(a.episode)
        assert row["episode"][1] == {"role": "tool", "text": "46", "tokens": inserted, "masked": True,
                                     "name": "add", "error": None}
    finally:
        w.close()


def test_episodes_are_cut_at_the_turn_and_length_limits(tok) -> None:
    w = _worker(["add"])
    try:
        ids = tok("1+1=", add_special_tokens=False)["input_ids"]
        runner = EpisodeRunner(tok, w, "hermes", max_turns=2, max_tokens=400)
        [[c]] = runner.run(Scripted(tok, [_call(1, 1), _call(2, 2)]), [PromptInput(ids)], SamplingParams(n=1, max_tokens=400))
        assert c.episode.cut and c.episode.turns == 2 and c.episode.tool_calls == 1  # no third turn to read the result
        short = EpisodeRunner(tok, w, "hermes", max_turns=5, max_tokens=len(tok(_call(1, 1))["input_ids"]) + 4)
        [[c]] = short.run(Scripted(tok, [_call(1, 1)]), [PromptInput(ids)], SamplingParams(n=1, max_tokens=short.max_tokens))
        assert c.episode.cut and len(c.token_ids) <= short.max_tokens and set(c.model_mask) == {1}
        assert episode_metrics([c.episode])["episode/cut_frequency"] == 1.0
        # the model's context window bounds prompt + completion too (vLLM refuses a longer input)
        narrow = EpisodeRunner(tok, w, "hermes", max_turns=5, max_tokens=400, context=len(ids) + 70)
        [[c]] = narrow.run(Scripted(tok, [_call(1, 1), "2"]), [PromptInput(ids)], SamplingParams(n=1, max_tokens=400))
        assert c.episode.cut and len(c.token_ids) <= 70 and c.episode.turns == 1  # the result would not fit
    finally:
        w.close()


# ----------------------------------------------------------------------------- episodes, the real hf engine

def test_engine_logprobs_match_the_training_forward_on_multi_turn_episodes(tok) -> None:
    """A 3-turn environment over the real hf engine: on the model's tokens, the engine's sampling logprobs equal
    the forward pass's over the exact sequence (prompt + completion); inserted tokens are masked."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    w = _worker(environment="Countdown")
    try:
        runner = EpisodeRunner(tok, w, "hermes", max_turns=5, max_tokens=200)
        texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
                 for q in ("12+34=", "51+7=")]
        prompts = [PromptInput(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        groups = runner.run(HFEngine(model, tok), prompts, SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=5))
        multi, worst = 0, 0.0
        for p, group in zip(prompts, groups):
            for c in group:
                assert len(c.model_mask) == len(c.token_ids) == len(c.logprobs)
                full = torch.tensor([p.token_ids + c.token_ids])
                with torch.no_grad():
                    logits = model(input_ids=full).logits[0, len(p.token_ids) - 1:-1]
                ref = selective_log_softmax(logits, full[0, len(p.token_ids):])
                mask = torch.tensor(c.model_mask, dtype=torch.bool)
                diff = (torch.tensor(c.logprobs)[mask] - ref[mask]).abs().max().item()
                worst = max(worst, diff)
                assert diff < 1e-3, diff
                assert (torch.tensor(c.logprobs)[~mask] == 0).all()
                multi += c.episode.turns >= 3 and (~mask).any().item()
        print("max |engine - forward| logprob:", worst)
        assert multi >= 1  # at least one episode went 3 turns with inserted tokens between them
    finally:
        w.close()
