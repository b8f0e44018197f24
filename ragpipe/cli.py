"""The ``ragpipe`` command."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ragpipe.bundle.verify import BundleVerificationError, open_bundle
from ragpipe.corpus.connectors import detect_format
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.registry import RevisionError, register_revision
from ragpipe.stages.workspace import Workspace, default_home

app = typer.Typer(help="Build, verify and inspect retrieval index bundles.", no_args_is_help=True, add_completion=False)
bundle_app = typer.Typer(help="Verify and inspect index bundles.", no_args_is_help=True)
app.add_typer(bundle_app, name="bundle")
out = Console()
err = Console(stderr=True)


class Format(str, Enum):
    beir = "beir"
    markdown = "markdown"


def fail(message: str, code: int = 1) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")


@app.command()
def build(
    path: Annotated[Path, typer.Argument(help="BEIR JSONL(.gz) file or Markdown folder.")],
    revision: Annotated[str, typer.Option("--revision", "-r", help="Immutable revision key (partition name).")],
    fmt: Annotated[Optional[Format], typer.Option("--format", help="Input format (default: folder → markdown, file → beir).")] = None,
    default_scope: Annotated[str, typer.Option("--default-scope", help="Scope of documents that declare none.")] = "public",
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object.")] = False,
) -> None:
    """Register a corpus revision and materialize its whole asset graph through Dagster."""
    from ragpipe.defs.runner import BuildFailed, materialize_revision  # dagster loads only when building

    ws = Workspace(default_home())
    corpus_format = fmt.value if fmt else detect_format(path)
    try:
        _, new = register_revision(ws.registry, revision, path, corpus_format, default_scope)
        if not as_json:
            err.print(f"{'registered' if new else 'already registered'}: revision {escape(revision)} from {escape(str(path))}")
        summary = materialize_revision(revision, ws)
    except (CorpusError, RevisionError, BuildFailed) as exc:
        fail(str(exc))
        return
    if as_json:
        emit_json(summary.as_dict())
        return
    table = Table(title=f"revision {revision}" + (" (up to date, nothing rebuilt)" if summary.up_to_date else ""))
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for key, value in summary.as_dict().items():
        table.add_row(key, str(value))
    out.print(table)


@bundle_app.command("verify")
def bundle_verify(path: Annotated[Path, typer.Argument(help="Bundle directory.")]) -> None:
    """Verify every file, digest, count and chunk of a bundle; non-zero exit if anything is wrong."""
    try:
        bundle = open_bundle(path)
    except BundleVerificationError as exc:
        fail(str(exc))
        return
    out.print(f"ok: {bundle.bundle_id} ({len(bundle.manifest.files)} files verified)")


@bundle_app.command("inspect")
def bundle_inspect(
    path: Annotated[Path, typer.Argument(help="Bundle directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object.")] = False,
) -> None:
    """Show a verified bundle's manifest: ID, counts, specs and files."""
    try:
        bundle = open_bundle(path)
    except BundleVerificationError as exc:
        fail(str(exc))
        return
    m = bundle.manifest
    if as_json:
        emit_json(
            {
                "bundle_id": m.bundle_id,
                "path": str(bundle.path),
                "counts": m.semantic.counts.model_dump(),
                "corpus_digest": m.semantic.corpus_digest,
                "default_scope": m.semantic.default_scope,
                "specs": {k: v.model_dump() for k, v in m.semantic.specs.items()},
                "files": [f.model_dump() for f in m.files],
                "bytes": sum(f.size for f in m.files),
            }
        )
        return
    out.print(f"[bold]bundle[/] {m.bundle_id}\npath   {bundle.path}\ncorpus {m.semantic.corpus_digest}")
    counts = Table(title="counts")
    counts.add_column("what")
    counts.add_column("count", justify="right")
    for k, v in m.semantic.counts.model_dump().items():
        counts.add_row(k, str(v))
    out.print(counts)
    specs = Table(title="specs")
    specs.add_column("stage")
    specs.add_column("spec ID")
    specs.add_column("spec", overflow="fold")
    for k, v in m.semantic.specs.items():
        specs.add_row(k, v.spec_id, json.dumps(v.spec, sort_keys=True))
    out.print(specs)
    out.print(f"{len(m.files)} files, {sum(f.size for f in m.files):,} bytes")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
