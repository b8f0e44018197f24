"""Builders of ``ArmRun`` inputs for the experiment tests (pairing, comparison, decision)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ragpipe.experiment.arms import ArmRun, CellOutcome, Coordinates, MetricDecl, Variant

METRICS = (
    MetricDecl(name="ndcg@10", direction="higher", unit="ratio", k=10),
    MetricDecl(name="recall@100", direction="higher", unit="ratio", k=100),
    MetricDecl(name="unauthorized_disclosures", direction="lower", unit="count", aggregate="sum"),
)


def coordinates(repeats: int = 1, **changes: object) -> Coordinates:
    base = dict(
        suite_digest="sha256:" + "1" * 64,
        evaluator="ragpipe.evaluation.runner/v1",
        mode="hybrid",
        scopes=("public",),
        k=1000,
        repeats=repeats,
        answers=False,
        metrics=METRICS,
    )
    return Coordinates(**{**base, **changes})


def arm(
    run_id: str,
    values: Mapping[str, float],
    *,
    label: str = "a",
    repeats: int = 1,
    tags: Mapping[str, tuple[str, ...]] | None = None,
    failed: Mapping[tuple[str, int], str] | None = None,
    latency: float = 10.0,
    disclosures: Mapping[str, int] | None = None,
    recall: Callable[[str, float], float] | None = None,
    skipped: Mapping[str, str] | None = None,
    coords: Coordinates | None = None,
    provisional: tuple[str, ...] = (),
) -> ArmRun:
    """An arm whose case ``c`` scores ``values[c]`` nDCG@10 on every repeat (recall = ``recall(c, v)``,
    default ``v``), no disclosure unless ``disclosures[c]``; ``failed[(c, r)]`` fails that cell;
    ``provisional``: the suite's cases not yet adjudicated."""
    cells = []
    for case, value in sorted(values.items()):
        for r in range(repeats):
            fail = (failed or {}).get((case, r))
            if fail is not None:
                cells.append(
                    CellOutcome(
                        case_id=case,
                        repeat=r,
                        outcome="cancelled" if fail == "cancelled" else "failure",
                        failure_class=fail,
                    )
                )
                continue
            metrics = {
                "ndcg@10": value,
                "recall@100": recall(case, value) if recall else value,
                "unauthorized_disclosures": float((disclosures or {}).get(case, 0)),
            }
            cells.append(CellOutcome(case_id=case, repeat=r, outcome="success", metrics=metrics, latency_ms=latency))
    return ArmRun(
        run_id=run_id,
        spec_id="sha256:" + run_id[-1] * 64 if run_id[-1] in "0123456789abcdef" else "sha256:" + "e" * 64,
        ledger_head="sha256:" + "f" * 64,
        coordinates=coords or coordinates(repeats),
        variant=Variant(bundle_id="sha256:" + "b" * 64, plan_id="sha256:" + "c" * 64, arm=label),
        expected=tuple((c, r) for c in sorted(values) for r in range(repeats)),
        cells=tuple(cells),
        skipped=dict(skipped or {}),
        tags={c: t for c, t in (tags or {}).items()},
        provisional=provisional,
    )


def policy_doc(**phases: object) -> dict:
    """A policy document over the test metrics; ``phases`` replace whole top-level entries."""
    doc = {
        "schema": "ragpipe.gate_policy/v1",
        "human_apply_required": True,
        "hard": {
            "unauthorized_disclosures": {"max": 0},
            "answer_contract_valid_rate": {"min": 0.99, "if_measured": True},
        },
        "coverage": {"max_failed_rate": 0.0, "min_cases": 10},
        "target": {"metric": "ndcg@10", "min_improvement": 0.01, "evidence": "ci_lower", "alpha": 0.05},
        "regression": {"overall": {"recall@100": 0.02}, "tags": {}},
        "cost": {"max_p95_latency_ratio": 1.5, "latency_slack_ms": 5.0, "max_p95_latency_ms": None},
        "bootstrap_floors": {"ndcg@10": 0.3, "recall@100": 0.3},
    }
    doc.update(phases)
    return doc


def policy(**phases: object):
    from ragpipe.experiment.gate_policy import parse_policy

    return parse_policy(policy_doc(**phases), "test-policy.yaml")
