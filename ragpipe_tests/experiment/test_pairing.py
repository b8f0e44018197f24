"""Exact pairing by (case, repeat): power sets of removed and duplicated cells, failures kept."""

from __future__ import annotations

from itertools import chain, combinations

import pytest

from ragpipe.experiment.arms import ArmRun
from ragpipe.experiment.comparison import compare
from ragpipe.experiment.pairing import PairingError, pair
from ragpipe_tests.support.gate_support import arm, coordinates

GRID = [("c1", 0), ("c1", 1), ("c2", 0), ("c2", 1)]
VALUES = {"c1": 0.5, "c2": 0.25}


def subsets(items):
    return list(chain.from_iterable(combinations(items, n) for n in range(len(items) + 1)))


def grid_arm(run_id: str, removed=(), duplicated=()) -> ArmRun:
    base = arm(run_id, VALUES, repeats=2)
    cells = [c for c in base.cells if c.key not in removed]
    cells += [c for c in base.cells if c.key in duplicated]
    return base.model_copy(update={"cells": tuple(cells)})


def describe(key) -> str:
    return f"cell ({key[0]!r}, {key[1]})"


@pytest.mark.parametrize("removed_inc", subsets(GRID), ids=str)
def test_power_set_of_missing_cells_names_the_first_missing_cell_and_arm(removed_inc):
    for removed_ch in subsets(GRID):
        inc, ch = grid_arm("run-1", removed=removed_inc), grid_arm("run-2", removed=removed_ch)
        if not removed_inc and not removed_ch:
            assert len(pair(inc, ch).pairs) == 4
            continue
        side, run, removed = ("incumbent", "run-1", removed_inc) if removed_inc else ("challenger", "run-2", removed_ch)
        with pytest.raises(PairingError) as info:
            pair(inc, ch)
        assert (
            str(info.value)
            == f"{side} run {run}: {describe(min(removed))} is missing ({len(removed)} expected cells have no terminal outcome)"
        )


@pytest.mark.parametrize("dup_inc", subsets(GRID), ids=str)
def test_power_set_of_duplicated_cells_names_the_first_duplicate_and_arm(dup_inc):
    for dup_ch in subsets(GRID):
        inc, ch = grid_arm("run-1", duplicated=dup_inc), grid_arm("run-2", duplicated=dup_ch)
        if not dup_inc and not dup_ch:
            assert [p.key for p in pair(inc, ch).pairs] == GRID
            continue
        side, run, dup = ("incumbent", "run-1", dup_inc) if dup_inc else ("challenger", "run-2", dup_ch)
        with pytest.raises(PairingError) as info:
            pair(inc, ch)
        assert str(info.value) == f"{side} run {run}: {describe(min(dup))} appears 2 times"


def test_a_duplicate_is_reported_before_a_missing_cell_of_the_same_arm():
    inc = grid_arm("run-1", removed=[("c1", 0)], duplicated=[("c2", 1)])
    with pytest.raises(PairingError, match=r"^incumbent run run-1: cell \('c2', 1\) appears 2 times$"):
        pair(inc, grid_arm("run-2"))


def test_failed_cells_stay_paired_and_are_counted_by_arm_and_class():
    inc = arm("run-1", VALUES, repeats=2, failed={("c1", 1): "TimeoutError"})
    ch = arm(
        "run-2",
        VALUES,
        repeats=2,
        failed={("c1", 1): "TimeoutError", ("c2", 0): "RuntimeError", ("c2", 1): "cancelled"},
    )
    pairing = pair(inc, ch)
    assert [p.key for p in pairing.pairs] == GRID
    assert [(p.incumbent.outcome, p.challenger.outcome) for p in pairing.pairs] == [
        ("success", "success"),
        ("failure", "failure"),
        ("success", "failure"),
        ("success", "cancelled"),
    ]
    assert [(f.side, f.failure_class, f.cells) for f in pairing.certificate.failures] == [
        ("incumbent", "TimeoutError", 1),
        ("challenger", "RuntimeError", 1),
        ("challenger", "TimeoutError", 1),
        ("challenger", "cancelled", 1),
    ]
    assert pairing.certificate.both_completed == 1
    ndcg = compare(pairing).slices["all"].metrics["ndcg@10"]
    assert (ndcg.pairs, ndcg.scored, ndcg.failed, ndcg.unmeasured, ndcg.stats.n) == (4, 1, 3, 0, 1)
    c = compare(pairing)
    assert (c.incumbent.failed, c.challenger.failed) == (
        {"TimeoutError": 1},
        {"RuntimeError": 1, "TimeoutError": 1, "cancelled": 1},
    )
    assert (c.incumbent.cells, c.incumbent.completed, c.challenger.completed) == (4, 3, 1)


