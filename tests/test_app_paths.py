"""Workspace confinement of paths and uploads, and launch.py's refusal to listen openly without auth."""

from __future__ import annotations

from pathlib import Path

import pytest

import launch
from app.paths import PathError, Workspace, safe_filename


def test_resolve_stays_inside(tmp_path):
    ws = Workspace(tmp_path / "ws", [tmp_path / "runs"])
    (tmp_path / "ws" / "data").mkdir(parents=True)
    (tmp_path / "runs").mkdir()
    assert ws.resolve("data") == (tmp_path / "ws" / "data").resolve()
    assert ws.resolve(str(tmp_path / "runs" / "x")) == (tmp_path / "runs" / "x").resolve()
    for bad in ("../outside", "/etc/passwd", "data/../../x", "~/.ssh/id_rsa", "", "a\x00b"):
        with pytest.raises(PathError):
            ws.resolve(bad)


def test_symlink_out_of_the_workspace_is_outside(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "ws" / "link").symlink_to(tmp_path / "secret")
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(PathError):
        ws.resolve("link/file")


def test_check_ref_lets_hub_ids_through(tmp_path):
    ws = Workspace(tmp_path)
    assert ws.check_ref("Qwen/Qwen2.5-7B-Instruct") is None
    assert ws.check_ref("AI-MO/NuminaMath-TIR#500") is None
    assert "outside" in ws.check_ref("../../etc/passwd#3")
    assert ws.check_ref("Qwen/Qwen2.5", allow_hub=False) is None  # inside (tmp_path/Qwen/...), just absent


def test_safe_filename_and_upload(tmp_path):
    assert safe_filename("../../etc/passwd") == "passwd"
    assert safe_filename("..\\..\\win.ini") == "win.ini"
    assert safe_filename(".bashrc") == "bashrc"
    assert safe_filename("my data (1).jsonl") == "my_data_1_.jsonl"
    assert safe_filename("..") == "file"
    src = tmp_path / "tmp" / "..evil name.jsonl"
    src.parent.mkdir()
    src.write_text('{"prompt": "1+1="}\n')
    ws = Workspace(tmp_path / "ws")
    rel = ws.save_upload(str(src))
    assert rel == "uploads/evil_name.jsonl"
    assert (tmp_path / "ws" / rel).read_text() == src.read_text()
    assert ws.save_upload(str(src)) == rel  # the same file again: no duplicate
    src.write_text("different\n")
    assert ws.save_upload(str(src)) == "uploads/evil_name-1.jsonl"
    with pytest.raises(PathError):
        ws.save_upload(str(src), "../elsewhere")


def test_launch_refuses_open_host_without_auth(capsys):
    assert launch.main(["--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--auth" in err and "0.0.0.0" in err


def test_auth_parsing(tmp_path):
    assert launch.parse_auth("ann:pw:with:colons") == [("ann", "pw:with:colons")]
    f = tmp_path / "users"
    f.write_text("# users\nann:one\n\nbob:two\n")
    assert launch.parse_auth(str(f)) == [("ann", "one"), ("bob", "two")]
    with pytest.raises(ValueError):
        launch.parse_auth("nopassword")
    assert launch.is_loopback("127.0.0.1") and launch.is_loopback("::1") and launch.is_loopback("localhost")
    assert not launch.is_loopback("0.0.0.0") and not launch.is_loopback("192.168.1.2")
    assert launch.main(["--host", "0.0.0.0", "--auth", "bad"]) == 2


def test_studio_builds_with_every_field(tmp_path):
    from app.config import StudioConfig
    from app.form import fields
    from app.studio import create_studio

    config = StudioConfig.create(Path(__file__).resolve().parent.parent, tmp_path / "runs")
    demo = create_studio(config, lang="zh")
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    missing = [f.path for f in fields() if "field-" + f.path.replace(".", "-") not in ids]
    assert not missing


def test_the_login_page_carries_no_api_description() -> None:
    """Gradio embeds window.gradio_api_info (every endpoint, its parameters and defaults) in the login page too;
    the studio's middleware empties it there, and only there (issue 28)."""
    import asyncio

    from app.login_guard import LoginPageGuard, strip_api_info

    login = (b'<script>window.gradio_config = {"auth_required":true,"components":[]};</script>'
             b'<script>window.gradio_api_info = {"named_endpoints":{"/lambda":{"runs":"/srv/runs"}}};</script>')
    app_page = login.replace(b'"auth_required":true,', b"")
    assert strip_api_info(login).endswith(b"<script>window.gradio_api_info = {};</script>")
    assert strip_api_info(app_page) == app_page  # a logged-in page keeps what the client needs

    async def serve(body: bytes, kind: bytes) -> tuple[dict, bytes]:
        async def app(scope, receive, send):  # an ASGI app answering in two chunks
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body[:10], "more_body": True})
            await send({"type": "http.response.body", "body": body[10:]})

        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        await LoginPageGuard(app)({"type": "http", "method": "GET"}, None, send)
        return dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])

    headers, out = asyncio.run(serve(login, b"text/html; charset=utf-8"))
    assert b"/srv/runs" not in out and headers[b"content-length"] == str(len(out)).encode()
    assert asyncio.run(serve(login, b"application/json"))[1] == login  # not a page: untouched


def test_a_data_upload_replaces_the_sources_unless_asked_to_add(tmp_path):
    from app.sections.data import on_upload, sources_after_upload

    ws = Workspace(tmp_path / "ws")
    (tmp_path / "ws").mkdir()
    src = tmp_path / "my_add.jsonl"
    src.write_text('{"prompt": "1+1"}\n')
    old = "assets/data/add_train.jsonl"
    sources, msg, preview = on_upload(ws, str(src), old, False, "en")
    assert sources == "uploads/my_add.jsonl"  # replaced: the preview now reads the upload's rows
    assert "uploads/my_add.jsonl" in msg and preview == ""  # the old sources' preview is cleared
    sources, msg, _ = on_upload(ws, str(src), old, True, "zh")
    assert sources == "assets/data/add_train.jsonl, uploads/my_add.jsonl" and "加入" in msg
    assert sources_after_upload("a.jsonl\nb.jsonl", "a.jsonl", add=True) == "a.jsonl, b.jsonl"  # not repeated
    assert on_upload(ws, None, old, False, "en")[1] == ""
