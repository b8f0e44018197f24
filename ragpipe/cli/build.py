"""``ragpipe build`` and ``ragpipe gc``."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ragpipe.cli.common import emit_json, err, fail, out
from ragpipe.kernel.workspace import Workspace, default_home


class Format(str, Enum):
    beir = "beir"
    markdown = "markdown"
    html = "html"
    pdf = "pdf"
    wxr = "wxr"


class Launch(str, Enum):
    auto = "auto"
    in_process = "in-process"
    queue = "queue"


def build(
    path: Annotated[
        Path,
        typer.Argument(
            help="BEIR JSONL(.gz) file, WordPress export (.xml), or a folder of Markdown, HTML or PDF files."
        ),
    ],
    revision: Annotated[str, typer.Option("--revision", "-r", help="Immutable revision key (partition name).")],
    fmt: Annotated[
        Format | None,
        typer.Option("--format", help="Input format (default: folder → markdown, .xml file → wxr, other file → beir)."),
    ] = None,
    default_scope: Annotated[
        str | None,
        typer.Option(
            "--default-scope",
            help="Scope of documents that declare no access_scopes (recorded). Without it such documents are refused.",
        ),
    ] = None,
    wxr_status: Annotated[
        str | None,
        typer.Option(
            "--wxr-status",
            help="WordPress statuses to read, comma-separated (default: publish; recorded with the revision).",
        ),
    ] = None,
    max_document_bytes: Annotated[
        int, typer.Option("--max-document-bytes", min=1, help="Largest document text, UTF-8 bytes (default 8 MiB).")
    ] = 8 * 1024 * 1024,
    max_documents: Annotated[
        int, typer.Option("--max-documents", min=1, help="Most documents in one revision (default 1,000,000).")
    ] = 1_000_000,
    max_corpus_bytes: Annotated[
        int, typer.Option("--max-corpus-bytes", min=1, help="Largest total document text, bytes (default 4 GiB).")
    ] = 4096 * 1024 * 1024,
    launch: Annotated[
        Launch, typer.Option("--launch", help="auto: the run queue when a daemon serves it, else in this process.")
    ] = Launch.auto,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print Dagster's event stream.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object.")] = False,
) -> None:
    """Register a corpus revision and run the build_revision job of the `ragpipe` code location for it."""
    # the corpus readers and the configuration check load only when a build runs (not for --help)
    from ragpipe.corpus.bounds import CorpusBounds
    from ragpipe.corpus.connectors import detect_format
    from ragpipe.corpus.normalize import CorpusError
    from ragpipe.corpus.registry import RevisionError, register_revision
    from ragpipe.stages.configuration import ConfigurationError, check_configuration

    try:  # the whole configuration first: a bad spec, suite, plan, policy or targets file registers nothing
        checked = check_configuration()
    except ConfigurationError as exc:
        fail(str(exc))
    ws = Workspace.of(checked.settings)
    corpus_format = fmt.value if fmt else detect_format(path)
    statuses = tuple(wxr_status.split(",")) if wxr_status is not None else None
    try:  # validated and registered before Dagster is even loaded: a bad corpus fails fast
        bounds = CorpusBounds(max_document_bytes, max_documents, max_corpus_bytes)
        _, new = register_revision(ws.registry, revision, path, corpus_format, default_scope, statuses, bounds)
    except (CorpusError, RevisionError) as exc:
        fail(str(exc))
    if not as_json:
        err.print(
            f"{'registered' if new else 'already registered'}: revision {escape(revision)} from {escape(str(path))}",
            soft_wrap=True,
            highlight=False,
        )
    from ragpipe.cli.build_view import BuildView, print_summary  # dagster loads only when building
    from ragpipe.orchestration.launch import LaunchError
    from ragpipe.orchestration.materialize import BuildFailed, materialize_revision

    view = None if as_json else BuildView(err)
    try:
        summary = materialize_revision(
            revision,
            ws,
            on_wait=None if as_json else lambda message: err.print(escape(message)),
            on_progress=view,
            launch=launch.value.replace("-", "_"),
            verbose=verbose,
            configuration=checked,  # checked once here; the code location checks its own when it loads
        )
    except (CorpusError, RevisionError, BuildFailed, LaunchError, ConfigurationError) as exc:
        fail(str(exc))  # ConfigurationError: the configuration changed after the check above
    finally:
        if view:
            view.close()
    if as_json:
        emit_json(summary.as_dict())
        return
    print_summary(out, summary.as_dict())


def gc(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object.")] = False,
) -> None:
    """Remove stage versions and bundles that neither a revision's latest materialization nor an active
    or previously active release references."""
    from ragpipe.gc import GcError, collect_garbage
    from ragpipe.kernel.ledger import LedgerError
    from ragpipe.release.roots import release_roots
    from ragpipe.release.store import ReleaseError

    ws = Workspace(default_home())
    try:  # release roots fail closed: a damaged release history stops collection before anything goes
        report = collect_garbage(ws, extra_roots=release_roots(ws), dry_run=dry_run)
    except (GcError, ReleaseError, LedgerError) as exc:
        fail(str(exc))
    if as_json:
        emit_json(report.as_dict())
        return
    verb = "would remove" if dry_run else "removed"
    for r in report.removed:
        out.print(f"{verb} {r.kind} {escape(r.path)} ({r.bytes:,} bytes)", highlight=False, soft_wrap=True)
    out.print(
        f"{verb} {len(report.removed)} item(s), {report.removed_bytes:,} bytes; kept "
        f"{report.kept_stage_versions} stage version(s) and {report.kept_bundles} bundle(s)",
        highlight=False,
    )
