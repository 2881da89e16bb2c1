"""The rewards check: `python -m backend.rewards check` and check_rewards() for the studio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.rewards.__main__ import main
from backend.rewards.check import check_rewards, format_table, run_check
from backend.spec import RewardFunction, load_spec

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "presets" / "tiny-cpu.yaml"
PLUGINS = Path(__file__).parent / "plugins"


def test_check_rewards_returns_per_function_data() -> None:
    spec = load_spec(TINY)
    rows = check_rewards(spec, rows=5, base_dir=ROOT)
    assert [r["function"] for r in rows] == ["exact_match", "digit_match", "(weighted sum)"]
    em = rows[0]
    assert em["source"] == "solution" and em["n"] == 5 and em["scored"] == 5
    assert em["mean"] == 1.0 and em["errors"] == 0 and em["error"] == "" and em["where"] == "trainer"
    assert rows[1]["mean"] == 1.0 and rows[2]["mean"] == 1.0  # digit_match is logged with weight 0 in the preset


def test_check_with_plugin_template_and_errors(tmp_path: Path) -> None:
    spec = load_spec(TINY)
    spec.rewards.functions = [*spec.rewards.functions, RewardFunction(name="format")]
    result = run_check(spec, rows=4, plugin=str(PLUGINS / "decorated_rewards.py"), base_dir=ROOT,
                       template="<think>ok</think><answer>{solution}</answer>")
    by_name = {r["function"]: r for r in result.functions}
    assert by_name["format"]["mean"] == 1.0 and by_name["exact_match"]["mean"] == 0.0
    assert by_name["short_answer"]["scored"] == 4 and by_name["has_digit"]["mean"] == 1.0  # added by --plugin
    assert all(r["errors"] == 0 for r in result.functions)
    assert len(result.samples) == 4 and set(result.samples[0]["rewards"]) >= {"format", "short_answer"}
    table = format_table(result.functions)
    assert "completions: solution" in table and "short_answer" in table


def test_check_cli_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", "--spec", str(TINY), "--rows", "3", "--base-dir", str(ROOT), "--plugin",
               str(PLUGINS / "compat_rewards.py"), "--show", "1"])
    out = capsys.readouterr().out
    # compat_rewards.py has no decorator: its public functions taking `completions` are all scored; two of
    # them need chat rows / completion ids that this dataset does not have, and fail
    assert rc == 1
    for name in ("exact_match", "matches_solution", "slow_judge", "maybe_none"):
        assert name in out
    assert "_helper" not in out
    assert "! reward 'think_answer_format' raised TypeError" in out and "! reward 'token_count' raised" in out


def test_check_cli_json_stays_clean(capfd: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", "--spec", str(TINY), "--rows", "2", "--base-dir", str(ROOT), "--json", "--plugin",
               str(PLUGINS / "compat_rewards.py")])
    out, err = capfd.readouterr()
    data = json.loads(out)  # the plugin's print went to stderr
    assert rc == 1 and "must not reach stdout" in err
    assert {f["function"] for f in data["functions"]} >= {"exact_match", "maybe_none", "(weighted sum)"}
    assert len(data["samples"]) == 2


def test_check_cli_subprocess() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "backend.rewards", "check", "--spec", str(TINY), "--rows", "4"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "completions: solution" in proc.stdout and "exact_match" in proc.stdout


def test_check_with_model_completions() -> None:
    result = run_check(load_spec(TINY), rows=4, completions=["solution", "model"], base_dir=ROOT)
    model = [r for r in result.functions if r["source"] == "model"]
    assert [r["function"] for r in model] == ["exact_match", "digit_match", "(weighted sum)"]
    assert all(r["scored"] == 4 and r["errors"] == 0 for r in model)
    samples = [s for s in result.samples if s["source"] == "model"]
    assert len(samples) == 4 and all(isinstance(s["completion"], str) for s in samples)


def test_check_cli_bad_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rewards:\n  functions:\n    - {name: repetition, params: {ngram_size: 0}}\n")
    assert main(["check", "--spec", str(bad), "--base-dir", str(ROOT)]) == 2
    assert "ngram_size" in capsys.readouterr().err


def test_check_plays_episodes_when_the_spec_has_an_environment(tmp_path: Path) -> None:
    """With tools or an environment, the model's completions are whole episodes, scored as the trainer scores them."""
    from tests.test_agent_trainer import TOOLS, tiny_chat_model

    model = tiny_chat_model(tmp_path / "tiny-chat")
    spec = load_spec(TINY, [f"model.name_or_path={model}", f"tools.files=[{TOOLS}]", "tools.environment=Countdown",
                            "rollout.max_turns=5", "rollout.max_completion_length=160",
                            "rewards.functions=[{name: exact_match}, {name: env_reward}]"])
    result = run_check(spec, rows=3, completions="model", base_dir=ROOT)
    model_rows = [s for s in result.samples if s["source"] == "model"]
    assert len(model_rows) == 3
    for s in model_rows:
        assert s["turns"] == 3 and [seg["role"] for seg in s["episode"]][:2] == ["assistant", "user"], s
        assert s["rewards"]["env_reward"] is not None and 0 <= s["rewards"]["env_reward"] <= 3
    env = next(f for f in result.functions if f["function"] == "env_reward" and f["source"] == "model")
    assert env["scored"] == 3 and env["errors"] == 0
