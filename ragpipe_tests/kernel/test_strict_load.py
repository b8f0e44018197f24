"""Strict YAML/JSON reading: one-line refusals (duplicate keys, deep nesting, syntax, NaN, aliases),
never a RecursionError, and the same values as the standard parsers for everything else."""

from __future__ import annotations

import json
import pickle
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragpipe.kernel.strict_load import (
    ALIAS,
    DUPLICATE_KEY,
    KEY_TYPE,
    MAX_DEPTH,
    NON_FINITE,
    SYNTAX,
    TOO_DEEP,
    StrictLoadError,
    load_json,
    load_json_line,
    load_yaml,
    load_yaml_lines,
)

DEEP = 100_000


def refused(load, *args, **kwargs) -> StrictLoadError:
    with pytest.raises(StrictLoadError) as info:
        load(*args, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


# ---------------------------------------------------------------------------- duplicate keys


def test_yaml_duplicate_key_at_depth_names_path_line_and_first_line():
    text = "a: 1\nb:\n  c:\n    - {x: 1}\n    - d: 1\n      e: 2\n      d: 3\n"
    err = refused(load_yaml, text, "cfg.yaml")
    assert str(err) == "cfg.yaml:7: b.c[1].d: duplicate key (first at line 5)"
    assert (err.kind, err.line, err.column) == (DUPLICATE_KEY, 7, 7)


def test_yaml_duplicate_key_on_one_line_names_the_first_column():
    assert str(refused(load_yaml, "a: {k: 1, k: 2}\n", "f.yaml")) == "f.yaml:1: a.k: duplicate key (first at column 5)"


def test_yaml_keys_equal_as_values_are_duplicates():
    # 'yes' and 'true' are the same boolean key in YAML 1.1; 1 and 0x1 the same integer
    assert str(refused(load_yaml, "true: a\nyes: b\n", "f.yaml")) == "f.yaml:2: True: duplicate key (first at line 1)"
    assert str(refused(load_yaml, "1: a\n0x1: b\n", "f.yaml")) == "f.yaml:2: 1: duplicate key (first at line 1)"


def test_json_duplicate_key_at_depth_names_path_line_and_first_line():
    text = '{\n  "a": [\n    {"b": 1},\n    {"c": {\n      "d": 1,\n      "d": 2}}]}'
    err = refused(load_json, text, "x.json")
    assert str(err) == "x.json:6: a[1].c.d: duplicate key (first at line 5)"
    assert (err.kind, err.line, err.column) == (DUPLICATE_KEY, 6, 7)


def test_json_duplicate_spelled_with_an_escape_is_a_duplicate():
    assert (
        str(refused(load_json, '{"a": 1, "\\u0061": 2}', "x.json")) == "x.json:1: a: duplicate key (first at column 2)"
    )


def test_json_line_duplicate_judgment_names_the_line_and_columns():
    text = '{"id": "q1", "judgments": {"d1": 1, "d2": 0, "d1": 2}}'
    err = refused(load_json_line, text, "suite.jsonl", 3)
    assert str(err) == "suite.jsonl:3: judgments.d1: duplicate key (first at column 28)"
    assert (err.line, err.column) == (3, 46)


def test_equal_values_under_different_keys_or_in_sibling_objects_are_fine():
    assert load_json('[{"a": 1}, {"a": 1}]', "x") == [{"a": 1}, {"a": 1}]
    assert load_yaml("- {a: 1}\n- {a: 1}\n", "x") == [{"a": 1}, {"a": 1}]


# ---------------------------------------------------------------------------- nesting


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ("[" * DEEP + "]" * DEEP, 65),
        ("[" * DEEP, 65),  # unterminated: still the depth, found first
        ('{"a":' * DEEP + "1" + "}" * DEEP, 64 * 5 + 1),
        ('{"k": "' + "[" * 500 + '", "v": [[1]]}', None),  # brackets in a string do not nest
    ],
    ids=["arrays", "unterminated", "objects", "in-string"],
)
def test_json_deep_nesting_is_one_line_never_a_recursion_error(text: str, column: int | None):
    if column is None:
        assert load_json(text, "x.json") == {"k": "[" * 500, "v": [[1]]}
        return
    err = refused(load_json, text, "x.json")
    assert str(err) == f"x.json:1: nesting deeper than 64 levels (column {column})"
    assert err.kind == TOO_DEEP


