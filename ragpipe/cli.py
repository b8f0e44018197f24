"""The ``ragpipe`` command."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ragpipe.bundle.verify import BundleVerificationError, open_bundle
from ragpipe.corpus.connectors import detect_format
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.registry import RevisionError, check_revision_key, register_revision
from ragpipe.stages.workspace import Workspace, default_home

app = typer.Typer(help="Build, verify and inspect retrieval index bundles.", no_args_is_help=True, add_completion=False)
bundle_app = typer.Typer(help="Verify and inspect index bundles.", no_args_is_help=True)
app.add_typer(bundle_app, name="bundle")
out = Console()
err = Console(stderr=True)


class Format(str, Enum):
    beir = "beir"
    markdown = "markdown"


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")


class Launch(str, Enum):
    auto = "auto"
    in_process = "in-process"
    queue = "queue"


@app.command()
def build(
    path: Annotated[Path, typer.Argument(help="BEIR JSONL(.gz) file or Markdown folder.")],
    revision: Annotated[str, typer.Option("--revision", "-r", help="Immutable revision key (partition name).")],
    fmt: Annotated[Optional[Format], typer.Option("--format", help="Input format (default: folder → markdown, file → beir).")] = None,
    default_scope: Annotated[str, typer.Option("--default-scope", help="Scope of documents that declare none.")] = "public",
    launch: Annotated[
        Launch, typer.Option("--launch", help="auto: the run queue when a daemon serves it, else in this process.")
    ] = Launch.auto,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print Dagster's event stream.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object.")] = False,
) -> None:
    """Register a corpus revision and run the build_revision job of the `ragpipe` code location for it."""
    ws = Workspace(default_home())
    corpus_format = fmt.value if fmt else detect_format(path)
    try:  # validated and registered before Dagster is even loaded: a bad corpus fails fast
        _, new = register_revision(ws.registry, revision, path, corpus_format, default_scope)
    except (CorpusError, RevisionError) as exc:
        fail(str(exc))
    if not as_json:
        err.print(
            f"{'registered' if new else 'already registered'}: revision {escape(revision)} from {escape(str(path))}",
            soft_wrap=True,
            highlight=False,
        )
    from ragpipe.build_view import BuildView, summary_table  # dagster loads only when building
    from ragpipe.defs.launch import LaunchError
    from ragpipe.defs.runner import BuildFailed, materialize_revision

    view = None if as_json else BuildView(err)
    try:
        summary = materialize_revision(
            revision,
            ws,
            on_wait=None if as_json else lambda message: err.print(escape(message)),
            on_progress=view,
            launch=launch.value.replace("-", "_"),
            verbose=verbose,
        )
    except (CorpusError, RevisionError, BuildFailed, LaunchError) as exc:
        fail(str(exc))
    finally:
        if view:
            view.close()
    if as_json:
        emit_json(summary.as_dict())
        return
    out.print(summary_table(summary.as_dict()))


@app.command()
def gc(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object.")] = False,
) -> None:
    """Remove stage versions and bundles that neither a revision's latest materialization nor an active
    or previously active release references."""
    from ragpipe.kernel.ledger import LedgerError
    from ragpipe.release.roots import release_roots
    from ragpipe.release.store import ReleaseError
    from ragpipe.stages.gc import GcError, collect_garbage

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


@bundle_app.command("verify")
def bundle_verify(path: Annotated[Path, typer.Argument(help="Bundle directory.")]) -> None:
    """Verify every file, digest, count and chunk of a bundle; non-zero exit if anything is wrong."""
    try:
        bundle = open_bundle(path)
    except BundleVerificationError as exc:
        fail(str(exc))
    m = bundle.manifest
    out.print(f"ok: {m.bundle_id} material {m.material_digest} ({len(m.files)} files verified, {m.seal.kind} seal)", soft_wrap=True, highlight=False)


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
    m = bundle.manifest
    if as_json:
        emit_json(
            {
                "bundle_id": m.bundle_id,
                "material_digest": m.material_digest,
                "seal": m.seal.model_dump(),
                "embeddings_digest": m.material.embeddings_digest,
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
    seal = f"{m.seal.kind}" + (f" (key {m.seal.key_id})" if m.seal.key_id else "")
    out.print(
        f"[bold]bundle[/]   {m.bundle_id}\nmaterial {m.material_digest}\nseal     {seal}\n"
        f"path     {bundle.path}\ncorpus   {m.semantic.corpus_digest}"
    )
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


class Mode(str, Enum):
    hybrid = "hybrid"
    lexical = "lexical"
    vector = "vector"


BundleOpt = Annotated[Optional[Path], typer.Option("--bundle", "-b", help="Bundle directory.")]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", "-r", help="Use the bundle last built for this revision.")]
ScopeOpt = Annotated[Optional[list[str]], typer.Option("--scope", "-s", help="Scope of the caller (repeatable; default: public).")]
PrincipalOpt = Annotated[str, typer.Option("--principal", help="Who is asking (recorded in the result).")]
PlanOpt = Annotated[Optional[Path], typer.Option("--plan", help="Query plan file (default: ragpipe/specs/query_plan.yaml).")]
ModeOpt = Annotated[Optional[Mode], typer.Option("--mode", help="Channels: hybrid, lexical or vector (default: the plan's).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print exactly one JSON object.")]


def _retriever(bundle: Path | None, revision: str | None, plan_path: Path | None):
    if revision is not None:  # a key is a path segment: '../x' would leave RAGPIPE_HOME
        check_revision_key(revision)
    from ragpipe.retrieval.plan import load_plan
    from ragpipe.retrieval.service import QueryError, Retriever
    from ragpipe.stages.steps import StageError, read_stage_record

    if (bundle is None) == (revision is None):
        raise QueryError("give exactly one of --bundle PATH or --revision KEY")
    if revision is not None:
        try:
            bundle = Path(str(read_stage_record(Workspace(default_home()), revision, "index_bundle").facts["bundle_path"]))
        except StageError as exc:
            raise QueryError(str(exc)) from None
    plan = load_plan(plan_path)
    return Retriever(bundle, plan=plan, cache_dir=default_home() / "answer_cache"), plan


def _subject(principal: str, scopes: list[str] | None):
    from ragpipe.retrieval.authz import DEFAULT_SCOPE, Subject

    return Subject(principal=principal, scopes=tuple(scopes) if scopes else (DEFAULT_SCOPE,))


def _or_fail(action):
    """Run a query-side action; its expected errors become one clear message and exit code 1."""
    from ragpipe.retrieval.authz import AuthorizationError
    from ragpipe.retrieval.plan import PlanError
    from ragpipe.retrieval.rerank import RerankerError
    from ragpipe.retrieval.service import QueryError

    try:
        return action()
    except (BundleVerificationError, PlanError, QueryError, AuthorizationError, RerankerError, ValueError) as exc:
        fail(str(exc))


@app.command()
def query(
    text: Annotated[str, typer.Argument(help="The query.")],
    bundle: BundleOpt = None,
    revision: RevisionOpt = None,
    scope: ScopeOpt = None,
    principal: PrincipalOpt = "cli",
    k: Annotated[int, typer.Option("--k", help="Number of hits.")] = 10,
    mode: ModeOpt = None,
    plan: PlanOpt = None,
    as_json: JsonOpt = False,
    trace: Annotated[bool, typer.Option("--trace", help="Show channel hits, fusion, collapse and authorization.")] = False,
    audit: Annotated[
        bool, typer.Option("--audit", help="Operator only: the trace plus counts of documents hidden from the subject.")
    ] = False,
) -> None:
    """Ranked chunks for TEXT from a verified bundle, visible to the caller's scopes only."""
    def run():
        retriever, _ = _retriever(bundle, revision, plan)
        return retriever.query(
            text, _subject(principal, scope), k=k, mode=mode.value if mode else None, trace=trace or audit, audit=audit
        )

    result = _or_fail(run)
    data = result.as_dict()
    if as_json:
        emit_json(data)
        return
    out.print(f"[bold]{len(data['hits'])} hits[/] · mode {data['mode']} · scopes {', '.join(result.subject.scopes)} · plan {data['plan_id'][:19]}…")
    for hit in data["hits"]:
        out.print(
            f"\n[bold]{hit['rank']:>2}.[/] {escape(str(hit['title']))}  [dim]{escape(str(hit['document_id']))} "
            f"[{hit['byte_start']}, {hit['byte_end']}) score {hit['score']:.5f}[/]"
        )
        snippet = " ".join(str(hit["text"]).split())
        out.print("    " + escape(snippet[:240] + ("…" if len(snippet) > 240 else "")))
    if trace or audit:
        out.print_json(data=data["trace"])


