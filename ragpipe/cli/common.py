"""What every ``ragpipe`` command shares: the two consoles, the error exit, JSON output, and the
options that name a bundle.

Every expected error prints ``error: <message>`` on stderr and exits non-zero (1 unless a command
documents another code); ``--json`` prints exactly one JSON value on stdout and nothing else.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

out = Console()
err = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print exactly one JSON object.")]
BundleOpt = Annotated[Path | None, typer.Option("--bundle", "-b", help="Bundle directory.")]
RevisionOpt = Annotated[
    str | None, typer.Option("--revision", "-r", help="Use the bundle last built for this revision.")
]


class Mode(str, Enum):
    hybrid = "hybrid"
    lexical = "lexical"
    vector = "vector"


_CONTROL = str.maketrans({c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]})


def printable(text: str) -> str:
    """``text`` safe to print in a terminal and in rich markup: control characters (escape
    sequences, carriage returns: a drafted question must not repaint what a reviewer reads) as
    ``\\xNN``, markup escaped."""
    return escape(text.translate(_CONTROL))


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True, default=str) + "\n")


def revision_bundle(revision: str) -> Path:
    """The bundle last built for ``revision`` (its ``index_bundle`` stage record), downloaded from
    the configured store when it was built elsewhere; ``ValueError`` naming the problem when the
    key is malformed, nothing was built or the bundle cannot be had."""
    from ragpipe.corpus.registry import check_revision_key
    from ragpipe.kernel.workspace import Workspace, default_home
    from ragpipe.stages.steps import StageError, read_stage_record

    check_revision_key(revision)  # a key is a path segment: '../x' would leave RAGPIPE_HOME
    try:
        ws = Workspace(default_home())
        path = ws.located(str(read_stage_record(ws, revision, "index_bundle").facts["bundle_path"]))
    except StageError as exc:
        raise ValueError(str(exc)) from None
    if not path.exists():  # built elsewhere: from the configured store (BundleVerificationError is a ValueError)
        from ragpipe.bundle.objects import open_bundle_here

        open_bundle_here(path)
    return path


def bundle_path(bundle: Path | None, revision: str | None) -> Path:
    """``--bundle PATH`` as given, or the bundle last built for ``--revision KEY`` (exactly one)."""
    if (bundle is None) == (revision is None):
        raise ValueError("give exactly one of --bundle PATH or --revision KEY")
    return bundle if bundle is not None else revision_bundle(revision)
