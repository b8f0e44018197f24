"""Answer-quality aggregates: exact figures, and laws over any mix of outcomes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ragpipe.evaluation.judge import FactCheck, Verdict
from ragpipe.evaluation.judge_metrics import judge_metrics
from ragpipe.evaluation.judge_spec import LABELS
from ragpipe.evaluation.judge_step import FAILURE_STATUSES, JudgeOutcome


def judged(label: str, stated: list[bool], grounded: bool = True) -> JudgeOutcome:
    facts = tuple(FactCheck(index=i + 1, stated=s) for i, s in enumerate(stated))
    verdict = Verdict(label=label, facts=facts, claims=(), grounded=grounded, explanation="")
    return JudgeOutcome("c", "sha256:" + "0" * 64, "judged", len(stated), verdict=verdict)


def failed(status: str) -> JudgeOutcome:
    return JudgeOutcome("c", "sha256:" + "0" * 64, status, 2, kind=status)  # type: ignore[arg-type]


def test_the_figures_of_a_small_run():
    outcomes = [
        judged("3_AUTHORITATIVE", [True, True]),
        judged("0_FAIL", [False, False], grounded=False),
        judged("2_SUBSTANTIAL", [True, False, True, True]),
        judged("1_PARTIAL", []),  # no required facts: not in the recall
        failed("provider"),
        failed("withheld"),
    ]
    m = judge_metrics(outcomes)
    assert (m.attempted, m.judged, m.fact_cases) == (6, 4, 3)
    assert m.distribution == {"0_FAIL": 1, "1_PARTIAL": 1, "2_SUBSTANTIAL": 1, "3_AUTHORITATIVE": 1}
    assert m.mean_label == 1.5 and m.label_fail_rate == 0.25
    assert m.required_fact_recall == (1 + 0 + 0.75) / 3
    assert m.groundedness_rate == 0.75
    assert m.judge_failure_rate == 2 / 6
    assert m.failures == {"provider": 1, "invalid_output": 0, "refused": 0, "withheld": 1}


def test_nothing_judged_shows_every_label_at_zero_and_no_rate():
    m = judge_metrics([])
    assert m.distribution == dict.fromkeys(LABELS, 0) and m.failures == dict.fromkeys(FAILURE_STATUSES, 0)
    assert (m.mean_label, m.label_fail_rate, m.required_fact_recall, m.groundedness_rate, m.judge_failure_rate) == (
        None,
        None,
        None,
        None,
        None,
    )


OUTCOMES = st.lists(
    st.one_of(
        st.builds(judged, st.sampled_from(LABELS), st.lists(st.booleans(), max_size=6), st.booleans()),
        st.builds(failed, st.sampled_from(FAILURE_STATUSES)),
    ),
    max_size=60,
)


@given(OUTCOMES)
def test_the_distribution_recovers_the_counts_and_every_rate_is_a_share(outcomes):
    m = judge_metrics(outcomes)
    labels = [o.verdict.label for o in outcomes if o.status == "judged"]
    assert list(m.distribution) == list(LABELS)
    assert m.distribution == {label: labels.count(label) for label in LABELS}
    assert sum(m.distribution.values()) == m.judged == len(labels)
    assert list(m.failures) == list(FAILURE_STATUSES)
    assert m.failures == {s: sum(o.status == s for o in outcomes) for s in FAILURE_STATUSES}
    assert m.judged + sum(m.failures.values()) == m.attempted == len(outcomes)
    for rate in (m.label_fail_rate, m.required_fact_recall, m.groundedness_rate, m.judge_failure_rate):
        assert rate is None or 0 <= rate <= 1
    assert m.mean_label is None or 0 <= m.mean_label <= 3
    if m.judged:
        # the mean is the distribution's mean: it summarises it, never replaces it
        assert m.mean_label == sum(i * m.distribution[label] for i, label in enumerate(LABELS)) / m.judged
        assert m.label_fail_rate == m.distribution["0_FAIL"] / m.judged
    else:
        assert m.mean_label is None and m.label_fail_rate is None and m.groundedness_rate is None
    assert (m.judge_failure_rate is None) == (not outcomes)
