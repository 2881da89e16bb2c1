"""backend/sandbox.py against hostile code, each test asserting what really happened (per what this machine's
kernel allows: `sandbox_capabilities()`), and the `code` reward on open-r1-style rows (tests/data/code_reward/)."""

from __future__ import annotations

import dataclasses
import errno
import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from backend.project import PROJECT_ROOT
from backend.rewards.code import extract_code, same_output
from backend.rewards.registry import BUILTIN_REWARDS
from backend.sandbox import CLONE_NEWNS, SandboxLimits, _launch, _probe, python_tool, run_code, sandbox_capabilities

FAST = SandboxLimits(cpu_s=1, wall_s=3, memory_mb=256, max_output_bytes=64 << 10)
CAPS = sandbox_capabilities()
ROWS = [json.loads(line) for line in (Path(__file__).parent / "data" / "code_reward" / "rows.jsonl").read_text().splitlines()]


def processes_with(token: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(token in part for part in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def kill_leftovers(token: str) -> list[psutil.Process]:
    left = processes_with(token)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    return left


# ----------------------------------------------------------------------------- plain runs

def test_runs_in_a_fresh_temporary_directory_that_is_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_STUDIO_SECRET", "do-not-leak")
    src = ("import os, sys\nprint(os.getcwd()); print(os.environ.get('HOME')); print(sorted(os.environ))\n"
           "print(os.path.exists('backend/sandbox.py')); print(input())")
    r = run_code(src, limits=FAST, stdin="from stdin\n")
    assert r.ok, r.stderr
    cwd, home, env, sees_project, line = r.stdout.splitlines()
    assert cwd == home and Path(cwd).name.startswith("sandbox-")
    assert Path(cwd).resolve() != PROJECT_ROOT and sees_project == "False"
    assert not Path(cwd).exists()  # removed afterwards
    assert "GRPO_STUDIO_SECRET" not in env and "PYTHONPATH" not in env
    assert line == "from stdin"
    assert r.network_isolated == CAPS.network_isolated


def test_site_packages_are_not_on_the_path_but_the_standard_library_is() -> None:
    r = run_code("import json, re, collections, fractions\nimport pydantic\n", limits=FAST)
    assert r.exit_code == 1 and "ModuleNotFoundError" in r.stderr and "pydantic" in r.stderr


def test_only_python_is_supported() -> None:
    with pytest.raises(ValueError, match="python"):
        run_code("print(1)", language="bash")


# ----------------------------------------------------------------------------- hostile code

@pytest.mark.skipif(not CAPS.process_limit, reason="RLIMIT_NPROC does not bind here (the child runs as root): "
                                                  "a fork bomb would not be contained, so it is not run")
def test_fork_bomb_is_contained() -> None:
    token = f"bomb-{uuid.uuid4().hex}"
    src = f"import os\n# {token}\nprint(os.getcwd(), flush=True)\nwhile True:\n    os.fork()\n"
    before = len(psutil.pids())
    t0 = time.monotonic()
    r = run_code(src, limits=SandboxLimits(cpu_s=2, wall_s=4, max_processes=16))
    assert time.monotonic() - t0 < 6
    assert r.killed_reason in ("process limit", "wall timeout", "cpu time limit"), (r.killed_reason, r.stderr[-500:])
    assert "Resource temporarily unavailable" in r.stderr or r.timed_out
    main = r.stdout.split()[0] + "/main.py"
    time.sleep(0.2)
    assert not kill_leftovers(main), "fork bomb processes outlived the run"
    assert len(psutil.pids()) < before + 10  # the machine is back where it was
    assert subprocess.run(["true"], timeout=5).returncode == 0  # and can still start processes


def test_busy_loop_hits_the_cpu_limit() -> None:
    limits = SandboxLimits(cpu_s=1, wall_s=10)  # a wall clock well past the CPU limit, even on a busy machine
    r = run_code("while True: pass", limits=limits)
    assert r.killed_reason == "cpu time limit" and not r.timed_out
    assert r.exit_code is not None and r.exit_code < 0  # killed by SIGXCPU, or SIGKILL at the hard limit
    assert r.seconds < limits.wall_s


def test_allocating_10_gb_hits_the_memory_limit() -> None:
    r = run_code("x = bytearray(10 * 1024 ** 3)\nprint('allocated')", limits=FAST)
    assert r.killed_reason == "memory limit" and "MemoryError" in r.stderr
    assert "allocated" not in r.stdout and r.seconds < 2


def test_memory_grown_slowly_hits_the_limit_too() -> None:
    r = run_code("chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))", limits=FAST)
    assert r.killed_reason == "memory limit" and r.seconds < 2


def test_infinite_print_is_cut_at_the_output_cap_quickly() -> None:
    r = run_code("while True:\n    print('spam' * 100)", limits=FAST)
    assert r.killed_reason == "output cap" and not r.timed_out
    assert len(r.stdout.encode()) <= FAST.max_output_bytes
    assert r.seconds < 1.5


def test_infinite_stderr_is_capped_as_well() -> None:
    r = run_code("import sys\nwhile True:\n    sys.stderr.write('x' * 1000)", limits=FAST)
    assert r.killed_reason == "output cap" and len(r.stderr.encode()) <= FAST.max_output_bytes


def test_sleeping_forever_hits_the_wall_timeout() -> None:
    r = run_code("import time\ntime.sleep(10 ** 6)", limits=SandboxLimits(cpu_s=1, wall_s=1))
    assert r.timed_out and r.killed_reason == "wall timeout" and r.exit_code is None
    assert 1.0 <= r.seconds < 2.5


def test_closing_its_pipes_does_not_escape_the_wall_timeout() -> None:
    r = run_code("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(10 ** 6)", limits=SandboxLimits(cpu_s=1, wall_s=1))
    assert r.timed_out and r.killed_reason == "wall timeout" and r.seconds < 2.5


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="wall_s"):
        SandboxLimits(wall_s=0)


def test_a_huge_file_hits_the_file_size_limit() -> None:
    r = run_code("with open('big', 'wb') as f:\n    f.write(b'x' * (64 << 20))", limits=SandboxLimits(cpu_s=2, memory_mb=512, file_mb=1))
    assert r.exit_code != 0 and r.killed_reason in ("file size limit", "cpu time limit")


FILL = """
import errno, os
written = 0
try:
    for i in range(10_000):
        with open(f"f{{i}}", "wb") as f:
            f.write(b"x" * {chunk})
        written += {chunk}
except OSError as e:
    print(errno.errorcode[e.errno], written)
"""


@pytest.mark.skipif(not CAPS.disk_quota, reason="no mount namespace for a tmpfs work directory on this kernel")
def test_filling_the_disk_stops_at_the_quota() -> None:
    # files under RLIMIT_FSIZE each, many of them: only the work directory's own size stops them (ENOSPC)
    r = run_code(FILL.format(chunk=1 << 20), limits=SandboxLimits(cpu_s=5, wall_s=20, disk_mb=8))
    code, written = r.stdout.split()
    assert code == "ENOSPC" and int(written) <= 8 << 20, r.stdout + r.stderr
    assert r.exit_code == 0 and r.killed_reason is None  # the program saw the error and went on


@pytest.mark.skipif(not CAPS.disk_quota, reason="no mount namespace for a tmpfs work directory on this kernel")
def test_many_empty_files_stop_at_the_file_count() -> None:
    r = run_code(FILL.format(chunk=0), limits=SandboxLimits(cpu_s=5, wall_s=20, max_files=100))
    assert r.stdout.split()[0] == "ENOSPC", r.stdout + r.stderr  # inodes, not bytes, ran out


def test_a_child_that_outlives_its_parent_is_killed_with_the_group() -> None:
    token = f"orphan-{uuid.uuid4().hex}"
    src = ("import os, sys\nif os.fork() == 0:\n"
           f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{token}'])\n"
           "print('parent exits')\n")
    r = run_code(src, limits=FAST)
    assert r.ok and r.stdout.strip() == "parent exits"
    time.sleep(0.3)
    assert not kill_leftovers(token)


def test_a_child_that_leaves_the_group_with_setsid() -> None:
    token = f"escapee-{uuid.uuid4().hex}"
    src = ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n"
           f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{token}'])\n"
           "time.sleep(0.2)\nprint('parent exits')\n")
    r = run_code(src, limits=FAST)
    assert r.ok
    time.sleep(0.3)
    left = kill_leftovers(token)
    if CAPS.pid_namespace:
        assert not left, "the PID namespace's end should have killed it"
    else:  # documented: without a PID namespace a setsid() child escapes the group kill
        pytest.skip("no PID namespace on this kernel: a setsid() child outlives the run (killed by the test)")


