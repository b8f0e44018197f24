"""``ragpipe candidate new|validate|run`` and ``ragpipe tune`` (registered on the root app).

    ragpipe candidate new --parent REVISION|CAND_DIR --suite SUITE --set ASSET.PATH=VALUE … --out CAND_DIR [--json]
    ragpipe candidate validate CAND_DIR [--json]
    ragpipe candidate run CAND_DIR [--suite SUITE] [--json]
    ragpipe tune --parent REVISION --suite SUITE --space SPACE.yaml [--out DIR] [--json]

Exit codes: 0 on success (``candidate run``: the challenger is eligible), 3 when ``candidate
run`` decides *not eligible* (the result is still printed and written), 1 on any error
(``error: <message>`` on stderr). ``--json`` prints exactly one JSON object on stdout.

A build-side candidate's bundle is built by ``ragpipe build`` in a child process with
``RAGPIPE_PIPELINE_SPEC`` set to the candidate's ``pipeline.yaml`` and ``--launch in-process``:
the code location reads the spec from its environment, so a daemon's code server (loaded with
another spec) must not run it, and Dagster caches the loaded ``definitions`` module per process,
so a second build-side candidate in one process would otherwise run the first one's definitions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ragpipe.cli.common import JsonOpt, emit_json, err, fail, out

NOT_ELIGIBLE = 3
candidate_app = typer.Typer(
    help="Candidates: one changed asset of a snapshot, validated, run and gated.",
    no_args_is_help=True,
    add_completion=False,
)
SuiteOpt = Annotated[
    Path, typer.Option("--suite", help="Native suite file or BEIR folder (locked into the candidate).")
]
SplitOpt = Annotated[list[str] | None, typer.Option("--split", help="BEIR qrels split(s) (repeatable; default: test).")]
AllowTestOpt = Annotated[
    bool,
    typer.Option(
        "--allow-test-split", help="Tune on a suite with test-split cases anyway (recorded in the candidate)."
    ),
]
PipelineOpt = Annotated[
    Path | None,
    typer.Option(
        "--pipeline", help="The parent's pipeline spec (default: $RAGPIPE_PIPELINE_SPEC or the checked-in one)."
    ),
]
PlanOpt = Annotated[
    Path | None, typer.Option("--plan", help="The parent's query plan (default: ragpipe/specs/query_plan.yaml).")
]
PolicyOpt = Annotated[
    Path | None, typer.Option("--policy", help="Gate policy (default: ragpipe/specs/gate_policy.yaml).")
]
ModeOpt = Annotated[str, typer.Option("--mode", help="Evaluation mode: hybrid, lexical or vector (locked).")]
KOpt = Annotated[int, typer.Option("--k", help="Hits retrieved per case (locked).")]


def guarded(action):
    """Run ``action``; expected errors become ``error: <message>`` and exit code 1."""
    try:
        return action()
    except (
        ValueError,
        OSError,
        RuntimeError,
    ) as exc:  # CandidateError, RunError, PairingError, GateError, BuildFailed …
        fail(str(exc))


def build_in_child(revision: str, pipeline: Path):
    """The ``Build`` of ``candidate_run``: ``ragpipe build`` of ``revision`` in a child process
    whose ``RAGPIPE_PIPELINE_SPEC`` is ``pipeline`` (module docstring says why a child)."""
    from ragpipe.candidates.run import BuiltBundle
    from ragpipe.corpus.registry import load_revision
    from ragpipe.kernel.workspace import Workspace, default_home

    record = load_revision(Workspace(default_home()).registry, revision)
    env = {**os.environ, "RAGPIPE_PIPELINE_SPEC": str(Path(pipeline).resolve()), "RAGPIPE_HOME": str(default_home())}
    cmd = [
        sys.executable,
        "-P",  # not the working directory first on sys.path: a ``ragpipe/`` folder there (a home) would shadow the package
        "-m",
        "ragpipe.cli",
        "build",
        record.source_path,
        "--revision",
        revision,
        "--format",
        record.format,
        *(["--default-scope", record.default_scope] if record.default_scope is not None else []),
        "--launch",
        "in-process",
        "--json",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(
            f"build of revision {revision!r} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
        )
    s = json.loads(done.stdout.strip().splitlines()[-1])
    return BuiltBundle(
        revision=s["revision"],
        bundle_id=s["bundle_id"],
        bundle_path=Path(s["bundle_path"]),
        embedded=int(s["embedded"]),
        cache_hits=int(s["cache_hits"]),
        up_to_date=bool(s["up_to_date"]),
        dagster_run_id=s["run_id"],
        generation=s.get("generation"),
    )


def _settings(mode: str, k: int, allow_test_split: bool = False):
    from pydantic import ValidationError

    from ragpipe.candidates.asset_ids import EvaluatorSettings

    try:
        return EvaluatorSettings(mode=mode, k=k, test_split_allowed=allow_test_split)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"invalid evaluation setting --{first['loc'][0]}: {first['msg']}") from None


def resolve_parent(
    parent: str,
    suite: Path,
    split: list[str] | None,
    pipeline: Path | None,
    plan: Path | None,
    policy: Path | None,
    mode: str,
    k: int,
    allow_test_split: bool = False,
):
    """``--parent``: a candidate folder (its candidate becomes the parent) or a built revision."""
    from ragpipe.candidates.create import parent_from_candidate, parent_from_revision
    from ragpipe.candidates.folder import RECORD, validate_candidate
    from ragpipe.evaluation.suite_load import load_suite
    from ragpipe.experiment.gate_policy import DEFAULT_POLICY_PATH
    from ragpipe.kernel.workspace import Workspace, default_home
    from ragpipe.retrieval.plan import DEFAULT_PLAN_PATH
    from ragpipe.spec import pipeline_spec_path

    if (Path(parent) / RECORD).is_file():
        candidate = validate_candidate(Path(parent))
        if suite is not None and load_suite(suite, split=split or ["test"]).digest != candidate.suite.digest:
            raise ValueError(f"--suite {suite}: not the parent candidate's locked suite {candidate.suite.digest}")
        return parent_from_candidate(candidate)
    if suite is None:
        raise ValueError("give --suite SUITE: a candidate locks the suite it is evaluated on")
    pipeline = pipeline or pipeline_spec_path()
    return parent_from_revision(
        Workspace(default_home()),
        parent,
        pipeline,
        plan or DEFAULT_PLAN_PATH,
        load_suite(suite, split=split or ["test"]),
        policy or DEFAULT_POLICY_PATH,
        _settings(mode, k, allow_test_split),
    )


def describe(candidate) -> dict[str, Any]:
    r = candidate.record
    return {
        "valid": True,
        "folder": str(candidate.folder),
        "candidate_id": r.candidate_id,
        "asset": r.change.asset,
        "edits": list(r.change.edits),
        "old_id": r.change.old_id,
        "new_id": r.change.new_id,
        "parent_snapshot_id": r.parent.snapshot_id,
        "parent_revision": r.parent.revision,
        "snapshot_id": candidate.snapshot.snapshot_id,
        "build_revision": r.build_revision,
        "suite_digest": candidate.suite.digest,
    }


def _print_candidate(data: dict[str, Any]) -> None:
    out.print(
        f"candidate {data['candidate_id']} · {data['asset']}: {escape(', '.join(data['edits']))}", highlight=False
    )
    out.print(
        f"  parent snapshot {data['parent_snapshot_id']} (revision {escape(data['parent_revision'])}) → {data['snapshot_id']}",
        highlight=False,
    )
    out.print(
        f"  challenger bundle from revision {escape(data['build_revision'])} · {escape(data['folder'])}",
        highlight=False,
    )


@candidate_app.command("new")
def candidate_new(
    parent: Annotated[str, typer.Option("--parent", help="A built revision key, or an earlier candidate folder.")],
    sets: Annotated[
        list[str],
        typer.Option(
            "--set",
            help="ASSET.PATH=VALUE (YAML value), e.g. query_plan.channels.vector.weight=0.7; repeatable within one asset.",
        ),
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="Candidate folder to create (never replaced).")],
    suite: Annotated[
        Path | None,
        typer.Option("--suite", help="Native suite file or BEIR folder (locked; required with a revision parent)."),
    ] = None,
    split: SplitOpt = None,
    allow_test_split: AllowTestOpt = False,
    pipeline: PipelineOpt = None,
    plan: PlanOpt = None,
    policy: PolicyOpt = None,
    mode: ModeOpt = "hybrid",
    k: KOpt = 1000,
    as_json: JsonOpt = False,
) -> None:
    """Make a candidate: a copy of the parent's specs with one asset edited."""
    from ragpipe.candidates.create import new_candidate

    data = guarded(
        lambda: describe(
            new_candidate(
                resolve_parent(parent, suite, split, pipeline, plan, policy, mode, k, allow_test_split), sets, out_dir
            )
        )
    )
    emit_json(data) if as_json else _print_candidate(data)


