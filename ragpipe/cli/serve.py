"""``ragpipe serve`` (the HTTP service over a target's active release) and ``ragpipe serve-key``."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from ragpipe.cli.common import JsonOpt, emit_json, err, fail, out
from ragpipe.kernel.settings import Settings
from ragpipe.kernel.workspace import default_home


def _log_lines() -> None:
    """Access and follower lines on stderr, one per event (the access lines are JSON)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ("ragpipe.access", "ragpipe.server"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def serve(
    target: Annotated[
        str | None, typer.Option("--target", "-t", help="Serve this target's active release (default: the config's).")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8080,
    config: Annotated[
        Path | None, typer.Option("--config", help="serve.yaml: keys, anonymous access, limits (docs/serving.md).")
    ] = None,
) -> None:
    """Serve the active release of a target over HTTP, following activation and rollback."""
    from ragpipe.release.store import ReleaseError
    from ragpipe.server.config import ServeConfigError, load_serve_config

    try:
        settings = load_serve_config(config)
        from ragpipe.server.app import app_from

        app = app_from(default_home(Settings.from_environ()), settings, target)
    except (ServeConfigError, ReleaseError, ValueError) as exc:
        fail(str(exc))

    try:  # bound here, so a bad address is one line, not uvicorn's log and exit code 3
        sock = socket.create_server((host, port), reuse_port=False)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    _log_lines()
    out.print(f"serving target {app.service.follower.target!r} on http://{host}:{port} (ready at /readyz)")
    if not settings.keys and not settings.anonymous:  # every query and answer would be a 401
        err.print(
            "warning: no caller can be authorised: the config has no keys and anonymous: false, so every query and "
            "answer is refused with 401; add a key (ragpipe serve-key ID --subject NAME --scope SCOPE) or set "
            f"anonymous: true in {config or 'a serve.yaml given with --config'}",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    from ragpipe.server.connections import SignalledServer, uvicorn_config

    # deadlines, the connection cap and proxy handling are the server's own (ragpipe.server.connections)
    server = SignalledServer(uvicorn_config(app, host, port))
    server.run(sockets=[sock])
    if signal.SIGINT in server.signals:  # stopped by Ctrl-C: end as one, 128 + SIGINT, every time
        raise typer.Exit(128 + signal.SIGINT)


def serve_key(
    key_id: Annotated[str, typer.Argument(help="The key's ID: lowercase letters, digits and '-'.")],
    subject: Annotated[str, typer.Option("--subject", help="The subject every request with this key is served as.")],
    scope: Annotated[list[str], typer.Option("--scope", "-s", help="A scope of that subject (repeatable).")],
    role: Annotated[
        list[str] | None,
        typer.Option("--role", help="A role beyond reading: reviewer opens the lab (docs/lab.md; repeatable)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Make an API key: prints the key once and the entry to add under keys: in serve.yaml."""
    from pydantic import ValidationError

    from ragpipe.server.config import KeyEntry
    from ragpipe.server.keys import new_key
    from ragpipe.spec import validation_error_text

    try:
        key, stored = new_key(key_id)
        entry = KeyEntry(id=key_id, hash=stored, subject=subject, scopes=tuple(scope), roles=tuple(role or ()))
    except ValidationError as exc:
        fail(validation_error_text(exc))
    except ValueError as exc:
        fail(str(exc))
    data = {"key": key, "entry": entry.model_dump(mode="json")}
    if as_json:
        emit_json(data)
        return
    # plain text: the key and the YAML must come out unwrapped and unstyled, ready to copy
    typer.echo(f"key (shown once, store it now): {key}")
    typer.echo("add to serve.yaml:")
    typer.echo(yaml.safe_dump({"keys": [data["entry"]]}, sort_keys=False, default_flow_style=None).rstrip())