@pytest.mark.parametrize("where", ["project", "tmp"])
def test_writing_outside_its_directory(where: str) -> None:
    name = f".sandbox-escape-{uuid.uuid4().hex}"
    target = PROJECT_ROOT / name if where == "project" else Path("/tmp") / name
    src = (f"import os\nprint(os.getcwd())\nopen('inside.txt', 'w').write('fine')\ntry:\n"
           f"    open({str(target)!r}, 'w').write('pwned')\n    print('wrote')\n"
           "except OSError as e:\n    print('refused', e.errno)\n")
    r = run_code(src, limits=FAST)
    try:
        assert r.ok, r.stderr
        cwd, outcome = r.stdout.splitlines()
        assert not Path(cwd).exists()  # its own directory (where it could write) is gone either way
        if CAPS.filesystem_readonly:
            assert outcome == f"refused {errno.EROFS}" and not target.exists()
        elif where == "project" and CAPS.writes_restricted:
            assert outcome == f"refused {errno.EACCES}" and not target.exists()
        else:  # documented limit: without a mount namespace it writes wherever its user may
            assert outcome == "wrote" and target.exists()
    finally:
        target.unlink(missing_ok=True)


def test_reading_etc_and_the_project() -> None:
    src = (f"print(open('/etc/passwd').read().split(':')[0])\nprint(len(open({str(PROJECT_ROOT / 'README.md')!r}).read()) > 0)\n"
           "try:\n    open('/root/.sandbox-probe-none', 'r')\nexcept OSError as e:\n    print(e.errno)\n")
    r = run_code(src, limits=FAST)
    assert r.ok, r.stderr
    first, project, root_err = r.stdout.splitlines()
    assert first == "root"  # /etc is never hidden (no mount namespace): documented in the module docstring
    assert project == "True"  # the project is readable by path (it is only not the cwd): documented
    if CAPS.reads_restricted:
        assert int(root_err) == errno.EACCES  # /root is not the child's to read
    else:
        assert int(root_err) == errno.ENOENT  # it reads as its user could (or with CAP_DAC_READ_SEARCH)


