"""Verification of a lexical index's structures, beyond its stored rows (tantivy adapter).

Stored fields are what ``read_lexical_rows`` returns; a search uses other structures: the schema
(tokenizer and field options in ``meta.json``), the ``access_scope`` postings the scope
prefilter intersects, and the ``row`` fast field that turns a hit into a bundle row. A forger who
rewrites those and re-lists the files would keep the stored rows right and change what a query
sees, so each is checked against the rows' expected scopes and positions.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import tantivy

from ragpipe.index.lexical import lexical_schema
from ragpipe.index.rows import RowScopes
from ragpipe.index.segments import read_meta
from ragpipe.spec import LexicalIndexSpec

LABEL = "lexical"


def expected_schema(spec: LexicalIndexSpec) -> list[dict]:
    """The ``schema`` section of ``meta.json`` for an index built under ``spec``."""
    with tempfile.TemporaryDirectory(prefix="ragpipe-schema-") as folder:
        tantivy.Index(lexical_schema(spec), path=folder)
        return json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8"))["schema"]


def structure_problems(directory: Path, spec: LexicalIndexSpec, row_scopes: Sequence[Sequence[str]]) -> list[str]:
    """Schema, ``row`` fast field and ``access_scope`` postings against the expected rows (row ``i``
    has scopes ``row_scopes[i]``); empty when all agree."""
    if read_meta(directory).get("schema") != expected_schema(spec):
        return [
            f"{LABEL}/meta.json: schema differs from the one the lexical index spec builds (tokenizer or field options)"
        ]
    index = tantivy.Index.open(str(directory))
    index.reload()
    searcher = index.searcher()
    limit = max(1, searcher.num_docs)
    problems: list[str] = []
    every = [address for _, address in searcher.search(tantivy.Query.all_query(), limit=limit, count=False).hits]
    for address, fast in zip(every, searcher.fast_field_values("row", every)):
        stored = searcher.doc(address).to_dict()["row"][0]
        if fast != stored:
            problems.append(
                f"{LABEL}: stored row {stored}: the row fast field says {fast} (hits would resolve to another row)"
            )
            return problems
    rows = RowScopes.of(row_scopes)
    expected_scopes = rows.scopes()
    indexed = {term for term, _ in searcher.terms_with_prefix("access_scope", "")}
    if unexpected := sorted(indexed - expected_scopes):
        problems.append(f"{LABEL}: access_scope postings for {unexpected} match no row's scopes")
    schema = index.schema
    for scope in sorted(expected_scopes):
        query = tantivy.Query.term_query(schema, "access_scope", scope)
        found = [address for _, address in searcher.search(query, limit=limit, count=False).hits]
        if wrong := rows.scope_mismatch(scope, searcher.fast_field_values("row", found)):
            extra, missing = wrong
            problems.append(
                f"{LABEL}: the access_scope {scope!r} postings match rows {extra} that lack the scope "
                f"and miss rows {missing} that have it"
            )
    return problems
