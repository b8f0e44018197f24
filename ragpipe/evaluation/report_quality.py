"""A judged run's answer labels in its report (pure): counted over cells and over cases, and set
against the reference labels people gave.

``label_counts(cells, evaluated)`` — ``cells`` is every completed cell as ``(case ID, record
payload)``; a cell is *labelled* when it carries ``answer_label`` (judged, or an abstention on an
answerable case: 0_FAIL by rule, ``by_rule``):

* ``cells`` — each labelled cell counts once: ``distribution`` (integer counts of all four
  labels), ``labelled``, ``by_rule``, ``mean_label`` (None when nothing is labelled);
* ``cases`` — the metric tables' weighting (``report``: a case's value is the mean over its
  repeats, the run's the mean over the evaluated cases): each evaluated case with a labelled cell
  weighs 1, shared equally by its labelled cells, so a case labelled 2 once and 3 once adds 0.5 to
  each. ``distribution`` (those weights summed: fractions when repeats disagree), ``labelled``
  (cases) and ``mean_label`` — equal to the metric table's ``answer_label``, and
  ``distribution[label] / labelled`` to its label rates, exactly.

Both are reported, named, because with repeats a case has no single label: a count of cells
weighs a case by its repeats (and by how many of them completed), a count of cases does not; with
one repeat and every case evaluated they are the same numbers.

``agreement(cells, references)`` — ``references``: case ID → the ``quality_label`` a person gave
(suite cards). Over the completed cells of those cases: each cell the judge labelled is one
rating compared with its case's reference (``cells``; ``cases``: how many cases they cover),
``exact_rate`` and ``within_one_rate`` (label ranks at most 1 apart) over those cells (None when
none), the ``confusion`` counts (reference label → judge label → cells, all four by four), and
``disagreements``: the sorted IDs of cases with a cell two or more ranks from the reference. A
cell the judge failed on is counted in ``judge_failed``, never as a disagreement; an abstention
labelled 0_FAIL by rule is no rating by the judge: counted in ``by_rule``, not compared. None when
no cell of a referenced case was put to the judge or labelled by rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ragpipe.evaluation.judge_spec import LABELS

Cells = Sequence[tuple[str, Mapping[str, Any]]]


def _label(payload: Mapping[str, Any]) -> int | None:
    value = payload["metrics"].get("answer_label")
    return None if value is None else int(value)


def label_counts(cells: Cells, evaluated: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The label counts over cells and over cases (module docstring)."""
    labelled = [(case, label) for case, p in cells if (label := _label(p)) is not None]
    ranks = [label for _, label in labelled]
    by_case: dict[str, list[int]] = {}
    for case, label in labelled:
        by_case.setdefault(case, []).append(label)
    counted = [by_case[c] for c in sorted(set(evaluated)) if c in by_case]
    return {
        "cells": {
            "distribution": {label: ranks.count(rank) for rank, label in enumerate(LABELS)},
            "labelled": len(ranks),
            "by_rule": sum(1 for _, p in cells if _label(p) is not None and p.get("judge_outcome") is None),
            "mean_label": math.fsum(ranks) / len(ranks) if ranks else None,
        },
        "cases": {
            "distribution": {
                label: math.fsum(ls.count(rank) / len(ls) for ls in counted) for rank, label in enumerate(LABELS)
            },
            "labelled": len(counted),
            "mean_label": math.fsum(math.fsum(ls) / len(ls) for ls in counted) / len(counted) if counted else None,
        },
    }


def agreement(cells: Cells, references: Mapping[str, str]) -> dict[str, Any] | None:
    """The judge's labels against the reference labels (module docstring)."""
    compared: list[tuple[str, int, int]] = []  # (case, reference rank, judge rank)
    failed = by_rule = 0
    for case, payload in cells:
        if case not in references:
            continue
        outcome = payload.get("judge_outcome")
        if outcome == "judged":
            compared.append((case, LABELS.index(references[case]), _label(payload)))  # type: ignore[arg-type]
        elif outcome is not None:
            failed += 1
        elif _label(payload) is not None:
            by_rule += 1
    if not compared and not failed and not by_rule:
        return None
    confusion = {ref: dict.fromkeys(LABELS, 0) for ref in LABELS}
    for _, ref, got in compared:
        confusion[LABELS[ref]][LABELS[got]] += 1
    n = len(compared)
    return {
        "cells": n,
        "cases": len({case for case, _, _ in compared}),
        "exact_rate": sum(ref == got for _, ref, got in compared) / n if n else None,
        "within_one_rate": sum(abs(ref - got) <= 1 for _, ref, got in compared) / n if n else None,
        "confusion": confusion,
        "disagreements": sorted({case for case, ref, got in compared if abs(ref - got) >= 2}),
        "judge_failed": failed,
        "by_rule": by_rule,
    }
