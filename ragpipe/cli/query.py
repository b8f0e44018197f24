"""``ragpipe query`` and ``ragpipe answer``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ragpipe.cli.common import BundleOpt, JsonOpt, Mode, RevisionOpt, bundle_path, emit_json, err, fail, out
from ragpipe.kernel.workspace import Workspace, default_home

ScopeOpt = Annotated[
    list[str] | None, typer.Option("--scope", "-s", help="Scope of the caller (repeatable; default: public).")
]
RoleOpt = Annotated[
    list[str] | None,
    typer.Option("--source-role", help="Only chunks of documents with this source role (repeatable)."),
]
PrincipalOpt = Annotated[str, typer.Option("--principal", help="Who is asking (recorded in the result).")]
PlanOpt = Annotated[
    Path | None, typer.Option("--plan", help="Query plan file (default: ragpipe/specs/query_plan.yaml).")
]
ModeOpt = Annotated[
    Mode | None, typer.Option("--mode", help="Channels: hybrid, lexical or vector (default: the plan's).")
]
ReleaseOpt = Annotated[
    str | None, typer.Option("--release", help="Serve this exact release (verified; its gated plan).")
]
TargetOpt = Annotated[str | None, typer.Option("--target", "-t", help="Serve the active release of this target.")]
WhereOpt = Annotated[
    str | None,
    typer.Option(
        "--where",
        help="Only chunks of documents whose metadata matches, e.g. 'category = \"faq\" and year >= 2020' "
        "(docs/retrieval.md).",
    ),
]


def _retriever(
    bundle: Path | None, revision: str | None, release: str | None, target: str | None, plan_path: Path | None
):
    """The retriever for the source the caller named: ``--bundle`` or ``--revision`` (with ``--plan``
    or the default plan), else a release — ``--release ID``, the active release of ``--target``,
    or, with none of these, the active release of the default target, served with the plan it
    was gated with."""
    if bundle is not None or revision is not None:
        if release is not None or target is not None:
            raise ValueError("give a bundle (--bundle or --revision) or a release (--release or --target), not both")
        from ragpipe.api import Retriever  # the retrieval stack: only when a query runs
        from ragpipe.retrieval.plan import load_plan

        plan = load_plan(plan_path)
        return Retriever(bundle_path(bundle, revision), plan=plan), plan
    if plan_path is not None:
        raise ValueError("--plan applies to --bundle or --revision; a release serves the plan it was gated with")
    if release is not None and target is not None:
        raise ValueError("give --release or --target, not both")
    # not Retriever here: retriever_for_release starts loading the query graph before it imports the
    # retrieval stack, so that the two overlap
    from ragpipe.api import retriever_for_release

    retriever = retriever_for_release(target, release_id=release)
    return retriever, retriever.plan


def _with_release(data: dict, retriever) -> dict:
    if retriever.release_id is not None:
        data["release_id"] = retriever.release_id
    return data


def _filter(where: str | None) -> dict | None:
    """``--where`` text as the filter's JSON form (``FilterError``, a ValueError, when malformed)."""
    if where is None:
        return None
    from ragpipe.corpus.metadata_filter import filter_json
    from ragpipe.corpus.where_syntax import parse_where

    return filter_json(parse_where(where))


def _warn_unknown_scopes(retriever, scopes: tuple[str, ...]) -> None:
    """Warn (stderr) about asked-for scopes no document of the bundle carries: a typo such as
    ``--scope pubilc`` otherwise reads as "nothing matches". Only here, on the operator's command
    line: the server never says which scopes exist."""
    carried = {s for document_scopes in retriever.scopes.values() for s in document_scopes}
    for scope in scopes:
        if scope not in carried:
            err.print(
                f"warning: no document of bundle {retriever.bundle_id[:19]}… carries scope {scope!r} "
                f"(scopes in it: {', '.join(sorted(carried)) or 'none'})",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )


def _subject(principal: str, scopes: list[str] | None):
    from ragpipe.retrieval.authz import DEFAULT_SCOPE, Subject

    return Subject(principal=principal, scopes=tuple(scopes) if scopes else (DEFAULT_SCOPE,))


def _expected_errors() -> tuple[type[Exception], ...]:
    """The query side's errors that are the user's to fix (imported only once one was raised:
    a bad argument is refused before the retrieval stack is imported)."""
    from ragpipe.bundle.verify import BundleVerificationError
    from ragpipe.embedding.embedder import EmbedderError
    from ragpipe.retrieval.authz import AuthorizationError
    from ragpipe.retrieval.plan import PlanError
    from ragpipe.retrieval.rerank import RerankerError
    from ragpipe.retrieval.results import QueryError

    # EmbedderError: a refused query-graph entry or embedder model, one line saying what to do
    return BundleVerificationError, EmbedderError, PlanError, QueryError, AuthorizationError, RerankerError