def test_certificate_lists_ordered_cells_and_both_runs_under_their_roles():
    inc, ch = (
        arm("run-1", {"b": 0.1, "a": 0.2, "c": 0.3}, repeats=2),
        arm("run-2", {"c": 0.3, "a": 0.2, "b": 0.1}, repeats=2),
    )
    cert = pair(inc, ch).certificate
    assert cert.cells == (("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1))
    assert (cert.incumbent.run_id, cert.challenger.run_id) == ("run-1", "run-2")
    assert cert.incumbent.ledger_head == inc.ledger_head and cert.challenger.spec_id == ch.spec_id
    swapped = pair(ch, inc).certificate
    assert (swapped.incumbent.run_id, swapped.challenger.run_id) == ("run-2", "run-1")
    assert compare(pair(inc, ch)).comparison_id != compare(pair(ch, inc)).comparison_id


def test_same_run_and_swapped_role_labels_are_refused():
    one = arm("run-1", VALUES)
    with pytest.raises(PairingError, match="^incumbent and challenger are the same run run-1$"):
        pair(one, one)
    with pytest.raises(PairingError, match="^incumbent run run-1 is labelled 'challenger': the arguments are swapped$"):
        pair(arm("run-1", VALUES, label="challenger"), arm("run-2", VALUES, label="incumbent"))
    with pytest.raises(PairingError, match="^challenger run run-2 is labelled 'incumbent': the arguments are swapped$"):
        pair(arm("run-1", VALUES), arm("run-2", VALUES, label="incumbent"))
    assert len(pair(arm("run-1", VALUES, label="incumbent"), arm("run-2", VALUES, label="challenger")).pairs) == 2


def test_runs_of_different_suites_or_coordinates_are_refused():
    other = "sha256:" + "2" * 64
    with pytest.raises(PairingError) as info:
        pair(arm("run-1", VALUES), arm("run-2", VALUES, coords=coordinates(suite_digest=other)))
    assert str(info.value) == (
        f"runs differ in suite_digest: incumbent 'sha256:{'1' * 64}', challenger '{other}' "
        "(only bundle, plan and arm label may differ)"
    )
    with pytest.raises(
        PairingError, match=r"^runs differ in scopes: incumbent \('public',\), challenger \('internal',\) \(only"
    ):
        pair(arm("run-1", VALUES), arm("run-2", VALUES, coords=coordinates(scopes=("internal",))))
    with pytest.raises(PairingError, match=r"^runs differ in repeats: incumbent 1, challenger 2 "):
        pair(arm("run-1", VALUES), arm("run-2", VALUES, repeats=2))
    base = coordinates()
    fewer = coordinates(metrics=base.metrics[:2])
    with pytest.raises(PairingError) as info:
        pair(arm("run-1", VALUES), arm("run-2", VALUES, coords=fewer))
    assert str(info.value) == (
        "runs differ in metrics at position 2: incumbent {'name': 'unauthorized_disclosures', 'direction': 'lower', "
        "'unit': 'count', 'k': None, 'measure': None, 'aggregate': 'sum'}, challenger 'nothing'"
    )


def test_an_arm_whose_cells_are_not_its_expected_cells_is_refused():
    base = arm("run-2", VALUES, repeats=2)
    with pytest.raises(PairingError, match=r"^challenger run run-2: cell \('c2', 1\) is not an expected cell$"):
        pair(arm("run-1", VALUES, repeats=2), base.model_copy(update={"expected": base.expected[:3]}))
    with pytest.raises(PairingError, match=r"^challenger run run-2: expected cell \('c1', 0\) is listed 2 times$"):
        pair(arm("run-1", VALUES, repeats=2), base.model_copy(update={"expected": base.expected + (("c1", 0),)}))
    skipping = base.model_copy(update={"skipped": {"c2": "judged documents missing"}})
    with pytest.raises(PairingError, match=r"^challenger run run-2: cell \('c2', 0\) belongs to skipped case 'c2'$"):
        pair(arm("run-1", VALUES, repeats=2), skipping)
    one = arm("run-2", VALUES)
    cells = one.cells + (one.cells[0].model_copy(update={"repeat": 1}),)
    with pytest.raises(PairingError, match=r"^challenger run run-2: cell \('c1', 1\) has a repeat outside 0\.\.0$"):
        pair(arm("run-1", VALUES), one.model_copy(update={"cells": cells, "expected": one.expected + (("c1", 1),)}))


def test_skipped_cases_must_be_identical_on_both_sides():
    with pytest.raises(PairingError) as info:
        pair(arm("run-1", VALUES, skipped={"c9": "missing documents"}), arm("run-2", VALUES))
    assert (
        str(info.value)
        == "case 'c9' differs: skipped (missing documents) by the incumbent, not skipped by the challenger"
    )
    with pytest.raises(PairingError) as info:
        pair(arm("run-1", VALUES, skipped={"c9": "x"}), arm("run-2", VALUES, skipped={"c9": "y"}))
    assert str(info.value) == "case 'c9' differs: skipped (x) by the incumbent, skipped (y) by the challenger"
    pairing = pair(arm("run-1", VALUES, skipped={"c9": "x"}), arm("run-2", VALUES, skipped={"c9": "x"}))
    assert pairing.certificate.skipped == (("c9", "x"),)


def test_expected_cells_and_tags_must_agree():
    with pytest.raises(
        PairingError, match=r"^cell \('c3', 0\) is expected by the challenger but not by the incumbent$"
    ):
        pair(arm("run-1", VALUES), arm("run-2", {**VALUES, "c3": 0.1}))
    with pytest.raises(PairingError, match=r"^case 'c2' has tags \['x'\] in the incumbent, \[\] in the challenger$"):
        pair(arm("run-1", VALUES, tags={"c2": ("x",)}), arm("run-2", VALUES))
