"""BEIR-style corpus: one JSON object a line with ``_id``, ``title``, ``text`` and optional
``metadata`` (``access_scopes``, ``source_role``; every other key is kept as typed document
metadata under the rules of ``ragpipe.corpus.metadata``).

A metadata key that is a *near miss* of a security key is refused (``metadata.near_miss_problems``).

Every problem is collected as ``file:line [id=…]: rule`` and all are raised together. On top of
JSON syntax, a line is refused for: a key given twice in any object (JSON parsers disagree on which
value wins), nesting deeper than 64 levels (``json`` would recurse past Python's limit), a
non-finite number, an ID breaking ``ragpipe.corpus.rules``, an ID equal to an
earlier one after NFC, a lone surrogate in ``text``/``title``, and an explicit ``metadata`` that is
not an object (``null``, ``[]``, ``false`` …).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from ragpipe.corpus.metadata import SECURITY_KEYS, near_miss_problems, typed_metadata
from ragpipe.corpus.normalize import CorpusError, decode_utf8, normalize_text
from ragpipe.corpus.records import CorpusRead, SourceRecord, role_of, scopes_of, shown_value
from ragpipe.corpus.rules import id_problem, normalize_id, shown_id, string_problem
from ragpipe.corpus.source import BeirSource
from ragpipe.kernel.strict_load import json_depth_rule

FIELDS = {"_id", "title", "text", "metadata"}


class _Line:
    """One parsed line: the object and the keys given twice in it (any depth)."""

    def __init__(self, text: str):
        self.duplicates: list[str] = []
        self.value: Any = json.loads(text, object_pairs_hook=self._pairs, parse_constant=self._constant)

    def _pairs(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj and key not in self.duplicates:
                self.duplicates.append(key)
            obj[key] = value
        return obj

    @staticmethod
    def _constant(name: str) -> Any:
        raise ValueError(f"non-finite number {name} is not JSON")


def _parse_line(line: bytes, where: str, problems: list[str]) -> _Line | None:
    try:
        text = decode_utf8(line, where)
    except CorpusError as exc:
        problems.extend(exc.problems)
        return None
    too_deep = json_depth_rule(text)  # before json, whose recursion would end in a traceback
    if too_deep:
        problems.append(f"{where}: {too_deep}")
        return None
    try:
        parsed = _Line(text)
    except json.JSONDecodeError as exc:
        problems.append(f"{where}: malformed JSON: {exc.msg} at column {exc.colno}")
        return None
    except ValueError as exc:
        problems.append(f"{where}: malformed JSON: {exc}")
        return None
    if not isinstance(parsed.value, dict):
        problems.append(f"{where}: expected a JSON object, got {type(parsed.value).__name__}")
        return None
    return parsed


def _record(obj: dict[str, Any], doc_id: str, where: str, location: str, problems: list[str]) -> SourceRecord | None:
    text, title = obj.get("text"), obj.get("title", "")
    if not isinstance(text, str):
        problems.append(f"{where}: missing 'text' (must be a string)")
        return None
    if not text.strip():
        problems.append(f"{where}: empty 'text'")
        return None
    if not isinstance(title, str):
        problems.append(f"{where}: 'title' must be a string")
        return None
    bad = string_problem(text, "text") or string_problem(title, "title")
    if bad:
        problems.append(f"{where}: {bad}")
        return None
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict):
        problems.append(f"{where}: 'metadata' must be an object, got {shown_value(metadata)}")
        return None
    near_misses = near_miss_problems(metadata, lambda _key: where)
    if near_misses:
        problems.extend(near_misses)
        return None
    before = len(problems)
    kept, not_kept = typed_metadata(
        {k: v for k, v in metadata.items() if k not in SECURITY_KEYS}, lambda _key: where, problems
    )
    if len(problems) > before:
        return None
    return SourceRecord(
        document_id=doc_id,
        title=normalize_text(title).strip(),
        text=normalize_text(text),
        access_scopes=scopes_of(metadata, where, problems),
        source_role=role_of(metadata, where, problems),
        location=location,
        metadata=kept,
        not_kept=tuple(not_kept),
    )


# A .gz corpus is inflated in bounded steps and refused past this size (the default bound on a
# revision's text, ``ragpipe.corpus.bounds``): a 300 KB file can inflate to gigabytes.
MAX_INFLATED_BYTES = 4096 * 1024 * 1024
_STEP = 64 * 1024 * 1024


def _gunzip(raw: bytes, path) -> bytes:
    """The decompressed bytes of every gzip member of ``raw``, at most ``MAX_INFLATED_BYTES``."""
    out, data = bytearray(), raw
    try:
        while data:
            inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)  # one gzip member
            while True:
                out += inflater.decompress(data, _STEP)
                if len(out) > MAX_INFLATED_BYTES:
                    raise CorpusError([f"{path}: inflates to more than {MAX_INFLATED_BYTES:,} bytes (refused unread)"])
                data = inflater.unconsumed_tail
                if inflater.eof or not data:
                    break
            if not inflater.eof:
                raise CorpusError(
                    [f"{path}: cannot read corpus file: compressed file ended before the end-of-stream marker"]
                )
            data = inflater.unused_data.lstrip(b"\0")  # concatenated members (and gzip's zero padding)
    except zlib.error as exc:
        raise CorpusError([f"{path}: cannot read corpus file: {exc}"]) from None
    return bytes(out)


def parse_beir(source: BeirSource) -> CorpusRead:
    """Parse the bytes held by ``source`` (never re-reading the file)."""
    path, raw = source.path, source.raw
    if path.suffix == ".gz":
        raw = _gunzip(raw, path)
    problems: list[str] = []
    records: list[SourceRecord] = []
    first_line: dict[str, tuple[int, str]] = {}  # NFC ID -> (line, ID as written)
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for lineno, line in enumerate(lines, start=1):
        where = f"{path}:{lineno}"
        if not line.strip():
            problems.append(f"{where}: empty line")
            continue
        parsed = _parse_line(line, where, problems)
        if parsed is None:
            continue
        obj = parsed.value
        raw_id = obj.get("_id")
        id_ok = isinstance(raw_id, str) and bool(raw_id.strip()) and "_id" not in parsed.duplicates
        doc_id = normalize_id(raw_id) if id_ok else ""
        located = f"{where} [id={shown_id(doc_id)}]" if id_ok else where
        if parsed.duplicates:
            problems.extend(f"{located}: duplicate key {key!r} in a JSON object" for key in parsed.duplicates)
            continue
        if not id_ok:
            problems.append(f"{where}: missing or empty '_id'")
            continue
        rule = id_problem(doc_id)
        if rule:
            problems.append(f"{located}: {rule}")
            continue
        unknown = sorted(set(obj) - FIELDS)
        if unknown:
            problems.append(f"{located}: unknown field(s) {', '.join(unknown)}")
            continue
        if doc_id in first_line:
            first, written = first_line[doc_id]
            after_nfc = " after NFC normalization" if written != raw_id else ""
            problems.append(f"{located}: duplicate document ID{after_nfc} (first seen on line {first})")
            continue
        first_line[doc_id] = (lineno, raw_id)
        record = _record(obj, doc_id, located, where, problems)
        if record is not None:
            records.append(record)
    if not records and not problems:
        problems.append(f"{path}: corpus has no documents")
    if problems:
        raise CorpusError(problems)
    return CorpusRead(records)
