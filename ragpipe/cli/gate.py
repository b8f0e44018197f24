"""``ragpipe compare`` and ``ragpipe gate`` (typer commands, registered on the root app).

    ragpipe compare RUN_INCUMBENT RUN_CHALLENGER --out COMPARISON.json [--seed N] [--resamples N] [--confidence C] [--json]
    ragpipe gate COMPARISON.json [--policy POLICY.yaml] [--out DECISION.json] [--json]
    ragpipe gate RUN_DIR [--policy …]          # bootstrap: no incumbent, the policy's absolute floors

Exit codes: 0 on success (``gate``: the release is eligible), 3 when ``gate`` decides *not
eligible* (the decision is still printed and written), 1 on any error (``error: <message>`` on
stderr; nothing is written). ``--json`` prints exactly one JSON object on stdout: the comparison
file's object plus ``out``, or the decision object.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ragpipe.cli.common import JsonOpt, emit_json, fail, out

NOT_ELIGIBLE = 3


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:+.4f}" if abs(value) < 1000 else f"{value:.1f}"


def compare(
    incumbent: Annotated[Path, typer.Argument(help="Run folder of the incumbent (what serves now).")],
    challenger: Annotated[Path, typer.Argument(help="Run folder of the challenger (the candidate).")],
    out_path: Annotated[Path, typer.Option("--out", help="Comparison file to write (never overwritten).")],
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap and randomization test.")] = 20240610,
    resamples: Annotated[int, typer.Option("--resamples", help="Resamples of each statistic.")] = 9999,
    confidence: Annotated[float, typer.Option("--confidence", help="Confidence level of the paired interval.")] = 0.95,
    as_json: JsonOpt = False,
) -> None:
    """Pair two completed evaluation runs exactly by (case, repeat) and compare them."""
    from pydantic import ValidationError

    from ragpipe.experiment.arm_source import load_arm
    from ragpipe.experiment.comparison import compare as compare_runs
    from ragpipe.experiment.comparison import write_comparison
    from ragpipe.experiment.pairing import pair
    from ragpipe.experiment.statistics import ComparisonSpec

    try:
        spec = ComparisonSpec(seed=seed, n_resamples=resamples, confidence_level=confidence)
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"invalid comparison setting {first['loc'][0]}: {first['msg']}")
    try:
        comparison = compare_runs(pair(load_arm(incumbent), load_arm(challenger)), spec)
        write_comparison(comparison, out_path)
    except (ValueError, ArithmeticError, OSError) as exc:
        fail(str(exc))
    if as_json:
        emit_json({**comparison.as_json(), "out": str(out_path)})
        return
    table = Table(
        title=f"challenger {comparison.certificate.challenger.run_id} vs incumbent {comparison.certificate.incumbent.run_id} (all cases)"
    )
    for col in ("metric", "mean Δ", f"{confidence:g} CI", "p (greater)", "W/T/L", "scored/failed/unmeasured"):
        table.add_column(col)
    for name, m in comparison.slices["all"].metrics.items():
        s = m.stats
        table.add_row(
            name,
            _fmt(s.mean),
            f"[{_fmt(s.ci_low)}, {_fmt(s.ci_high)}]",
            "—" if s.p_value is None else f"{s.p_value:.4f}",
            f"{s.wins}/{s.ties}/{s.losses}",
            f"{m.scored}/{m.failed}/{m.unmeasured}",
        )
    out.print(table)
    out.print(f"{len(comparison.certificate.cells)} paired cells · slices: {', '.join(comparison.slices)}")
    out.print(f"comparison {comparison.comparison_id} → {escape(str(out_path))}", highlight=False)


def _decide(target: Path, policy_path: Path | None):
    from ragpipe.experiment.arm_source import load_arm
    from ragpipe.experiment.comparison import load_comparison
    from ragpipe.experiment.decision import decide
    from ragpipe.experiment.gate_policy import load_policy

    policy = load_policy(policy_path)
    if target.is_dir():
        return decide(policy, None, load_arm(target))
    return decide(policy, load_comparison(target))


def gate(
    target: Annotated[
        Path, typer.Argument(help="A comparison file, or a run folder for a bootstrap decision (no incumbent).")
    ],
    policy: Annotated[
        Path | None, typer.Option("--policy", help="Gate policy (default: ragpipe/specs/gate_policy.yaml).")
    ] = None,
    out_path: Annotated[Path | None, typer.Option("--out", help="Also write the decision object to this file.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Decide, under an ordered gate policy, whether the challenger is eligible (exit 0) or not (exit 3)."""
    from ragpipe.kernel.publish import write_file_atomic

    try:
        decision = _decide(target, policy)
        body = decision.as_json()
        if out_path is not None:
            write_file_atomic(out_path, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    except (ValueError, OSError) as exc:
        fail(str(exc))
    if as_json:
        emit_json(body)
    else:
        table = Table(title=f"gate decision {decision.decision_id}")
        for col in ("phase", "check", "on", "value", "rule", "verdict"):
            table.add_column(col)
        for c in decision.checks:
            on = " ".join(x for x in (c.metric, c.slice, c.arm) if x)
            value = "—" if c.value is None else f"{c.value:.6g}"
            style = {"pass": "green", "fail": "bold red", "skipped": "yellow", "advisory": "magenta"}[c.verdict]
            table.add_row(c.phase, c.name, on, value, f"{c.op} {c.threshold:.6g}", f"[{style}]{c.verdict}[/]")
        out.print(table)
        verdict = (
            "eligible (a person applies it)"
            if decision.eligible
            else f"NOT eligible — decisive phase: {decision.decisive_phase}"
        )
        out.print(f"{decision.mode} decision: {verdict}", highlight=False)
        for reason in decision.reasons:
            out.print(f"  - {escape(reason)}", highlight=False)
    if not decision.eligible:
        raise typer.Exit(NOT_ELIGIBLE)