def test_json_depth_names_the_line_where_the_bound_is_crossed():
    text = "".join("[\n" for _ in range(DEEP))
    assert str(refused(load_json, text, "x.json")) == "x.json:65: nesting deeper than 64 levels (column 1)"


def test_json_line_deep_nesting_names_the_file_line():
    assert (
        str(refused(load_json_line, "[" * DEEP, "s.jsonl", 9)) == "s.jsonl:9: nesting deeper than 64 levels (column 65)"
    )


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[" * DEEP + "]" * DEEP, "1: nesting deeper than 64 levels (column 65)"),
        ("{a: " * DEEP + "1" + "}" * DEEP, "1: nesting deeper than 64 levels (column 257)"),
        ("- " * DEEP + "x\n", "1: nesting deeper than 64 levels (column 129)"),
        ("k: " * DEEP + "x\n", "1: invalid YAML: mapping values are not allowed here (column 5)"),
        ("".join(" " * i + "k:\n" for i in range(200)), "65: nesting deeper than 64 levels (column 65)"),
    ],
    ids=["flow-seq", "flow-map", "block-seq", "block-map-one-line", "block-map-indented"],
)
def test_yaml_deep_nesting_is_one_line_never_a_recursion_error(text: str, where: str):
    assert str(refused(load_yaml, text, "c.yaml")) == f"c.yaml:{where}"


def test_the_bound_is_inclusive_and_configurable():
    assert load_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x") is not None
    assert load_yaml("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x") is not None
    assert refused(load_json, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "x").kind == TOO_DEEP
    assert refused(load_yaml, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "x").kind == TOO_DEEP
    assert str(refused(load_json, "[[[]]]", "x", max_depth=2)) == "x:1: nesting deeper than 2 levels (column 3)"
    assert str(refused(load_yaml, "a: {b: {c: 1}}", "x", max_depth=2)) == "x:1: nesting deeper than 2 levels (column 8)"


# ---------------------------------------------------------------------------- syntax, NaN, aliases


def test_syntax_errors_name_line_and_column_and_keep_the_parser_error():
    err = refused(load_yaml, "a: 1\nb: 2: 3\n", "c.yaml")
    assert str(err) == "c.yaml:2: invalid YAML: mapping values are not allowed here (column 5)"
    assert (err.kind, err.line, err.column) == (SYNTAX, 2, 5) and isinstance(err.original, yaml.YAMLError)
    err = refused(load_json, '{\n  "a": }', "x.json")
    assert str(err) == "x.json:2: not valid JSON: Expecting value (column 8)"
    assert isinstance(err.original, json.JSONDecodeError)
    assert str(refused(load_json, '{"a": 1} {"b": 2}', "x.json")) == "x.json:1: more than one JSON value (column 10)"
    assert (
        str(refused(load_json_line, "1 2", "s.jsonl", 4))
        == "s.jsonl:4: more than one JSON value on the line (column 3)"
    )
    assert str(refused(load_yaml, "a: 1\nb: x\x07\n", "c.yaml")) == (
        "c.yaml:2: invalid YAML: unacceptable character #x0007: special characters are not allowed (column 5)"
    )
    assert str(refused(load_yaml, "a: 1\n---\nb: 2\n", "c.yaml")) == (
        "c.yaml:2: invalid YAML: but found another document (expected a single document in the stream) (column 1)"
    )


