"""targets.yaml read strictly: a key given twice or nesting beyond the bound is one line naming the
file and line (``kernel/strict_load.py``), never the last value kept nor a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.release.store import ReleaseError
from ragpipe.release.targets import DEFAULT_TARGETS_PATH, load_targets

DEFAULT = DEFAULT_TARGETS_PATH.read_text(encoding="utf-8")


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if line.startswith(needle))


def refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "targets.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ReleaseError) as err:
        load_targets(path)
    return str(err.value).removeprefix(f"{path}:")


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path):
    old = "    auto_activate: false "
    assert DEFAULT.count(old) == 1
    text = DEFAULT.replace(old, "    auto_activate: true\n" + old)
    first = text.splitlines().index("    auto_activate: true") + 1
    assert refusal(tmp_path, text) == (
        f"{first + 1}: targets.production.auto_activate: duplicate key (first at line {first})"
    )


def test_deep_nesting_is_one_line_without_a_recursion_error(tmp_path: Path):
    old = "    approvers: {}"
    assert DEFAULT.count(old) == 1
    text = DEFAULT.replace(old, "    approvers: " + "[" * 100_000 + "]" * 100_000)
    # the document, targets and production are levels 1-3: the 62nd '[' crosses the bound of 64
    assert refusal(tmp_path, text) == (
        f"{line_of(text, '    approvers: ')}: nesting deeper than 64 levels (column {len('    approvers: ') + 62})"
    )