@pytest.mark.parametrize("address", [("127.0.0.1", 22), ("1.1.1.1", 80)])
def test_no_network(address: tuple[str, int]) -> None:
    if not CAPS.network_isolated:
        pytest.skip("network isolation is unavailable on this kernel: " + "; ".join(CAPS.notes))
    src = ("import socket\ns = socket.socket()\ns.settimeout(1)\ntry:\n"
           f"    s.connect({address!r})\n    print('connected')\nexcept OSError as e:\n    print('failed', e.errno)\n")
    r = run_code(src, limits=FAST)
    assert r.ok and r.network_isolated
    assert r.stdout.strip() == f"failed {errno.ENETUNREACH}"


def test_capabilities_say_what_is_missing() -> None:
    assert CAPS.network_isolated or any("network isolation is unavailable" in n for n in CAPS.notes)
    assert CAPS.pid_namespace or any("PID namespace" in n for n in CAPS.notes)
    assert CAPS.filesystem_readonly or any("read-only" in n for n in CAPS.notes)
    assert CAPS.disk_quota or any("no disk quota" in n for n in CAPS.notes)
    assert sandbox_capabilities() is not None and sandbox_capabilities() == CAPS  # probed once, cached


def test_without_namespaces_a_run_says_it_is_not_network_isolated() -> None:
    # the fallback a kernel without (unprivileged) namespaces gets: the run goes on, and says so
    plan = dataclasses.replace(_probe()[0], unshare=())
    r, report = _launch("import socket\nprint('ran')", FAST, "", plan)
    assert r.ok and r.stdout == "ran\n" and not r.network_isolated and not report["pid"] and not report["readonly"]


def test_without_a_mount_namespace_the_other_layers_still_hold() -> None:
    plan = _probe()[0]
    if not plan.unshare:
        pytest.skip("no namespaces on this kernel")
    plan = dataclasses.replace(plan, unshare=(plan.unshare[0] & ~CLONE_NEWNS,))
    r, report = _launch("open('here.txt', 'w').write('x')\nprint('ran')", FAST, "", plan)
    assert r.ok and r.stdout == "ran\n" and not report["readonly"] and not report.get("disk_quota")
    assert r.network_isolated == CAPS.network_isolated and report["pid"] == CAPS.pid_namespace


# ----------------------------------------------------------------------------- the python tool

def test_python_tool_returns_output_errors_and_kill_reasons() -> None:
    assert python_tool("print(6 * 7)") == "42\n"
    assert python_tool("x = 1") == "(no output)"
    failed = python_tool("1 / 0")
    assert "ZeroDivisionError" in failed and "[exit code 1]" in failed
    assert len(python_tool("while True: print('x' * 100)")) < 9000


def test_python_tool_schema_is_named_python() -> None:
    utils = pytest.importorskip("transformers.utils")
    schema = utils.get_json_schema(python_tool)
    assert schema["function"]["name"] == "python"
    assert schema["function"]["parameters"]["required"] == ["code"]