@pytest.mark.parametrize("name", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_numbers_are_refused(name: str):
    err = refused(load_json, '{"a": "NaN",\n "b": [1, ' + name + "]}", "x.json")
    assert str(err) == f"x.json:2: non-finite number {name} is not JSON"
    assert err.kind == NON_FINITE


def test_aliases_and_merge_keys_are_refused():
    laughs = 'a: &a ["lol", "lol"]\nb: &b [*a, *a]\nc: &c [*b, *b]\n'
    err = refused(load_yaml, laughs, "c.yaml")
    assert str(err) == (
        "c.yaml:2: YAML alias *a is not allowed (anchors and aliases are refused in configuration: write the value out)"
    )
    assert err.kind == ALIAS
    assert str(refused(load_yaml, "x: &r [*r]\n", "c.yaml")).startswith("c.yaml:1: YAML alias *r is not allowed")
    assert str(refused(load_yaml, "a:\n  <<: {b: 1}\n", "c.yaml")) == (
        "c.yaml:2: a: YAML merge key '<<' is not allowed (write the keys out)"
    )
    assert load_yaml("a: &anchor 1\n", "c.yaml") == {"a": 1}  # an anchor nobody uses is harmless


def test_keys_must_be_scalars_and_optionally_strings():
    assert (
        str(refused(load_yaml, "? [a]\n: 1\n", "c.yaml"))
        == "c.yaml:1: top level: a key must be a scalar, not a collection"
    )
    assert load_yaml("1: a\n", "c.yaml") == {1: "a"}
    err = refused(load_yaml_lines, "a:\n  1: x\n", "c.yaml", string_keys=True)
    assert (str(err), err.kind) == ("c.yaml:2: a: key 1 is not a string", KEY_TYPE)


def test_line_offset_shifts_every_line():
    # YAML front matter starting on file line 2 of a document
    assert (
        str(refused(load_yaml, "a: 1\na: 2\n", "doc.md", line_offset=1))
        == "doc.md:3: a: duplicate key (first at line 2)"
    )
    assert str(refused(load_yaml, "a: [\n", "doc.md", line_offset=1)).startswith("doc.md:3: invalid YAML:")
    assert (
        str(refused(load_json, '{"a": 1,\n"a": 2}', "x", line_offset=10)) == "x:12: a: duplicate key (first at line 11)"
    )


def test_key_lines_and_values():
    value, lines = load_yaml_lines("a: 1\nb:\n  - c: 2\n", "c.yaml")
    assert value == {"a": 1, "b": [{"c": 2}]}
    assert lines == {"": 1, "a": 1, "b": 2, "b[0]": 3, "b[0].c": 3}
    assert load_yaml_lines("", "c.yaml") == (None, {})
    assert load_yaml("# only a comment\n", "c.yaml") is None


def test_the_error_pickles_and_is_a_value_error():
    err = refused(load_json, '{"a": 1, "a": 2}', "x.json")
    assert isinstance(err, ValueError)
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.line, back.column, back.kind) == (str(err), err.line, err.column, err.kind)


def test_a_megabyte_of_normal_json_is_fast():
    doc = {f"key{i}": {"name": "x" * 20, "vals": [i / 7, i / 3], "tags": ["a", "b"], "n": i} for i in range(12_000)}
    text = json.dumps(doc, indent=1)
    assert len(text) > 1_000_000
    start = time.perf_counter()
    assert load_json(text, "big.json") == doc
    assert time.perf_counter() - start < 2.0  # ~0.1 s; json.loads alone ~0.04 s


# ---------------------------------------------------------------------------- laws


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: object) -> bool:  # a value used twice is written twice
        return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_law_json_round_trip(value: object):
    if _depth(value) <= MAX_DEPTH:
        assert load_json(json.dumps(value), "x") == value
        assert load_json(json.dumps(value, indent=2), "x") == value


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_law_yaml_round_trip(value: object):
    if _depth(value) <= MAX_DEPTH:
        assert load_yaml(yaml.dump(value, Dumper=_NoAliasDumper), "x") == value
        assert load_yaml(yaml.dump(value, Dumper=_NoAliasDumper, default_flow_style=True), "x") == value


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_law_same_value_as_the_standard_parsers(value: object):
    text = json.dumps(value)
    assert load_json(text, "x") == json.loads(text)
    assert load_yaml(text, "x") == yaml.safe_load(text)  # JSON is YAML