def _or_fail(action):
    """Run a query-side action; its expected errors become one clear message and exit code 1."""
    try:
        return action()
    except ValueError as exc:  # a bad argument; ReleaseError and LedgerError are ValueErrors too
        fail(str(exc))
    except Exception as exc:
        if isinstance(exc, _expected_errors()):
            fail(str(exc))
        raise


def query(
    text: Annotated[str, typer.Argument(help="The query.")],
    bundle: BundleOpt = None,
    revision: RevisionOpt = None,
    release: ReleaseOpt = None,
    target: TargetOpt = None,
    scope: ScopeOpt = None,
    principal: PrincipalOpt = "cli",
    k: Annotated[int, typer.Option("--k", min=1, help="Number of hits.")] = 10,
    mode: ModeOpt = None,
    plan: PlanOpt = None,
    as_json: JsonOpt = False,
    trace: Annotated[
        bool, typer.Option("--trace", help="Show channel hits, fusion, collapse and authorization.")
    ] = False,
    audit: Annotated[
        bool, typer.Option("--audit", help="Operator only: the trace plus counts of documents hidden from the subject.")
    ] = False,
    source_role: RoleOpt = None,
    where: WhereOpt = None,
) -> None:
    """Ranked chunks for TEXT, visible to the caller's scopes only, from a verified bundle or (by
    default) the active release of the default target."""

    def run():
        metadata_filter = _filter(where)
        retriever, _ = _retriever(bundle, revision, release, target, plan)
        subject = _subject(principal, scope)
        result = retriever.query(
            text,
            subject,
            k=k,
            mode=mode.value if mode else None,
            trace=trace or audit,
            audit=audit,
            source_roles=tuple(source_role) if source_role else None,
            filter=metadata_filter,
        )
        _warn_unknown_scopes(retriever, subject.scopes)
        return result, _with_release(result.as_dict(), retriever)

    result, data = _or_fail(run)
    if as_json:
        emit_json(data)
        return
    served = f" · release {data['release_id'][:19]}…" if "release_id" in data else ""
    served += " · approximate vector search" if data.get("approximate") else ""
    out.print(
        f"[bold]{len(data['hits'])} hits[/] · mode {data['mode']} · scopes {', '.join(result.subject.scopes)} · plan {data['plan_id'][:19]}…{served}"
    )
    for hit in data["hits"]:
        out.print(
            f"\n[bold]{hit['rank']:>2}.[/] {escape(str(hit['title']))}  [dim]{escape(str(hit['document_id']))} "
            f"[{hit['byte_start']}, {hit['byte_end']}) score {hit['score']:.5f}[/]"
        )
        snippet = " ".join(str(hit["text"]).split())
        out.print("    " + escape(snippet[:240] + ("…" if len(snippet) > 240 else "")))
    if trace or audit:
        out.print_json(data=data["trace"])


def answer(
    text: Annotated[str, typer.Argument(help="The question.")],
    bundle: BundleOpt = None,
    revision: RevisionOpt = None,
    release: ReleaseOpt = None,
    target: TargetOpt = None,
    scope: ScopeOpt = None,
    principal: PrincipalOpt = "cli",
    model: Annotated[
        str | None, typer.Option("--model", help="Answer with this litellm model instead of the plan's generator.")
    ] = None,
    api_base: Annotated[str | None, typer.Option("--api-base", help="Provider base URL for --model.")] = None,
    mode: ModeOpt = None,
    plan: PlanOpt = None,
    as_json: JsonOpt = False,
    where: WhereOpt = None,
) -> None:
    """A grounded answer with citations [E1]… resolving to source chunks, or an explicit abstention."""

    def run():
        metadata_filter = _filter(where)
        retriever, qplan = _retriever(bundle, revision, release, target, plan)
        gen_plan = qplan.answer.generator
        if model:
            gen_plan = gen_plan.model_copy(
                update={"kind": "litellm", "model": model, "api_base": api_base or gen_plan.api_base}
            )
        from ragpipe.api import answer, make_generator

        generator = make_generator(gen_plan, retriever.bundle_id, cache_dir=Workspace(default_home()).answer_cache)
        subject = _subject(principal, scope)
        result = answer(
            retriever, text, subject, generator=generator, mode=mode.value if mode else None, filter=metadata_filter
        )
        _warn_unknown_scopes(retriever, subject.scopes)
        return _with_release(result.as_dict(), retriever)

    data = _or_fail(run)
    if as_json:
        emit_json(data)
        return
    served = f" · release {data['release_id']}" if "release_id" in data else ""
    out.print(f"[dim]generator: {escape(data['generator'])}{served}[/]")
    if data["abstained"]:
        out.print(f"[bold yellow]abstained:[/] {escape(str(data['reason']))}")
    else:
        out.print(escape(str(data["answer"])))
    for c in data["citations"]:
        ev = next(e for e in data["evidence"] if e["label"] == c["label"])
        out.print(
            f"  {escape('[' + c['label'] + ']')} {escape(str(ev['title']))} — {escape(c['document_id'])} [{ev['byte_start']}, {ev['byte_end']})"
        )
