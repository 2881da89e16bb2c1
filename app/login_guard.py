"""Nothing of the studio before login: the login page carries no API description.

Gradio renders its login page from the same template as the app and embeds `window.gradio_api_info` in it (every
endpoint with its parameters and defaults, e.g. the runs folder) even when the visitor has not logged in; only
its config is emptied (`"auth_required": true`). This ASGI middleware, given to Gradio's FastAPI app through
`launch(app_kwargs=...)`, empties that script on exactly those pages: an HTML response whose config says the
visitor must log in. Logged-in pages, the API routes (which answer 401 before login) and everything else pass
through untouched.
"""

from __future__ import annotations

import re
from typing import Any

_API_INFO = re.compile(rb"(<script>window\.gradio_api_info = ).*?(;</script>)", re.S)
_AUTH_REQUIRED = re.compile(rb'"auth_required"\s*:\s*true')


def strip_api_info(html: bytes) -> bytes:
    """The page without its API description when it is the login page; otherwise unchanged."""
    if not _AUTH_REQUIRED.search(html):
        return html
    return _API_INFO.sub(rb"\1{}\2", html)


class LoginPageGuard:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET":
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        body = bytearray()
        html = False

        async def wrapped(message: dict[str, Any]) -> None:
            nonlocal html
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                html = headers.get(b"content-type", b"").startswith(b"text/html")
                if not html:
                    await send(message)
                    return
                start.update(message)
                return
            if message["type"] == "http.response.body" and html:
                body.extend(message.get("body", b""))
                if message.get("more_body"):
                    return
                out = strip_api_info(bytes(body))
                headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(out)).encode()))
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": out})
                return
            await send(message)

        await self.app(scope, receive, wrapped)
