"""The studio's agentic side in headless Chromium: a fabricated multi-turn run's samples turn by turn (masked
segments marked, in English and Chinese, no HTML from the model rendered), its Tools chart, and the Build
form's Tools & environment section with its tool file editor.

A studio of its own (a temporary workspace and runs folder), so saving a tool file writes nowhere in the
project. Same requirements and offline rule as tests/test_browser_studio.py; screenshots go to test-artifacts/.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} not found (apt-get install chromium)", allow_module_level=True)
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:
    pytest.skip("playwright is not installed (pip install playwright==1.65.2)", allow_module_level=True)

from tests.test_app_agent import make_agent_run  # noqa: E402
from tests.test_browser_studio import ARGS, free_port, new_page  # noqa: E402

RUN_ID = "20260301-000000-agent-0001"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    ARTIFACTS.mkdir(exist_ok=True)
    ws = tmp_path_factory.mktemp("agent-ws")
    runs = ws / "runs"
    runs.mkdir()
    make_agent_run(runs, RUN_ID)
    real = _real_tool_run(runs)
    port = free_port()
    log = (ARTIFACTS / "studio-agent.log").open("a")
    proc = subprocess.Popen([sys.executable, "launch.py", "--port", str(port), "--runs-dir", str(runs),
                             "--workspace", str(ws), "--presets-dir", str(ROOT / "presets")], cwd=ROOT,
                            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"},
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 90
    while True:
        if proc.poll() is not None:
            pytest.fail(f"studio exited: {(ARTIFACTS / 'studio-agent.log').read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                proc.kill()
                pytest.fail("studio did not start in 90 s")
            time.sleep(0.5)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            yield {"url": url, "browser": browser, "ws": ws, "real": real}
            browser.close()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _real_tool_run(runs: Path) -> str:
    """A real agentic run: the tiny tool-use preset trained for 3 steps by the trainer (not written by hand)."""
    from backend.rundir import create_run
    from backend.spec import load_spec
    from backend.train.loop import GRPOTrainer

    spec = load_spec(ROOT / "presets" / "tiny-tools-cpu.yaml", [f"output.runs_dir={runs}", "algorithm.max_steps=3",
                                                               "output.eval_steps=0", "output.save_steps=0"])
    run = create_run(spec, ROOT)
    GRPOTrainer(spec, run, ROOT).setup().train()
    return run.path.name


def test_runs_page_shows_a_real_tool_run_turn_by_turn(env):
    """The trainer's own samples of the tiny tool-use run: an episode with a tool call, its result (masked) and
    the answer, as the trainer wrote them."""
    page = new_page(env["browser"], env["url"] + f"runs?run={env['real']}", "#runs-table")
    expect(page.locator("#run-select input")).to_have_value(env["real"], timeout=30_000)
    view = page.locator("#samples-view")
    expect(view.locator(".gs-episode").first).to_be_visible(timeout=30_000)
    tool_eps = view.locator(".gs-episode", has=page.locator(".gs-seg[data-role='tool']"))
    expect(tool_eps.first).to_be_visible(timeout=30_000)
    segs = tool_eps.first.locator(".gs-seg")
    roles = [segs.nth(i).get_attribute("data-role") for i in range(segs.count())]
    assert roles[:3] == ["assistant", "tool", "assistant"], roles
    expect(segs.nth(0).locator(".gs-call-name")).to_have_text("add")
    expect(segs.nth(1).locator(".gs-not-trained")).to_have_count(1)
    expect(segs.nth(0).locator(".gs-not-trained")).to_have_count(0)
    page.wait_for_function("document.querySelectorAll('#chart-tools .scatterlayer .trace').length >= 1")
    tool_eps.first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "24-agent-real-run.png"), full_page=True)
    page.close()


def test_runs_page_shows_a_multi_turn_sample_turn_by_turn(env):
    page = new_page(env["browser"], env["url"] + f"runs?run={RUN_ID}", "#runs-table")
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))  # an injected alert() would land here
    expect(page.locator("#run-select input")).to_have_value(RUN_ID, timeout=30_000)
    view = page.locator("#samples-view")
    episode = view.locator(".gs-episode").first
    expect(episode).to_be_visible(timeout=30_000)
    segs = episode.locator(".gs-seg")
    expect(segs).to_have_count(4)
    assert [segs.nth(i).get_attribute("data-role") for i in range(4)] == ["assistant", "tool", "user", "assistant"]
    expect(segs.nth(0).locator(".gs-role")).to_have_text("assistant")
    expect(segs.nth(0).locator(".gs-call-name")).to_have_text("add")
    expect(segs.nth(0).locator(".gs-call-args")).to_have_text('{"a": 1, "b": 2}')
    expect(segs.nth(1).locator(".gs-role")).to_have_text("tool")
    expect(segs.nth(2).locator(".gs-role")).to_have_text("environment")
    # the inserted segments are marked and look different; the model's own are not
    for i, masked in enumerate([False, True, True, False]):
        expect(segs.nth(i).locator(".gs-not-trained")).to_have_count(1 if masked else 0)
    expect(segs.nth(1).locator(".gs-not-trained")).to_have_text("not trained")
    bg = [segs.nth(i).evaluate("e => getComputedStyle(e).backgroundImage") for i in (0, 1)]
    assert bg[0] == "none" and "gradient" in bg[1]
    head = view.locator(".gs-ep-head").first
    expect(head).to_contain_text("turns 2")
    expect(head).to_contain_text("tool calls 1")
    # the failed call's error is highlighted
    expect(view.locator(".gs-seg-error .gs-tool-error").first).to_contain_text("missing 1 required positional")
    expect(view.locator(".gs-ep-cut").first).to_be_visible()
    # the model's HTML is text, never markup
    expect(view.locator(".gs-seg-text", has_text="<script>alert(1)</script>").first).to_be_visible()
    assert view.locator("script").count() == 0 and view.locator("img[onerror]").count() == 0
    # the Tools chart is shown for this run
    page.wait_for_function("document.querySelectorAll('#chart-tools .scatterlayer .trace').length >= 4")
    expect(page.locator("#chart-tools")).to_contain_text("tool calls / episode")
    episode.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "20-agent-episode.png"), full_page=True)

    page.locator("#lang-switch label", has_text="中文").click()
    expect(view.locator(".gs-not-trained").first).to_have_text("未训练", timeout=30_000)
    segs = view.locator(".gs-episode").first.locator(".gs-seg")
    expect(segs.nth(0).locator(".gs-role")).to_have_text("助手")
    expect(segs.nth(1).locator(".gs-role")).to_have_text("工具")
    expect(segs.nth(2).locator(".gs-role")).to_have_text("环境观察")
    expect(view.locator(".gs-ep-head").first).to_contain_text("轮数 2")
    expect(page.locator("#chart-tools")).to_contain_text("每回合工具调用数", timeout=30_000)
    view.locator(".gs-episode").first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "21-agent-episode-zh.png"), full_page=True)
    assert not dialogs
    page.close()


def test_build_form_has_the_tools_section_and_saves_a_tool(env):
    page = new_page(env["browser"], env["url"])
    sec = page.locator("#sec-tools")
    expect(sec).to_contain_text("Tools & environment")
    for path in ("tools-functions", "tools-files", "tools-environment", "rollout-max_turns"):
        expect(sec.locator(f"#field-{path}")).to_be_visible()
    expect(page.locator("#sec-rollout #field-rollout-max_turns")).to_have_count(0)  # one widget, here
    page.locator("#tool-editor-acc").get_by_text("Write a tool").first.click()
    expect(page.locator("#tool-code")).to_contain_text("def add(a: int, b: int) -> int:")
    page.locator("#tool-save").click()
    expect(page.locator("#tool-msg")).to_contain_text("tools/my_tools.py", timeout=30_000)
    files = page.locator("#field-tools-files textarea, #field-tools-files input").first
    fns = page.locator("#field-tools-functions textarea, #field-tools-functions input").first
    expect(files).to_have_value("tools/my_tools.py")
    expect(fns).to_have_value("add")
    assert (env["ws"] / "tools" / "my_tools.py").is_file()
    sec.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "22-build-tools.png"), full_page=False)

    page.locator("#lang-switch label", has_text="中文").click()
    expect(sec).to_contain_text("工具与环境", timeout=30_000)
    expect(page.locator("#field-tools-functions")).to_contain_text("工具")
    expect(page.locator("#tool-save")).to_have_text("保存为工具文件并使用")
    page.screenshot(path=str(ARTIFACTS / "23-build-tools-zh.png"), full_page=False)
    page.close()
