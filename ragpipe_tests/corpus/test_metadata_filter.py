"""The metadata filter language: laws over random corpora and filters, exact errors, worked examples."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.corpus.metadata import Metadata, MetadataValue, typed_metadata
from ragpipe.corpus.metadata_filter import (
    And,
    DocumentMatcher,
    Eq,
    Exists,
    FieldFact,
    Filter,
    FilterError,
    In,
    Not,
    Or,
    Range,
    check_filter,
    comparable,
    field_catalog,
    filter_json,
    matches,
    parse_filter,
)
from ragpipe.corpus.where_syntax import parse_where, show_where

# ---- random corpora: every type, lists, missing values, a field whose type differs between documents

DATES = ["2023-12-31", "2024-01-01", "2024-02-29"]
DATETIMES = ["2024-01-01T09:00:00", "2024-01-01T10:00:00", "2024-01-01T10:00:00Z", "2024-01-01T10:00:00.500000Z"]
STRINGS = ["a", "b", "c", "2024-01-01"]


def _value(kind: str, values: st.SearchStrategy, many: bool = False) -> st.SearchStrategy[MetadataValue]:
    chosen = st.lists(values, min_size=1, max_size=3) if many else values.map(lambda v: [v])
    return chosen.map(lambda vs: MetadataValue(type=kind, many=many, values=tuple(vs)))


FIELD_VALUES = {
    "n": _value("integer", st.integers(-2, 3)),
    "f": st.one_of(_value("integer", st.integers(-2, 3)), _value("number", st.sampled_from([-1.5, 0.0, 2.0, 2.5]))),
    "s": _value("string", st.sampled_from(STRINGS)),
    "b": _value("boolean", st.booleans()),
    "d": _value("date", st.sampled_from(DATES)),
    "t": _value("datetime", st.sampled_from(DATETIMES)),
    "ls": _value("string", st.sampled_from(STRINGS), many=True),
    "ln": st.one_of(
        _value("integer", st.integers(-2, 3), many=True), _value("number", st.sampled_from([-1.5, 2.0]), many=True)
    ),
    "ld": _value("date", st.sampled_from(DATES), many=True),
    "mix": st.one_of(_value("date", st.sampled_from(DATES)), _value("string", st.sampled_from(STRINGS))),
    "x.y-z": _value("string", st.sampled_from(STRINGS)),
}
documents = st.fixed_dictionaries({}, optional=FIELD_VALUES)
corpora = st.lists(st.tuples(documents, st.sampled_from(["faq", "guide", "policy"])), min_size=1, max_size=8)

# ---- random filters: mostly literals that fit the field (so comparisons hit stored values and bounds
# fall on them), some of any type (an unchecked filter must still evaluate alike)

NUMBERS = [-2, -1.5, 0, 1, 2.0, 2.5, 3]
TEXTS = [*STRINGS, "faq", "guide"]
DAYS = [*DATES, "20240101", "2024-13-01"]
MOMENTS = [*DATETIMES, "2024-01-01T12:00:00+02:00", "2024-01-01T10:00:00.5+00:00", "2024-01-01", "noon"]
FITTING = {"n": NUMBERS, "f": NUMBERS, "ln": NUMBERS, "d": DAYS, "ld": DAYS, "t": MOMENTS, "mix": DAYS + TEXTS}
ANY_BOUND = st.sampled_from(NUMBERS + TEXTS + DAYS + MOMENTS)


def _bounds(name: str) -> st.SearchStrategy:
    fitting = st.sampled_from(FITTING.get(name, TEXTS))
    return st.one_of(fitting, fitting, fitting, ANY_BOUND)


def _literals(name: str) -> st.SearchStrategy:
    booleans = st.booleans()
    return st.one_of(booleans, booleans, booleans, _bounds(name)) if name == "b" else st.one_of(_bounds(name), booleans)


def _leaves(name: str) -> st.SearchStrategy[Filter]:
    shapes = st.sampled_from([(low, high) for low in ("", "gt", "gte") for high in ("", "lt", "lte") if low or high])
    return st.one_of(
        st.builds(Eq, field=st.just(name), value=_literals(name)),
        st.builds(In, field=st.just(name), values=st.lists(_literals(name), min_size=1, max_size=4)),
        st.builds(
            lambda shape, a, b: Range(field=name, **{op: v for op, v in zip(shape, (a, b)) if op}),
            shapes,
            _bounds(name),
            _bounds(name),
        ),
        st.builds(Exists, field=st.just(name)),
    )


# One strategy per field, built once (a flatmap would rebuild them on every draw).
leaves = st.one_of(*(_leaves(name) for name in [*FIELD_VALUES, "source_role", "absent"]))
filters: st.SearchStrategy[Filter] = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.builds(Not, filter=kids),
        st.builds(lambda fs: And(filters=fs), st.lists(kids, min_size=2, max_size=3)),
        st.builds(lambda fs: Or(filters=fs), st.lists(kids, min_size=2, max_size=3)),
    ),
    max_leaves=12,
)


def _split(corpus: list[tuple[Metadata, str]]) -> tuple[list[Metadata], list[str]]:
    return [m for m, _ in corpus], [r for _, r in corpus]


def _exact(f: Filter) -> str:
    """The JSON text, which tells true from 1 and 2 from 2.5 (model equality does not: True == 1)."""
    return json.dumps(filter_json(f), sort_keys=True)


# ---- laws


@settings(max_examples=300, deadline=None)
@given(corpora, filters)
def test_fast_mask_is_the_reference(corpus, f):
    metas, roles = _split(corpus)
    mask = DocumentMatcher(metas, roles).mask(f)
    assert mask.dtype == np.bool_ and mask.shape == (len(corpus),)
    assert mask.tolist() == [matches(f, m, r) for m, r in corpus]


@settings(max_examples=300, deadline=None)
@given(corpora, st.lists(leaves, min_size=10, max_size=40))
def test_fast_mask_is_the_reference_leaf_by_leaf(corpus, some):
    # Many leaves on one corpus: each comparison (bound side, family, list) is hit far more often than
    # inside random trees, where one wrong leaf can be hidden by an `or`.
    matcher, catalog = DocumentMatcher(*_split(corpus)), field_catalog(*_split(corpus))
    for f in some:
        assert matcher.mask(f).tolist() == [matches(f, m, r) for m, r in corpus], f
        try:
            check_filter(f, catalog)
        except FilterError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("filter field")


@settings(max_examples=300, deadline=None)
@given(filters)
def test_json_and_text_forms_read_back_equal(f):
    assert parse_filter(filter_json(f)) == f
    assert _exact(parse_filter(filter_json(f))) == _exact(f)
    # Through the canonical bytes (RFC 8785 writes 2.0 as 2): still the same filter.
    assert _exact(parse_filter(json.loads(rfc8785.dumps(filter_json(f))))) == _exact(f)
    text = show_where(f)
    assert parse_where(text) == f and _exact(parse_where(text)) == _exact(f), text


@settings(max_examples=200, deadline=None)
@given(corpora, filters, filters)
def test_not_and_or_are_boolean_algebra(corpus, a, b):
    matcher = DocumentMatcher(*_split(corpus))
    assert (matcher.mask(Not(filter=a)) == ~matcher.mask(a)).all()
    assert (matcher.mask(And(filters=[a, b])) == (matcher.mask(a) & matcher.mask(b))).all()
    assert (matcher.mask(Or(filters=[a, b])) == (matcher.mask(a) | matcher.mask(b))).all()


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='ab=!<>()", 1.-\\ ornotinexists', max_size=40))
def test_any_text_reads_or_fails_in_one_line(text):
    try:
        f = parse_where(text)
    except FilterError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("--where")
    else:
        assert parse_where(show_where(f)) == f


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.sampled_from(["a", "eq", "and", "2024-01-01"]),
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.dictionaries(st.sampled_from(["field", "eq", "in", "gt", "lte", "exists", "and", "or", "not", "x"]), kids)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_reads_or_fails_in_one_line(value):
    try:
        f = parse_filter(value)
    except FilterError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("filter")
    else:
        assert parse_filter(filter_json(f)) == f


# ---- exact errors


def _meta(**values: MetadataValue) -> Metadata:
    return dict(values)


def _typed(kind: str):
    return lambda *values: MetadataValue(type=kind, many=len(values) > 1, values=values)


STR, INT, DATE = _typed("string"), _typed("integer"), _typed("date")
CORPUS = [
    _meta(
        category=STR("faq"), year=INT(2021), published=DATE("2024-01-05"), tags=STR("a", "b"), mixed=DATE("2024-01-01")
    ),
    _meta(category=STR("guide"), year=INT(2019), mixed=DATE("2024-01-02")),
    _meta(year=INT(2023), tags=STR("c", "d"), mixed=STR("soon")),
    _meta(mixed=DATE("2024-01-03")),
]
ROLES = ["faq", "guide", "faq", "policy"]
CATALOG = field_catalog(CORPUS, ROLES)


def _check_error(where: str) -> str:
    with pytest.raises(FilterError) as caught:
        check_filter(parse_where(where), CATALOG)
    return str(caught.value)


def test_catalog_counts_types_and_includes_the_source_role():
    assert CATALOG["source_role"] == FieldFact(types={"string": 4}, documents=4)
    assert CATALOG["tags"] == FieldFact(types={"list<string>": 2}, documents=2)
    assert CATALOG["mixed"] == FieldFact(types={"date": 3, "string": 1}, documents=4)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (
            "yaer >= 2020",
            "filter field 'yaer' is not in this corpus; did you mean 'year'? "
            "(known fields: category, mixed, published, source_role, tags, year)",
        ),
        ('year = "2020"', "filter field 'year' holds integer values; \"2020\" is a string"),
        ("tags in (1)", "filter field 'tags' holds list<string> values; 1 is an integer"),
        ("year = true", "filter field 'year' holds integer values; true is a boolean"),
        (
            'category >= "faq"',
            "filter field 'category' holds string values; a range (gte) needs integer, number, date or datetime values",
        ),
        (
            'mixed = "soon"',
            "filter field 'mixed' holds values of different types (date in 3 documents, string in 1 document); "
            "comparisons on it are refused",
        ),
        (
            'published < "2024-13-01"',
            "filter field 'published' holds date values; \"2024-13-01\" is not a date (YYYY-MM-DD)",
        ),
    ],
)
def test_check_refuses_with_exact_messages(where, message):
    assert _check_error(where) == message


def test_check_lists_ten_known_fields_and_accepts_what_fits():
    wide = field_catalog([{f"field{i:02}": STR("x") for i in range(12)}], ["faq"])
    with pytest.raises(FilterError) as caught:
        check_filter(parse_where('zzz = "x"'), wide)
    assert str(caught.value) == (
        "filter field 'zzz' is not in this corpus (known fields: field00, field01, field02, field03, field04, "
        "field05, field06, field07, field08, field09 and 3 more)"
    )
    check_filter(
        parse_where('exists(mixed) and 2020 <= year < 2024.5 and tags in ("a") and published > "20240101"'), CATALOG
    )
    stamps = field_catalog([{"at": MetadataValue(type="datetime", values=("2024-05-01T10:00:00Z",))}], ["faq"])
    with pytest.raises(FilterError) as caught:
        check_filter(parse_where('at > "yesterday"'), stamps)
    assert str(caught.value) == (
        "filter field 'at' holds datetime values; \"yesterday\" is not a datetime (ISO 8601, like 2024-05-01T10:00:00Z)"
    )


def _deep_not(levels: int) -> dict:
    node: dict = {"field": "a", "eq": 1}
    for _ in range(levels):
        node = {"not": node}
    return node


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"field": "year", "equals": 2020},
            "filter: unknown key \"equals\" (a filter node has 'and', 'or', 'not', "
            "or 'field' with one of eq, in, exists, gt, gte, lt, lte)",
        ),
        (
            {"and": [{"field": "a", "eq": 1}, {"field": "a", "eq": 1, "in": [1]}]},
            "filter.and[1]: 2 shapes in one node ('eq', 'in'); a node has exactly one",
        ),
        ({"field": "a", "gte": 1, "or": []}, "filter: 2 shapes in one node ('or', 'gte'); a node has exactly one"),
        ({"and": []}, "filter.and: expected a non-empty list of filters, got []"),
        (
            {"or": [{"field": "a", "eq": 1}, {"field": "y", "gte": True}]},
            "filter.or[1].gte: expected a number or a date/datetime text, got true",
        ),
        ({"field": "a", "gt": 1, "gte": 2}, "filter: both 'gt' and 'gte' (a range has at most one lower bound)"),
        ({"field": "a", "eq": None}, "filter.eq: expected a string, number or boolean, got null"),
        ({"field": "a", "in": []}, "filter.in: expected a non-empty list of values, got []"),
        ({"field": "a", "in": list(range(1025))}, "filter.in: 1025 values (limit 1024)"),
        ({"field": "a", "exists": "yes"}, 'filter.exists: expected true or false, got "yes"'),
        (
            {"field": "a b", "eq": 1},
            'filter.field: expected a field name (a letter or _, then letters, digits, _ . -; at most 128), got "a b"',
        ),
        ({"field": "a"}, "filter: 'field' without an operator (eq, in, exists, gt, gte, lt, lte)"),
        ({"eq": 1}, "filter: missing 'field' (the metadata field the 'eq' compares)"),
        ({"not": {"field": "a", "eq": 1}, "field": "a"}, "filter: 'field' does not belong in a 'not' node"),
        ([], "filter: expected a filter object, got []"),
        ({"field": "a", "eq": 2**53}, "filter.eq: integer 9007199254740992 is outside ±(2^53-1)"),
        ({"field": "a", "eq": float("nan")}, "filter.eq: nan is not a finite number"),
        (_deep_not(10_000), f"filter{'.not' * 32}: nesting deeper than 32 levels (and, or, not)"),
        ({"and": [{"field": "a", "eq": i} for i in range(10_000)]}, "filter.and[255]: more than 256 nodes"),
        (
            {"and": [{"field": "a", "exists": False}] * 129},
            "filter: more than 256 nodes",  # each `exists: false` is two nodes in normal form
        ),
    ],
)
def test_json_refusals_are_exact_and_one_line(value, message):
    with pytest.raises(FilterError) as caught:
        parse_filter(value)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('category = "faq', '--where column 12: unterminated string (a string ends with ")'),
        ("year >= 2020 year", "--where column 14: expected 'and', 'or' or end of text (got 'year')"),
        ('category = "faq" and year >=', "--where column 29: expected a value after '>=' (got end of text)"),
        ("(" * 4000, "--where column 33: more than 32 nested parentheses"),
        ("not " * 1000 + "a = 1", "--where column 3869: nesting deeper than 32 levels (and, or, not)"),
        ("x = 1" + " or x = 1" * 300, "--where column 2305: more than 256 nodes"),
        ("x" * 4097, "--where: 4097 characters (limit 4096)"),
        ("year == 2020", "--where column 7: expected a value after '=' (got '=')"),
        ("a @ 1", '--where column 3: unexpected character "@"'),
        (
            "and = 1",
            "--where column 1: expected a field name, not the keyword 'and' (a field so named needs the JSON form)",
        ),
        ("x < true", "--where column 5: expected a number or a quoted date after '<' (got 'true')"),
        ('x = "\\q"', "--where column 6: invalid string: Invalid \\escape"),
        ("x = 99999999999999999999", "--where column 5: integer 99999999999999999999 is outside ±(2^53-1)"),
        (
            "2020 > year",
            "--where column 6: expected '<' or '<=' after a value that starts a range, as in 2020 <= year < 2024 (got '>')",
        ),
        ("(x = 1", "--where column 7: expected ')' to close the '(' at column 1 (got end of text)"),
        ("x not (1)", "--where column 7: expected 'in' after 'not' (got '(')"),
        ("x", "--where column 2: expected an operator (= != < <= > >= in) after 'x' (got end of text)"),
    ],
)
def test_text_refusals_name_the_column(text, message):
    with pytest.raises(FilterError) as caught:
        parse_where(text)
    assert str(caught.value) == message


def test_models_hold_the_bounds_however_built():
    f: Filter = Eq(field="a", value=1)
    with pytest.raises(ValueError, match="nesting deeper than 32 levels"):
        for _ in range(40):
            f = Not(filter=f)
    with pytest.raises(ValueError, match="of 1 filters"):
        And(filters=[Eq(field="a", value=1)])


# ---- worked examples


def test_a_where_string_and_its_json_are_one_filter():
    text = 'category = "faq" and (2020 <= year < 2024 or not exists(year)) and tags not in ("b", "a", "b") and x.y-z != 2.0'
    as_json = {
        "and": [
            {"field": "category", "eq": "faq"},
            {"or": [{"field": "year", "gte": 2020, "lt": 2024}, {"field": "year", "exists": False}]},
            {"not": {"field": "tags", "in": ["a", "b"]}},
            {"not": {"field": "x.y-z", "eq": 2}},
        ]
    }
    assert parse_where(text) == parse_filter(as_json)
    assert filter_json(parse_where(text)) == as_json
    assert show_where(parse_filter(as_json)) == (
        'category = "faq" and (2020 <= year < 2024 or not exists(year)) and tags not in ("a", "b") and x.y-z != 2'
    )
    # Keywords in any case; and before or; `{"and": [f]}` is f; an and inside an and is one and.
    assert parse_where("A = 1 OR b = 2 AND NOT c = 3") == parse_filter(
        {"or": [{"field": "A", "eq": 1}, {"and": [{"field": "b", "eq": 2}, {"not": {"field": "c", "eq": 3}}]}]}
    )
    assert parse_filter({"and": [{"and": [{"field": "a", "eq": 1}]}]}) == Eq(field="a", value=1)
    assert parse_where("(a = 1 and b = 2) and c = 3") == parse_where("a = 1 and b = 2 and c = 3")


def test_list_fields_match_when_any_element_does():
    f = parse_where('tags in ("a")')
    assert DocumentMatcher(CORPUS, ROLES).mask(f).tolist() == [True, False, False, False]
    assert DocumentMatcher(CORPUS, ROLES).mask(parse_where('tags = "d"')).tolist() == [False, False, True, False]


def test_not_matches_documents_without_the_field():
    matcher = DocumentMatcher(CORPUS, ROLES)
    assert matcher.mask(parse_where('category != "faq"')).tolist() == [False, True, True, True]
    assert matcher.mask(parse_where('category = "faq" or category != "faq"')).tolist() == [True] * 4
    assert matcher.mask(parse_where('source_role in ("faq", "policy")')).tolist() == [True, False, True, True]


def test_a_datetime_with_a_time_zone_matches_the_stored_utc_value():
    problems: list[str] = []
    stored, _ = typed_metadata(
        {"at": dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))}, str, problems
    )
    assert stored["at"].values == ("2024-05-01T10:00:00Z",) and problems == []
    later = {"at": MetadataValue(type="datetime", values=("2024-05-01T10:00:00.500000Z",))}
    naive = {"at": MetadataValue(type="datetime", values=("2024-05-01T10:00:00",))}
    metas, roles = [stored, later, naive], ["faq"] * 3
    matcher = DocumentMatcher(metas, roles)
    f = parse_where('at = "2024-05-01T12:00:00+02:00"')
    check_filter(f, field_catalog(metas, roles))
    assert matcher.mask(f).tolist() == [True, False, False]
    # Half a second later is later, although metadata.py's text ("…00.500000Z" < "…00Z") sorts it first.
    assert matcher.mask(parse_where('at > "2024-05-01T10:00:00Z"')).tolist() == [False, True, False]
    # Naive and aware compare as text: never equal; a naive one just before the aware one of its reading.
    assert matcher.mask(parse_where('at < "2024-05-01T10:00:00Z"')).tolist() == [False, False, True]
    assert comparable("2024-05-01T12:00:00+02:00", "datetime") == "2024-05-01T10:00:00.000000Z"


def test_integers_and_numbers_compare_as_numbers():
    metas = [
        {"w": MetadataValue(type="number", values=(2.0,))},
        {"w": MetadataValue(type="integer", many=True, values=(1, 3))},
    ]
    matcher = DocumentMatcher(metas, ["faq", "faq"])
    assert matcher.mask(parse_where("w = 2")).tolist() == [True, False]
    assert matcher.mask(parse_where("2 < w <= 3")).tolist() == [False, True]
    assert matcher.mask(parse_where('w = "2"')).tolist() == [False, False]  # unchecked: a string matches no number
    assert [matches(parse_where("w in (3, 2.0)"), m, "faq") for m in metas] == [True, True]


def test_literals_are_nfc_and_integral_floats_past_2_53_are_refused():
    """Found by an adversarial review: both reached the canonical encoder and a 500 over HTTP."""
    assert filter_json(parse_filter({"field": "category", "eq": "cafe\u0301"})) == {"field": "category", "eq": "café"}
    with pytest.raises(FilterError) as info:
        parse_filter({"field": "price", "gte": 1e17})
    assert str(info.value) == "filter.gte: number 1e+17 is an integer outside ±(2^53-1)"
    with pytest.raises(FilterError) as info:
        parse_where("year < 1e17")
    assert str(info.value) == "--where column 8: number 1e+17 is an integer outside ±(2^53-1)"