@app.command()
def answer(
    text: Annotated[str, typer.Argument(help="The question.")],
    bundle: BundleOpt = None,
    revision: RevisionOpt = None,
    scope: ScopeOpt = None,
    principal: PrincipalOpt = "cli",
    model: Annotated[Optional[str], typer.Option("--model", help="Answer with this litellm model instead of the plan's generator.")] = None,
    api_base: Annotated[Optional[str], typer.Option("--api-base", help="Provider base URL for --model.")] = None,
    mode: ModeOpt = None,
    plan: PlanOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A grounded answer with citations [E1]… resolving to source chunks, or an explicit abstention."""
    def run():
        retriever, qplan = _retriever(bundle, revision, plan)
        gen_plan = qplan.answer.generator
        if model:
            gen_plan = gen_plan.model_copy(update={"kind": "litellm", "model": model, "api_base": api_base or gen_plan.api_base})
        return retriever.answer(
            text, _subject(principal, scope), generator=retriever.make_generator(gen_plan), mode=mode.value if mode else None
        )

    data = _or_fail(run).as_dict()
    if as_json:
        emit_json(data)
        return
    out.print(f"[dim]generator: {escape(data['generator'])}[/]")
    if data["abstained"]:
        out.print(f"[bold yellow]abstained:[/] {escape(str(data['reason']))}")
    else:
        out.print(escape(str(data["answer"])))
    for c in data["citations"]:
        ev = next(e for e in data["evidence"] if e["label"] == c["label"])
        out.print(f"  {escape('[' + c['label'] + ']')} {escape(str(ev['title']))} — {escape(c['document_id'])} [{ev['byte_start']}, {ev['byte_end']})")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
