"""The pipeline spec file read strictly: a key given twice or nesting beyond the bound is one line
naming the file and line (``kernel/strict_load.py``); a YAML syntax error keeps its wording."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.spec import DEFAULT_SPEC_PATH, PipelineSpecError, load_pipeline_spec

DEFAULT = DEFAULT_SPEC_PATH.read_text(encoding="utf-8")
MAX_BYTES = "  max_bytes: 1200\n"


def refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PipelineSpecError) as err:
        load_pipeline_spec(path)
    assert "\n" not in str(err.value)
    return str(err.value).removeprefix(str(path))


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(keepends=True), start=1) if line == needle)


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path):
    assert DEFAULT.count(MAX_BYTES) == 1
    first = line_of(DEFAULT, MAX_BYTES)
    text = DEFAULT.replace(MAX_BYTES, MAX_BYTES + "  max_bytes: 900\n")
    assert refusal(tmp_path, text) == f":{first + 1}: chunker.max_bytes: duplicate key (first at line {first})"


def test_deep_nesting_is_one_line_without_a_recursion_error(tmp_path: Path):
    text = DEFAULT.replace(MAX_BYTES, "  max_bytes: " + "[" * 100_000 + "]" * 100_000 + "\n")
    # the document and chunker are levels 1-2: the 63rd '[' crosses the bound of 64
    assert refusal(tmp_path, text) == (
        f":{line_of(DEFAULT, MAX_BYTES)}: nesting deeper than 64 levels (column {len('  max_bytes: ') + 63})"
    )


def test_an_alias_is_refused(tmp_path: Path):
    text = DEFAULT.replace(MAX_BYTES, "  max_bytes: &size 1200\n  min_bytes: *size\n")
    assert refusal(tmp_path, text) == (
        f":{line_of(DEFAULT, MAX_BYTES) + 1}: YAML alias *size is not allowed "
        "(anchors and aliases are refused in configuration: write the value out)"
    )


def test_a_syntax_error_keeps_its_wording(tmp_path: Path):
    line = line_of(DEFAULT, MAX_BYTES)
    text = DEFAULT.replace(MAX_BYTES, "  max_bytes: 1200: 3\n")
    assert refusal(tmp_path, text) == (
        f": cannot read pipeline spec: invalid YAML at line {line}, column 18: mapping values are not allowed here"
    )
