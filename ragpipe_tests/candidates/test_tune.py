"""Tune space files: the checked-in space loads; malformed spaces are refused with exact messages.
(The walk itself runs in ``test_candidate_run.py::test_tune_chain_reuses_the_incumbent_run``.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.candidates.create import parse_set
from ragpipe.candidates.tune import TuneError, load_space

SPACE = Path(__file__).resolve().parents[2] / "ragpipe" / "specs" / "tune_space.yaml"


def test_checked_in_space_loads_and_every_edit_parses():
    space = load_space(SPACE)
    assert [d.name for d in space.dimensions] == [
        "fusion",
        "channel-weights",
        "depth",
        "collapse",
        "rrf-k",
        "representations",
        "chunk-size",
    ]
    for dim in space.dimensions:
        for option in dim.options:
            assert len({parse_set(e)[0] for e in option}) == 1  # one asset per option


def test_checked_in_representations_space_edits_only_the_kinds():
    space = load_space(SPACE.with_name("tune_space_representations.yaml"))
    assert [d.name for d in space.dimensions] == ["representations"]
    assert [parse_set(e) for (e,) in space.dimensions[0].options] == [
        ("representations", ("kinds",), ["raw"]),
        ("representations", ("kinds",), ["raw", "questions"]),
        ("representations", ("kinds",), ["raw", "summary"]),
        ("representations", ("kinds",), ["raw", "title_breadcrumb", "questions", "summary"]),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "dimensions: []\n",
            "invalid tune space: dimensions: Tuple should have at least 1 item after validation, not 0",
        ),
        (
            "dimensions: [{name: a, options: []}]\n",
            "invalid tune space: dimensions.0.options: Tuple should have at least 1 item after validation, not 0",
        ),
        (
            "dimensions: [{name: A!, options: [x.y=1]}]\n",
            "invalid tune space: dimensions.0.name: Value error, dimension name 'A!' must match ^[a-z0-9][a-z0-9_-]{0,39}\\Z",
        ),
        (
            "dimensions: [{name: a, options: [x.y=1]}, {name: a, options: [x.y=2]}]\n",
            "invalid tune space: dimension 'a' is declared twice",
        ),
        (
            "schema: other\ndimensions: [{name: a, options: [x.y=1]}]\n",
            "invalid tune space: schema: Input should be 'ragpipe.tune_space/v1'",
        ),
        (
            "dimensions: [{name: a, options: [x.y=1], extra: 1}]\n",
            "invalid tune space: dimensions.0.extra: Extra inputs are not permitted",
        ),
    ],
)
def test_malformed_spaces(tmp_path: Path, text: str, message: str):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(TuneError) as info:
        load_space(path)
    assert str(info.value) == f"{path}: {message}"


def test_unreadable_space(tmp_path: Path):
    with pytest.raises(
        TuneError, match=r"space.yaml: cannot read the tune space: \[Errno 2\] No such file or directory"
    ):
        load_space(tmp_path / "space.yaml")
