"""``ragpipe dataset …`` (typer app ``dataset_app``): cases people adjudicate, frozen into versions.

    ragpipe dataset create NAME --target T --split dev=0.5 --split holdout=0.5 [--json]
    ragpipe dataset add NAME SUITE.jsonl [--json]
    ragpipe dataset draft NAME (--bundle PATH | --revision KEY) [--spec FILE] [--chunks N | --documents ID …] [--seed S] [--level document|chunk] [--budget-micros M] [--out drafts.jsonl] [--json]
    ragpipe dataset show NAME [--json]
    ragpipe dataset audit NAME [--json]
    ragpipe dataset adjudicate NAME CASE_ID (--accept | --reject | --edit FIELD=JSON …) --by NAME --key KEYFILE [--note TEXT] [--json]
    ragpipe dataset freeze NAME [--json]
    ragpipe dataset export NAME[@N][:SPLIT] --out SUITE.jsonl [--json]

Decisions are signed with the approver keys the target lists (``ragpipe release approver-key``);
``freeze`` and ``export`` check every signature against the target's approvers now. ``draft``
asks a model (``ragpipe/specs/case_draft.yaml``) for cases from the bundle's chunks and adds the
valid ones as provisional drafts, pending adjudication (``ragpipe.evaluation.drafting``); its
calls are cached under ``$RAGPIPE_HOME/draft_cache/`` and sent under the pipeline spec's
``disclosure`` policy. The datasets
live under ``$RAGPIPE_HOME/datasets/``. Every expected error prints ``error: <message>`` on stderr
and exits 1; ``--json`` prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ragpipe.cli.common import JsonOpt, emit_json, fail, out, printable

dataset_app = typer.Typer(
    help="Datasets of adjudicated cases: add drafts, decide with signed records, freeze versions, export suites.",
    no_args_is_help=True,
    add_completion=False,
)
NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The dataset's name.")]


def guarded(action):
    """Run ``action``; the errors bad input can cause become one message and exit code 1."""
    from ragpipe.evaluation.datasets import DatasetError
    from ragpipe.evaluation.suite_rules import SuiteError
    from ragpipe.kernel.ledger import LedgerError
    from ragpipe.release.store import ReleaseError

    try:
        return action()
    except (DatasetError, SuiteError, LedgerError, ReleaseError, OSError) as exc:
        fail(str(exc))


def _home() -> Path:
    from ragpipe.kernel.workspace import default_home

    return default_home()


def _approvers(target: str) -> dict[str, str]:
    """The approvers the dataset's target lists now (``ragpipe/specs/targets.yaml`` or
    ``$RAGPIPE_TARGETS``)."""
    from ragpipe.release.targets import load_targets

    name, spec = load_targets().get(target)
    return dict(spec.approvers)


def _emit(as_json: bool, data: dict[str, Any], line: str) -> None:
    if as_json:
        emit_json(data)
    else:
        out.print(line, soft_wrap=True)


@dataset_app.command("create")
def dataset_create(
    name: NameArg,
    target: Annotated[str, typer.Option("--target", "-t", help="The release target whose approvers decide.")],
    split: Annotated[list[str], typer.Option("--split", help="NAME=FRACTION (repeatable; fractions sum to 1).")],
    as_json: JsonOpt = False,
) -> None:
    """Create a dataset: who decides (a target's approvers) and how its cases split, by case ID."""
    from ragpipe.evaluation.datasets import DatasetError, create_dataset
    from ragpipe.release.targets import load_targets

    def run():
        fractions: dict[str, float] = {}
        for item in split:
            split_name, sep, fraction = item.partition("=")
            try:
                value = float(fraction) if sep else None
            except ValueError:
                value = None
            if value is None or split_name in fractions:
                raise DatasetError(f"--split {item!r}: NAME=FRACTION, each name once (e.g. --split dev=0.5)")
            fractions[split_name] = value
        load_targets().get(target)  # the target must exist
        return create_dataset(_home(), name, target, fractions)

    state = guarded(run)
    data = {"dataset": name, "target": state.target, "splits": dict(state.splits)}
    listed = ", ".join(f"{s} {f:g}" for s, f in state.splits)
    _emit(as_json, data, f"dataset {escape(name)} created: decided by {escape(state.target)}'s approvers; {listed}")


@dataset_app.command("add")
def dataset_add(
    name: NameArg,
    suite: Annotated[Path, typer.Argument(help="Native suite file of cases to put up for adjudication.")],
    as_json: JsonOpt = False,
) -> None:
    """Put a suite file's cases up for adjudication (all or none)."""
    from ragpipe.evaluation.datasets import add_cases
    from ragpipe.evaluation.suite_load import load_suite

    added = guarded(lambda: add_cases(_home(), name, load_suite(suite).cases))
    _emit(as_json, {"dataset": name, "added": added}, f"{added} cases added to {escape(name)}, pending adjudication")


def _draft(
    name: str,
    bundle: Path | None,
    revision: str | None,
    spec_file: Path | None,
    chunks: int | None,
    documents: list[str],
    seed: int,
    level: str,
    budget_micros: int | None,
    out_path: Path | None,
) -> dict[str, Any]:
    """Draft, validate, audit against the dataset and add (``dataset draft``); the JSON result."""
    from ragpipe.bundle.verify import open_bundle
    from ragpipe.cli.common import bundle_path
    from ragpipe.evaluation.datasets import add_cases, read_dataset
    from ragpipe.evaluation.draft_spec import load_draft_spec
    from ragpipe.evaluation.drafting import bundle_corpus, draft_chunks, exclude_against, validate_drafts
    from ragpipe.evaluation.suite import Case, Suite, write_suite
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.spec import load_pipeline_spec
    from ragpipe.work.policy import ExecutionPolicy
    from ragpipe.work.usage import load_prices

    if chunks is not None and documents:
        raise ValueError("give at most one of --chunks N and --documents ID")
    # the disclosure policy a build sends generated-representation requests under
    spec = load_draft_spec(spec_file, load_pipeline_spec().disclosure)
    state, _ = read_dataset(_home(), name)  # the dataset must exist before anything is sent
    opened = open_bundle(bundle_path(bundle, revision))
    corpus = bundle_corpus(opened.tables)
    chosen = corpus.select(chunks, seed, documents)
    run = draft_chunks(
        spec,
        chosen,
        Workspace(_home()).draft_cache,
        # the budget through the policy: the runner then refuses a model without a price
        ExecutionPolicy(budget_micros=budget_micros),
        load_prices(),
        target_level=level,  # type: ignore[arg-type]
    )
    valid, excluded = validate_drafts(run.drafts, corpus.document_ids, corpus.chunk_ids)
    existing = [Case(**e.case) for e in state.cases.values() if e.status != "rejected"]
    splits = {c.id: state.split(c.id) for c in [*existing, *valid]}
    kept, left_out, _ = exclude_against(valid, existing, splits)
    excluded += left_out
    added = add_cases(_home(), name, kept) if kept else 0
    if out_path is not None and kept:
        write_suite(Suite.of(kept, f"draft:{name}"), out_path)
    usage = run.report.usage if run.report is not None else None
    return {
        "dataset": name,
        "bundle_id": opened.bundle_id,
        "spec_id": spec.spec_id,
        "chunks": len(chosen),
        "outcomes": run.counts(),
        "cache_hits": run.report.cache_hits if run.report is not None else 0,
        "failures": [
            {"chunk_id": o.chunk_id, "status": o.status, "kind": o.kind, "message": o.message}
            for o in run.outcomes
            if o.status != "drafted"
        ],
        "drafts": len(run.drafts),
        "added": added,
        "case_ids": [c.id for c in kept],
        "excluded": [{"case_id": e.case_id, "reason": e.reason, "message": e.message} for e in excluded],
        "cost_micros": usage.cost_micros if usage is not None else 0,
        "out": str(out_path) if out_path is not None and kept else None,
    }


@dataset_app.command("draft")
def dataset_draft(
    name: NameArg,
    bundle: Annotated[Path | None, typer.Option("--bundle", "-b", help="Bundle directory.")] = None,
    revision: Annotated[
        str | None, typer.Option("--revision", "-r", help="Use the bundle last built for this revision.")
    ] = None,
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Case-draft spec (default: ragpipe/specs/case_draft.yaml).")
    ] = None,
    chunks: Annotated[
        int | None, typer.Option("--chunks", min=1, help="Draft from N chunks drawn with --seed (default: all).")
    ] = None,
    documents: Annotated[
        list[str] | None, typer.Option("--documents", help="Draft from every chunk of this document (repeatable).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the --chunks draw.")] = 0,
    level: Annotated[str, typer.Option("--level", help="Target level of the drafts: document or chunk.")] = "document",
    budget_micros: Annotated[
        int | None, typer.Option("--budget-micros", min=0, help="Stop before spending more (micro-dollars).")
    ] = None,
    out_path: Annotated[Path | None, typer.Option("--out", help="Also write the added drafts as a suite file.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask a model for cases from a bundle's chunks; add the valid ones as provisional drafts."""
    from ragpipe.work.failures import BudgetExhausted, BudgetUnenforceable

    def run():
        try:
            if level not in ("document", "chunk"):
                raise ValueError(f"--level must be document or chunk, not {level!r}")
            return _draft(name, bundle, revision, spec, chunks, documents or [], seed, level, budget_micros, out_path)
        except (BudgetExhausted, BudgetUnenforceable, ValueError) as exc:  # a spec, a bundle, an option
            fail(str(exc))

    data = guarded(run)
    if as_json:
        emit_json(data)
    else:
        _print_drafted(name, data)
    failed = data["outcomes"].get("provider", 0)
    if failed:  # the model could not be reached for some chunks: not a success, though drafts were kept
        fail(
            f"{failed} of {data['chunks']} chunks failed at the provider (what was drafted is cached and added): "
            "run the same command again to draft the rest"
        )


def _print_drafted(name: str, data: dict[str, Any]) -> None:
    counts = ", ".join(f"{n} {s}" for s, n in data["outcomes"].items())
    out.print(f"{data['chunks']} chunks: {counts} ({data['cache_hits']} from the cache)", soft_wrap=True)
    for f in data["failures"]:
        out.print(f"  {f['status']} {printable(f['chunk_id'])}: {printable(f['message'] or '')}", highlight=False)
    out.print(
        f"{data['added']} drafts added to {escape(name)}, pending adjudication (provisional); "
        f"{len(data['excluded'])} excluded; cost {data['cost_micros']} micros",
        soft_wrap=True,
    )
    for e in data["excluded"]:
        out.print(f"  excluded {printable(e['case_id'])} ({e['reason']}): {printable(e['message'])}", highlight=False)


def _summary(name: str) -> dict[str, Any]:
    from ragpipe.evaluation.datasets import read_dataset, unverified

    state, _ = read_dataset(_home(), name)
    revoked = unverified(state, _approvers(state.target))
    cases = [
        {
            "id": case_id,
            # an accepted case whose decision no longer verifies (its key left the target) is not in a version
            "status": "unverified" if case_id in revoked else entry.status,
            **({"why": revoked[case_id]} if case_id in revoked else {}),
            "split": state.split(case_id),
            "query": entry.case["query"],
            "provisional": entry.case.get("review") == "provisional",
            "decision": None if entry.decision is None else entry.decision_seq,
        }
        for case_id, entry in sorted(state.cases.items())
    ]
    counts = {s: sum(c["status"] == s for c in cases) for s in ("pending", "accepted", "rejected", "unverified")}
    versions = [{"number": n, "version_id": v} for n, v in state.versions]
    return {"dataset": name, "target": state.target, "counts": counts, "cases": cases, "versions": versions}


@dataset_app.command("show")
def dataset_show(name: NameArg, as_json: JsonOpt = False) -> None:
    """Each case's status and split, and the versions."""
    data = guarded(lambda: _summary(name))
    if as_json:
        emit_json(data)
        return
    counts = data["counts"]
    out.print(
        f"{escape(name)}: {counts['pending']} pending, {counts['accepted']} accepted, {counts['rejected']} rejected"
        + (f", {counts['unverified']} unverified (decide on them again)" if counts["unverified"] else ""),
        soft_wrap=True,
    )
    for case in data["cases"]:
        mark = " (provisional draft)" if case["provisional"] else ""
        out.print(
            f"  {case['status']:<10} {printable(case['split']):<12} {printable(case['id'])}  {printable(case['query'])}{mark}",
            soft_wrap=True,
            highlight=False,
        )
    for version in data["versions"]:
        out.print(f"  version {version['number']}: {version['version_id']}", soft_wrap=True)


@dataset_app.command("audit")
def dataset_audit(name: NameArg, as_json: JsonOpt = False) -> None:
    """Duplicate and near-duplicate questions, and leakage between splits, among the cases not rejected."""
    from ragpipe.evaluation.audit import audit_cases
    from ragpipe.evaluation.datasets import read_dataset
    from ragpipe.evaluation.suite import Case

    def run():
        state, _ = read_dataset(_home(), name)
        live = {i: e for i, e in state.cases.items() if e.status != "rejected"}
        splits = {i: state.split(i) for i in live}
        return audit_cases((Case(**e.case) for e in live.values()), splits)

    report = guarded(run)
    if as_json:
        emit_json({"dataset": name, "audit_id": report.id, **report.model_dump(mode="json")})
        return
    out.print(
        f"{report.cases} cases: {len(report.duplicates)} duplicate groups, {len(report.near_duplicates)} near-duplicate "
        f"pairs, {len(report.leakage)} leaks between splits, {len(report.shared_sources)} sources in several splits",
        soft_wrap=True,
    )
    for leak in report.leakage:
        out.print(
            f"  leak ({leak.kind}): {printable(leak.a)} ({leak.splits[0]}) ~ {printable(leak.b)} ({leak.splits[1]})",
            highlight=False,
        )


def _edits(items: list[str]) -> dict[str, Any]:
    from ragpipe.evaluation.datasets import DatasetError

    edited: dict[str, Any] = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or field in edited:
            raise DatasetError(f"--edit {item!r}: FIELD=JSON, each field once (e.g. --edit 'tags=[\"cardio\"]')")
        try:
            edited[field] = json.loads(value)
        except (ValueError, RecursionError):
            raise DatasetError(f"--edit {field}: the value is not JSON (a string needs quotes: '\"text\"')") from None
    return edited


@dataset_app.command("adjudicate")
def dataset_adjudicate(
    name: NameArg,
    case_id: Annotated[str, typer.Argument(metavar="CASE_ID", help="The case decided on.")],
    by: Annotated[str, typer.Option("--by", help="The approver, as the target's approvers list names them.")],
    key: Annotated[Path, typer.Option("--key", help="The approver's private key file.")],
    accept: Annotated[bool, typer.Option("--accept", help="Accept the case as it is.")] = False,
    reject: Annotated[
        bool, typer.Option("--reject", help="Reject the case: in no version unless decided again.")
    ] = False,
    edit: Annotated[
        list[str] | None, typer.Option("--edit", help="FIELD=JSON: accept with this change (repeatable).")
    ] = None,
    note: Annotated[str, typer.Option("--note", help="Free text recorded with the decision.")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Decide on one case (accept, edit or reject), signed with the approver's key."""
    from ragpipe.evaluation.datasets import DatasetError, adjudicate, read_dataset
    from ragpipe.release.targets import approver_key, load_targets

    def run():
        chosen = [d for d, on in (("accept", accept), ("reject", reject), ("edit", bool(edit))) if on]
        if len(chosen) != 1:
            raise DatasetError("give exactly one of --accept, --reject, --edit FIELD=JSON")
        state, _ = read_dataset(_home(), name)
        target, spec = load_targets().get(state.target)
        signing_key = approver_key(spec, target, by, key)
        return adjudicate(
            _home(),
            name,
            case_id,
            chosen[0],  # type: ignore[arg-type]
            by=by,
            key=signing_key,
            approvers=dict(spec.approvers),
            edited=_edits(edit or []),
            note=note,
        )

    record = guarded(run)
    p = record.payload
    data = {
        "dataset": name,
        "case_id": case_id,
        "decision": p["decision"],
        "by": by,
        "at": p["at"],
        "record": record.seq,
    }
    _emit(as_json, data, f"{p['decision']} {printable(case_id)} by {escape(by)} (record {record.seq})")


@dataset_app.command("freeze")
def dataset_freeze(name: NameArg, as_json: JsonOpt = False) -> None:
    """Register the next version: the accepted cases with their splits, every signature checked."""
    from ragpipe.evaluation.datasets import freeze, read_dataset

    def run():
        state, _ = read_dataset(_home(), name)
        return freeze(_home(), name, _approvers(state.target))

    version = guarded(run)
    counts: dict[str, int] = {}
    for split in version.splits.values():
        counts[split] = counts.get(split, 0) + 1
    data = {
        "dataset": name,
        "version": version.number,
        "version_id": version.id,
        "cases": len(version.cases),
        "splits": counts,
    }
    listed = ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))
    _emit(as_json, data, f"{escape(name)} version {version.number}: {len(version.cases)} cases ({listed}) {version.id}")


@dataset_app.command("export")
def dataset_export(
    reference: Annotated[
        str, typer.Argument(metavar="NAME[@N][:SPLIT]", help="A version (default: the latest) and split.")
    ],
    out_path: Annotated[Path, typer.Option("--out", help="Native suite file to write.")],
    as_json: JsonOpt = False,
) -> None:
    """Write a version's cases (one split's, or all) as a suite file for ``ragpipe eval --suite``."""
    from ragpipe.evaluation.datasets import load_version, parse_reference, read_dataset
    from ragpipe.evaluation.suite import write_suite

    def run():
        name, number, split = parse_reference(reference)
        state, _ = read_dataset(_home(), name)
        version = load_version(_home(), name, number, _approvers(state.target))
        suite = version.suite(split)
        write_suite(suite, out_path)
        return version, suite

    version, suite = guarded(run)
    data = {
        "dataset": version.name,
        "version": version.number,
        "version_id": version.id,
        "cases": len(suite.cases),
        "suite_digest": suite.digest,
        "out": str(out_path),
    }
    _emit(as_json, data, f"{len(suite.cases)} cases → {escape(str(out_path))} (digest {suite.digest})")
