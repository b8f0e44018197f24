"""Paired comparison: direction-normalised deltas, seeded statistics, slices, the comparison file."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.experiment.arms import CellOutcome, summarize
from ragpipe.experiment.comparison import ComparisonError, compare, load_comparison, write_comparison
from ragpipe.experiment.pairing import pair
from ragpipe.experiment.statistics import ComparisonSpec, paired_stats
from ragpipe_tests.support.gate_support import arm, coordinates

DELTAS = [0.1, 0.2, -0.1, 0.3, -0.05]


def test_delta_statistics_are_exact_on_a_hand_computed_sample():
    s = paired_stats(DELTAS, ComparisonSpec(), "all", "ndcg@10")
    assert (s.n, s.wins, s.ties, s.losses) == (5, 3, 0, 2)
    assert s.mean == pytest.approx(0.09, abs=1e-15) and (s.median, s.min, s.max) == (0.1, -0.1, 0.3)
    # 2^5 sign flips <= n_resamples: scipy runs the exact randomization test; count it by hand.
    flips = [sum(sign * d for sign, d in zip(signs, DELTAS)) / 5 for signs in itertools.product((1, -1), repeat=5)]
    assert s.p_value == pytest.approx(sum(1 for m in flips if m >= 0.09 - 1e-12) / 32, abs=1e-15)
    assert s.ci_low < s.mean < s.ci_high


def test_statistics_are_seeded_and_depend_on_the_seed():
    rng = random.Random(3)
    deltas = [rng.gauss(0.02, 0.1) for _ in range(60)]
    first, again = (paired_stats(deltas, ComparisonSpec(), "all", "ndcg@10") for _ in range(2))
    assert first == again
    other = paired_stats(deltas, ComparisonSpec(seed=1), "all", "ndcg@10")
    assert (other.ci_low, other.p_value) != (first.ci_low, first.p_value)
    assert other.mean == first.mean


def test_degenerate_samples_have_exact_intervals_or_none():
    same = paired_stats([0.25] * 7, ComparisonSpec(), "all", "m")
    assert (same.ci_low, same.ci_high, same.ties) == (0.25, 0.25, 0)
    zero = paired_stats([0.0] * 7, ComparisonSpec(), "all", "m")
    assert (zero.ci_low, zero.ci_high, zero.p_value, zero.ties) == (0.0, 0.0, 1.0, 7)
    one = paired_stats([0.5], ComparisonSpec(), "all", "m")
    assert (one.n, one.mean, one.ci_low, one.p_value) == (1, 0.5, None, None)
    none = paired_stats([], ComparisonSpec(), "all", "m")
    assert (none.n, none.mean, none.median, none.ci_low, none.p_value) == (0, None, None, None, None)


def test_deltas_are_direction_normalised_and_averaged_over_repeats():
    inc = arm("run-1", {"a": 0.5, "b": 0.5}, repeats=2, disclosures={"a": 2})
    ch = arm("run-2", {"a": 0.5, "b": 0.5}, repeats=2)
    cells = [
        c.model_copy(update={"metrics": {**c.metrics, "ndcg@10": 0.9 if c.key == ("b", 1) else c.metrics["ndcg@10"]}})
        for c in ch.cells
    ]
    c = compare(pair(inc, ch.model_copy(update={"cells": tuple(cells)})))
    ndcg, leaks = c.slices["all"].metrics["ndcg@10"], c.slices["all"].metrics["unauthorized_disclosures"]
    # case b: repeats 0.0 and 0.4 -> 0.2; case a: 0.0
    assert (ndcg.stats.n, ndcg.stats.mean, ndcg.stats.max, ndcg.stats.wins, ndcg.stats.ties) == (
        2,
        pytest.approx(0.1),
        pytest.approx(0.2),
        1,
        1,
    )
    # fewer disclosures is better: the challenger's 0 against 2 is a +2 delta on case a
    assert (leaks.direction, leaks.stats.max, leaks.stats.wins) == ("lower", 2.0, 1)
    assert (
        c.incumbent.aggregates["unauthorized_disclosures"].value == 2.0
    )  # summed over cases (per-case mean over repeats)
    assert c.challenger.aggregates["ndcg@10"].value == pytest.approx((0.5 + 0.7) / 2)


def test_tag_slices_count_their_cases():
    tags = {"a": ("rare",), "b": ("rare", "long"), "c": ()}
    inc, ch = (
        arm("run-1", {"a": 0.1, "b": 0.2, "c": 0.3}, tags=tags),
        arm("run-2", {"a": 0.3, "b": 0.2, "c": 0.1}, tags=tags),
    )
    c = compare(pair(inc, ch))
    assert list(c.slices) == ["all", "tag:long", "tag:rare"]
    assert {k: s.cases for k, s in c.slices.items()} == {"all": 3, "tag:long": 1, "tag:rare": 2}
    assert c.slices["tag:rare"].metrics["ndcg@10"].stats.mean == pytest.approx(0.1)
    assert c.slices["all"].metrics["ndcg@10"].stats.mean == pytest.approx(0.0, abs=1e-15)


def test_a_metric_one_side_lacks_is_unmeasured_not_failed():
    inc, ch = arm("run-1", {"a": 0.1, "b": 0.2}), arm("run-2", {"a": 0.1, "b": 0.2})
    cells = [
        c.model_copy(update={"metrics": {k: v for k, v in c.metrics.items() if k != "recall@100"}})
        if c.case_id == "a"
        else c
        for c in ch.cells
    ]
    m = compare(pair(inc, ch.model_copy(update={"cells": tuple(cells)}))).slices["all"].metrics["recall@100"]
    assert (m.pairs, m.scored, m.failed, m.unmeasured) == (2, 1, 0, 1)


def test_summary_counts_only_fully_completed_cases_and_reports_nearest_rank_p95():
    a = arm("run-1", {f"c{i}": i / 10 for i in range(5)}, repeats=2, failed={("c0", 1): "OSError"})
    cells = tuple(c.model_copy(update={"latency_ms": float(i)}) if c.completed else c for i, c in enumerate(a.cells))
    s = summarize(a.model_copy(update={"cells": cells}))
    assert (s.cells, s.completed, s.failed, s.evaluated_cases) == (10, 9, {"OSError": 1}, 4)
    assert s.aggregates["ndcg@10"].n == 4 and s.aggregates["ndcg@10"].value == pytest.approx(0.25)
    assert (s.latency_p95_ms, s.latency_n) == (9.0, 9)


def test_one_metric_statistics_do_not_depend_on_the_other_metrics():
    values = {f"c{i}": (i % 7) / 7 for i in range(30)}
    better = {c: min(1.0, v + (0.1 if i % 3 else -0.05)) for i, (c, v) in enumerate(values.items())}
    full = compare(pair(arm("run-1", values), arm("run-2", better)))
    few = coordinates(metrics=coordinates().metrics[:1])
    only = compare(pair(arm("run-1", values, coords=few), arm("run-2", better, coords=few)))
    assert only.slices["all"].metrics["ndcg@10"] == full.slices["all"].metrics["ndcg@10"]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=3, max_size=12),
    st.lists(st.floats(0, 1), min_size=12, max_size=12),
    st.randoms(),
)
def test_comparison_id_ignores_cell_order_and_metric_map_order(inc_values, ch_values, rnd):
    values = {f"c{i}": v for i, v in enumerate(inc_values)}
    inc, ch = arm("run-1", values), arm("run-2", {c: ch_values[i] for i, c in enumerate(values)})

    def shuffled(a):
        cells = [
            CellOutcome(**{**c.model_dump(), "metrics": dict(rnd.sample(list(c.metrics.items()), len(c.metrics)))})
            for c in a.cells
        ]
        rnd.shuffle(cells)
        return a.model_copy(update={"cells": tuple(cells)})

    assert compare(pair(shuffled(inc), shuffled(ch))).comparison_id == compare(pair(inc, ch)).comparison_id


def test_comparison_file_round_trips_and_refuses_tampering(tmp_path: Path):
    c = compare(pair(arm("run-1", {"a": 0.1, "b": 0.4, "c": 0.2}), arm("run-2", {"a": 0.3, "b": 0.4, "c": 0.1})))
    path = tmp_path / "cmp.json"
    assert write_comparison(c, path) is True
    assert write_comparison(c, path) is False  # identical content: a no-op
    loaded = load_comparison(path)
    assert loaded == c and loaded.comparison_id == c.comparison_id == json.loads(path.read_text())["comparison_id"]
    other = compare(pair(arm("run-1", {"a": 0.1}), arm("run-2", {"a": 0.2})))
    with pytest.raises(
        ComparisonError,
        match=f"^{path}: already exists with different content \\(comparisons are never overwritten\\)$",
    ):
        write_comparison(other, path)
    raw = json.loads(path.read_text())
    raw["slices"]["all"]["metrics"]["ndcg@10"]["stats"]["wins"] = 3
    path.write_text(json.dumps(raw))
    with pytest.raises(
        ComparisonError,
        match=f"^{path}: content does not match its comparison_id {c.comparison_id} \\(computed sha256:[0-9a-f]{{64}}\\)$",
    ):
        load_comparison(path)
    raw["slices"]["all"]["metrics"]["ndcg@10"]["stats"]["wins"] = "many"
    path.write_text(json.dumps(raw))
    with pytest.raises(
        ComparisonError,
        match=f"^{path}: invalid comparison: slices.all.metrics.ndcg@10.stats.wins: Input should be a valid integer",
    ):
        load_comparison(path)
    path.write_text(json.dumps(raw).replace('"wins": "many"', '"wins": NaN'))
    with pytest.raises(ComparisonError, match=f"^{path}: not a JSON comparison: non-finite number NaN$"):
        load_comparison(path)
    with pytest.raises(
        ComparisonError, match=f"^{tmp_path / 'none.json'}: cannot read comparison: No such file or directory$"
    ):
        load_comparison(tmp_path / "none.json")
