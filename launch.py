"""Start GRPO Studio: `python launch.py [--host 127.0.0.1] [--port 7860] [--runs-dir runs] [--auth user:pass|FILE]`.

Binds 127.0.0.1 by default. Any other host exposes the studio (which can start processes and write files in the
workspace) to a network, so it refuses to start without --auth.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:  # `python launch.py` from anywhere
    sys.path.insert(0, str(ROOT))


def parse_auth(value: str) -> list[tuple[str, str]]:
    """'user:password', or a file with one 'user:password' per line ('#' comments allowed)."""
    p = Path(value).expanduser()
    lines = p.read_text().splitlines() if p.is_file() else [value]
    pairs = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise ValueError("--auth expects user:password (or a file of such lines)")
        pairs.append((user, password))
    if not pairs:
        raise ValueError(f"--auth file {value} has no user:password line")
    return pairs


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="GRPO Studio: build GRPO runs, launch them, watch them learn.")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --auth)")
    ap.add_argument("--port", type=int, default=int(os.environ.get("GRPO_STUDIO_PORT", 7860)))
    ap.add_argument("--runs-dir", default="runs", help="folder of run directories to list and launch into")
    ap.add_argument("--workspace", default=".", help="root for relative paths; uploads and paths stay inside it")
    ap.add_argument("--presets-dir", default=None, help="preset YAML folder (default: the project's presets/)")
    ap.add_argument("--allow-path", action="append", default=[],
                    help="extra folder the studio may read (e.g. a models directory); repeatable")
    ap.add_argument("--auth", default=None, help="user:password, or a file with one user:password per line")
    ap.add_argument("--lang", default="en", choices=["en", "zh"], help="initial language")
    ap.add_argument("--refresh", type=float, default=2.0, help="seconds between live updates (run list, progress)")
    ap.add_argument("--redraw", type=float, default=2.0,
                    help="charts redraw for new steps at most this often (seconds; user actions redraw at once)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    auth = None
    if args.auth:
        try:
            auth = parse_auth(args.auth)
        except (ValueError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if not is_loopback(args.host) and auth is None:
        print(f"error: refusing to listen on {args.host} without --auth.\n"
              "The studio starts processes and writes files; on a network it needs a password:\n"
              f"  python launch.py --host {args.host} --auth user:password   (or --auth FILE)\n"
              "or keep the default --host 127.0.0.1 and use an SSH tunnel.", file=sys.stderr)
        return 2

    from app.config import StudioConfig
    from app.studio import CSS, create_studio

    config = StudioConfig.create(args.workspace, args.runs_dir, args.presets_dir, args.allow_path)
    config.refresh_s = max(0.5, args.refresh)
    config.redraw_s = max(0.0, args.redraw)
    demo = create_studio(config, lang=args.lang)
    demo.queue(default_concurrency_limit=4)
    print(f"GRPO Studio: workspace {config.workspace.root}, runs {config.runs_dir}", flush=True)
    from starlette.middleware import Middleware

    from app.login_guard import LoginPageGuard

    demo.launch(server_name=args.host, server_port=args.port, auth=auth, css=CSS, show_error=True,
                footer_links=[], allowed_paths=[str(config.export_dir)], max_file_size="2gb",
                app_kwargs={"middleware": [Middleware(LoginPageGuard)]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