# ----------------------------------------------------------------------------- the code reward

def score(completions: list[Any], rows: list[dict[str, Any]], params: dict[str, Any] | None = None) -> list[Any]:
    fn = BUILTIN_REWARDS["code"].make({"timeout_s": 2.0, **(params or {})})
    return fn(completions=completions, prompts=["p"] * len(completions), verification_info=[r["verification_info"] for r in rows])


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\nDone."


SUM_WRONG = ("t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n"
             "    print(a + b if 0 <= a < 10 ** 6 else 0)")  # right on 3 of the 4 tests


def test_code_reward_is_registered_isolated_and_reads_verification_info() -> None:
    b = BUILTIN_REWARDS["code"]
    assert b.isolate and b.required_columns({}) == ("verification_info",)
    assert b.required_columns({"column": "tests"}) == ("tests",)
    assert b.check_params({"timeout_s": 0}) and b.check_params({"memory_mb": 10 ** 6})


def test_code_reward_scores_the_fraction_of_tests_passed() -> None:
    sums, words, empty = ROWS
    gold = [fenced(extract_code(r["gold_standard_solution"]) or "") for r in (sums, words)]
    got = score([*gold, fenced(SUM_WRONG), fenced("print(input())"), "no code here", fenced("print(42)")],
                [sums, words, sums, words, sums, empty])
    assert got == [1.0, 1.0, 0.75, 0.5, 0.0, None]


def test_binary_code_scores_all_or_nothing() -> None:
    sums, words, empty = ROWS
    gold = fenced(extract_code(sums["gold_standard_solution"]) or "")
    got = score([gold, fenced(SUM_WRONG), "no code here", fenced("print(42)")], [sums, sums, sums, empty],
                {"binary": True})
    assert got == [1.0, 0.0, 0.0, None]  # 3 of 4 tests is 0 here, as open-r1's binary_code_reward scores it


def test_code_format_is_open_r1s_pattern() -> None:
    fn = BUILTIN_REWARDS["code_format"].make({})
    good = "<think>\nplan\n</think>\n<answer>\nsee:\n```python\nprint(1)\n```\n</answer>"
    no_fence = "<think>\nplan\n</think>\n<answer>\nprint(1)\n</answer>"
    other_lang = good.replace("```python", "```cpp")
    no_newline = good.replace("<think>\n", "<think>")
    trailing_line = good + "\nmore"  # `$` matches at the answer's line end (MULTILINE), as in open-r1
    assert fn(completions=[good, no_fence, other_lang, no_newline, trailing_line]) == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert BUILTIN_REWARDS["code_format"].make({"language": "cpp"})(completions=[other_lang]) == [1.0]
    assert BUILTIN_REWARDS["code_format"].check_params({"language": "a b"})


def test_code_reward_reads_the_last_block_and_chat_messages() -> None:
    sums = ROWS[0]
    right = extract_code(sums["gold_standard_solution"]) or ""
    two_blocks = fenced("print('draft')") + "\n" + fenced(right)
    chat = [{"role": "assistant", "content": fenced(right)}]
    episode = [{"role": "assistant", "content": fenced("print(1)")}, {"role": "tool", "content": "1"},
               {"role": "assistant", "content": fenced(right)}]
    assert score([two_blocks, chat, episode], [sums] * 3) == [1.0, 1.0, 1.0]


def test_code_reward_hostile_and_partial_programs_score_zero() -> None:
    sums = ROWS[0]
    first_line_only = "t = int(input())\na, b = map(int, input().split())\nprint(a + b)"  # open-r1's zip would pass it
    t0 = time.monotonic()
    got = score([fenced("while True: pass"), fenced(first_line_only), fenced("import os\nos._exit(3)")],
                [sums] * 3, {"timeout_s": 1.0})
    assert got == [0.0, 0.5, 0.0]  # only the tests with one pair pass the partial program
    assert time.monotonic() - t0 < 10


def test_code_reward_takes_json_text_and_skips_other_languages() -> None:
    sums = ROWS[0]
    right = fenced(extract_code(sums["gold_standard_solution"]) or "")
    as_text = {"verification_info": json.dumps(sums["verification_info"])}
    cpp = {"verification_info": {"language": "cpp", "test_cases": sums["verification_info"]["test_cases"]}}
    assert score([right, right, right], [as_text, cpp, {"verification_info": None}]) == [1.0, None, None]


def test_same_output_is_stripped_line_by_line() -> None:
    assert same_output("3 \n7\n\n", "3\n7")
    assert not same_output("3", "3\n7")
    assert not same_output("3\n7\n8", "3\n7")
