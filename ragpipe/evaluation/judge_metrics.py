"""Answer-quality aggregates over judge outcomes (pure).

``judge_metrics(outcomes)`` counts what the judge did and summarises its verdicts:

* ``distribution`` — the count of each label, all four always present (``0_FAIL`` …
  ``3_AUTHORITATIVE``); it sums to ``judged``. It is the primary figure: the mean never replaces it;
* ``mean_label`` — the mean label rank (0–3) over judged answers;
* ``label_fail_rate`` — the share of judged answers labelled ``0_FAIL``;
* ``required_fact_recall`` — the mean, over judged answers whose case lists required facts
  (``fact_cases`` of them), of the share of those facts stated;
* ``groundedness_rate`` — the share of judged answers whose every claim has support;
* ``judge_failure_rate`` — failures / attempted, where attempted is every outcome (judged or not:
  a withheld item was asked for and got no label) and failures every outcome that is not judged;
  ``failures`` counts them by kind (``provider``, ``invalid_output``, ``refused``, ``withheld``),
  every kind always present.

A rate whose denominator is zero is None (not measured), never 0. A failure is never a label and
never left out: it is in ``attempted`` and ``failures``, and in no label-based figure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pydantic import Field

from ragpipe.evaluation.judge_spec import LABELS
from ragpipe.evaluation.judge_step import FAILURE_STATUSES, JudgeOutcome
from ragpipe.kernel.models import FrozenModel


class JudgeMetrics(FrozenModel):
    attempted: int = Field(ge=0)
    judged: int = Field(ge=0)
    distribution: dict[str, int]
    mean_label: float | None = Field(ge=0, le=3)
    label_fail_rate: float | None = Field(ge=0, le=1)
    fact_cases: int = Field(ge=0)
    required_fact_recall: float | None = Field(ge=0, le=1)
    groundedness_rate: float | None = Field(ge=0, le=1)
    judge_failure_rate: float | None = Field(ge=0, le=1)
    failures: dict[str, int]


def _ratio(part: float, whole: int) -> float | None:
    return part / whole if whole else None


def judge_metrics(outcomes: Iterable[JudgeOutcome]) -> JudgeMetrics:
    """The aggregates of ``outcomes`` (module docstring)."""
    outcomes = list(outcomes)
    verdicts = [o.verdict for o in outcomes if o.status == "judged" and o.verdict is not None]
    labels = Counter(v.label for v in verdicts)
    with_facts = [v for v in verdicts if v.facts]
    failures = Counter(o.status for o in outcomes if o.status != "judged")
    return JudgeMetrics(
        attempted=len(outcomes),
        judged=len(verdicts),
        distribution={label: labels[label] for label in LABELS},
        mean_label=_ratio(sum(v.score for v in verdicts), len(verdicts)),
        label_fail_rate=_ratio(labels[LABELS[0]], len(verdicts)),
        fact_cases=len(with_facts),
        required_fact_recall=_ratio(sum(v.stated / len(v.facts) for v in with_facts), len(with_facts)),
        groundedness_rate=_ratio(sum(v.grounded for v in verdicts), len(verdicts)),
        judge_failure_rate=_ratio(len(outcomes) - len(verdicts), len(outcomes)),
        failures={kind: failures[kind] for kind in FAILURE_STATUSES},
    )