@candidate_app.command("validate")
def candidate_validate(
    folder: Annotated[Path, typer.Argument(help="Candidate folder.")], as_json: JsonOpt = False
) -> None:
    """Check a candidate folder: files, digests, exactly one changed unlocked asset, IDs."""
    from ragpipe.candidates.folder import validate_candidate

    data = guarded(lambda: describe(validate_candidate(folder)))
    emit_json(data) if as_json else _print_candidate(data)


@candidate_app.command("run")
def candidate_run(
    folder: Annotated[Path, typer.Argument(help="Candidate folder.")],
    suite: Annotated[
        Path | None, typer.Option("--suite", help="Must be the candidate's locked suite (default: it).")
    ] = None,
    split: SplitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate incumbent (parent) and challenger (candidate) on the locked suite, pair, compare and gate."""
    from ragpipe.candidates.folder import validate_candidate
    from ragpipe.candidates.run import run_candidate
    from ragpipe.evaluation.suite_load import load_suite
    from ragpipe.kernel.workspace import Workspace, default_home

    def run():
        candidate = validate_candidate(folder)
        if suite is not None:
            digest = load_suite(suite, split=split or ["test"]).digest
            if digest != candidate.suite.digest:
                raise ValueError(
                    f"--suite {suite}: digest {digest} differs from the candidate's locked suite {candidate.suite.digest}"
                )
        return run_candidate(Workspace(default_home()), candidate, build_in_child).as_json()

    data = guarded(run)
    if as_json:
        emit_json(data)
    else:
        t = data["target"]
        ci = "—" if t["ci_low"] is None else f"[{t['ci_low']:+.4f}, {t['ci_high']:+.4f}]"
        out.print(
            f"candidate {data['candidate_id']}: {t['metric']} Δ {t['mean']:+.4f} {ci} over {t['n']} cases, W/T/L {t['wins']}/{t['ties']}/{t['losses']}",
            highlight=False,
        )
        verdict = (
            "eligible (a person applies it)"
            if data["eligible"]
            else f"NOT eligible — decisive phase: {data['decisive_phase']}"
        )
        out.print(f"decision {data['decision_id']}: {verdict}", highlight=False)
        for reason in data["reasons"]:
            out.print(f"  - {escape(reason)}", highlight=False)
        out.print(f"comparison {data['comparison_id']} · {escape(data['out'])}", highlight=False)
    if not data["eligible"]:
        raise typer.Exit(NOT_ELIGIBLE)


def tune(
    parent: Annotated[str, typer.Option("--parent", help="A built revision key.")],
    suite: SuiteOpt,
    space: Annotated[Path, typer.Option("--space", help="Tune space file (e.g. ragpipe/specs/tune_space.yaml).")],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Tune folder to create (default: $RAGPIPE_HOME/tune/<run ID>).")
    ] = None,
    split: SplitOpt = None,
    allow_test_split: AllowTestOpt = False,
    pipeline: PipelineOpt = None,
    plan: PlanOpt = None,
    policy: PolicyOpt = None,
    mode: ModeOpt = "hybrid",
    k: KOpt = 1000,
    as_json: JsonOpt = False,
) -> None:
    """Walk a search space as a chain of one-mutation candidates, each accepted only through the gate."""
    from ragpipe.candidates.tune import load_space
    from ragpipe.candidates.tune import tune as walk
    from ragpipe.evaluation.runner import new_run_id
    from ragpipe.kernel.workspace import Workspace, default_home

    def report(step: dict[str, Any]) -> None:
        if as_json:
            return
        if "accepted" in step and "status" not in step:
            err.print(
                f"accepted {step['accepted']} ({step['dimension']}: {escape(', '.join(step['edits']))})",
                highlight=False,
            )
        elif step["status"] == "skipped":
            err.print(
                f"[yellow]skipped[/] {step['dimension']} #{step['option']}: {escape(step['reason'])}", highlight=False
            )
        else:
            t = step["target"]
            verdict = "eligible" if step["eligible"] else f"not eligible ({step['decisive_phase']})"
            err.print(
                f"{step['dimension']} #{step['option']} {escape(', '.join(step['edits']))}: {t['metric']} Δ {t['mean']:+.4f} → {verdict}",
                highlight=False,
            )

    def run():
        loaded = load_space(space)
        root = resolve_parent(parent, suite, split, pipeline, plan, policy, mode, k, allow_test_split)
        target = out_dir or Workspace(default_home()).tune / new_run_id()
        return walk(Workspace(default_home()), root, loaded, target, build_in_child, on_step=report).as_json()

    data = guarded(run)
    if as_json:
        emit_json(data)
        return
    out.print(
        f"{data['candidates']} candidates, {data['accepted']} accepted in {data['seconds']:.0f} s; "
        f"builds {data['embedding']['builds']}, embedded {data['embedding']['embedded']}, cache hits {data['embedding']['cache_hits']}",
        highlight=False,
    )
    out.print(
        f"chosen: {escape(', '.join(data['chosen']['edits']) or 'the parent (nothing was eligible)')}", highlight=False
    )
    out.print(
        f"  query plan {escape(data['chosen']['query_plan'])} · pipeline {escape(data['chosen']['pipeline'])}",
        highlight=False,
    )
