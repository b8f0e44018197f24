"""Corpus connectors: BEIR-style JSONL(.gz) files and folders of Markdown/text files.

Both yield ``SourceRecord``s (normalised, validated, with the file/line they came from) or raise
``CorpusError`` listing every problem as ``file:line [id=…]: rule``. Nothing is returned when any
record is bad, so a bad corpus can never be half-registered.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ragpipe.corpus.models import SCOPE_PATTERN
from ragpipe.corpus.normalize import CorpusError, decode_utf8, normalize_text
from ragpipe.kernel.ids import bytes_digest, content_id

CorpusFormat = Literal["beir", "markdown"]
MARKDOWN_SUFFIXES = (".md", ".markdown", ".txt")
FRONT_MATTER_KEYS = ("title", "access_scopes", "source_role")
DEFAULT_SOURCE_ROLE = "primary"


@dataclass(frozen=True)
class SourceRecord:
    document_id: str
    title: str
    text: str
    access_scopes: tuple[str, ...] | None  # None: the revision's default scope applies
    source_role: str
    location: str
    ignored_metadata_keys: tuple[str, ...] = field(default=())


def _scopes(value: Any, where: str, problems: list[str]) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(s, str) for s in value):
        problems.append(f"{where}: access_scopes must be a non-empty list of strings")
        return None
    bad = [s for s in value if not SCOPE_PATTERN.match(s)]
    if bad:
        problems.append(f"{where}: invalid access scope {bad[0]!r} (allowed: letters, digits, . _ : -)")
        return None
    return tuple(sorted(set(value)))


def _role(value: Any, where: str, problems: list[str]) -> str:
    if value is None:
        return DEFAULT_SOURCE_ROLE
    if not isinstance(value, str) or not SCOPE_PATTERN.match(value):
        problems.append(f"{where}: source_role must be a short identifier string, got {value!r}")
        return DEFAULT_SOURCE_ROLE
    return value


def detect_format(path: Path) -> CorpusFormat:
    return "markdown" if path.is_dir() else "beir"


def read_beir(path: Path) -> list[SourceRecord]:
    """Read a BEIR corpus: one JSON object a line with ``_id``, ``title``, ``text``, optional
    ``metadata`` (``access_scopes``, ``source_role``; other metadata keys are reported as ignored)."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise CorpusError([f"{path}: cannot read corpus file: {exc}"]) from None
    problems: list[str] = []
    records: list[SourceRecord] = []
    first_line: dict[str, int] = {}
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for lineno, line in enumerate(lines, start=1):
        where = f"{path}:{lineno}"
        if not line.strip():
            problems.append(f"{where}: empty line")
            continue
        try:
            obj = json.loads(decode_utf8(line, where))
        except CorpusError as exc:
            problems.extend(exc.problems)
            continue
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: malformed JSON: {exc.msg} at column {exc.colno}")
            continue
        if not isinstance(obj, dict):
            problems.append(f"{where}: expected a JSON object, got {type(obj).__name__}")
            continue
        unknown = sorted(set(obj) - {"_id", "title", "text", "metadata"})
        doc_id = obj.get("_id")
        if not isinstance(doc_id, str) or not doc_id.strip():
            problems.append(f"{where}: missing or empty '_id'")
            continue
        where = f"{where} [id={doc_id}]"
        if unknown:
            problems.append(f"{where}: unknown field(s) {', '.join(unknown)}")
            continue
        if doc_id in first_line:
            problems.append(f"{where}: duplicate document ID (first seen on line {first_line[doc_id]})")
            continue
        first_line[doc_id] = lineno
        text = obj.get("text")
        if not isinstance(text, str):
            problems.append(f"{where}: missing 'text' (must be a string)")
            continue
        if not text.strip():
            problems.append(f"{where}: empty 'text'")
            continue
        title = obj.get("title", "")
        if not isinstance(title, str):
            problems.append(f"{where}: 'title' must be a string")
            continue
        metadata = obj.get("metadata") or {}
        if not isinstance(metadata, dict):
            problems.append(f"{where}: 'metadata' must be an object")
            continue
        records.append(
            SourceRecord(
                document_id=normalize_text(doc_id),
                title=normalize_text(title).strip(),
                text=normalize_text(text),
                access_scopes=_scopes(metadata.get("access_scopes"), where, problems),
                source_role=_role(metadata.get("source_role"), where, problems),
                location=f"{path}:{lineno}",
                ignored_metadata_keys=tuple(sorted(set(metadata) - {"access_scopes", "source_role"})),
            )
        )
    if not records and not problems:
        problems.append(f"{path}: corpus has no documents")
    if problems:
        raise CorpusError(problems)
    return records


def _markdown_files(root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        files.extend(
            Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".") and f.endswith(MARKDOWN_SUFFIXES)
        )
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _split_front_matter(text: str, where: str, problems: list[str]) -> tuple[dict[str, Any], str]:
    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---\n", 3)
    if end < 0:
        if text.endswith("\n---"):
            end = len(text) - 4
        else:
            problems.append(f"{where}:1: front matter opened with '---' is never closed")
            return {}, text
    try:
        meta = yaml.safe_load(text[4:end]) or {}
    except yaml.YAMLError as exc:
        problems.append(f"{where}: front matter is not valid YAML: {exc}")
        return {}, text
    if not isinstance(meta, dict):
        problems.append(f"{where}:1: front matter must be a mapping")
        return {}, text
    return meta, text[end + 5 :]


def _first_heading(body: str) -> str | None:
    for line in body.split("\n"):
        if line.startswith("# "):
            return line[2:].strip()
    return None


def read_markdown_folder(root: Path) -> list[SourceRecord]:
    """Read every ``.md``/``.markdown``/``.txt`` file under ``root`` (hidden entries skipped).

    Document ID = path relative to ``root``. Optional YAML front matter may set only ``title``,
    ``access_scopes`` and ``source_role``; the title otherwise is the first ``# `` heading or the
    file stem. The document text is the body after the front matter.
    """
    if not root.is_dir():
        raise CorpusError([f"{root}: not a directory"])
    problems: list[str] = []
    records: list[SourceRecord] = []
    for path in _markdown_files(root):
        rel = path.relative_to(root).as_posix()
        where = f"{path} [id={rel}]"
        try:
            text = normalize_text(decode_utf8(path.read_bytes(), where))
        except CorpusError as exc:
            problems.extend(exc.problems)
            continue
        meta, body = _split_front_matter(text, where, problems)
        unknown = sorted(set(meta) - set(FRONT_MATTER_KEYS))
        if unknown:
            problems.append(f"{where}: unknown front-matter key(s) {', '.join(map(str, unknown))} (allowed: {', '.join(FRONT_MATTER_KEYS)})")
            continue
        if not body.strip():
            problems.append(f"{where}: empty text")
            continue
        title = meta.get("title")
        if title is not None and not isinstance(title, str):
            problems.append(f"{where}: front-matter 'title' must be a string")
            continue
        records.append(
            SourceRecord(
                document_id=rel,
                title=normalize_text(title or _first_heading(body) or path.stem).strip(),
                text=body,
                access_scopes=_scopes(meta.get("access_scopes"), where, problems),
                source_role=_role(meta.get("source_role"), where, problems),
                location=str(path),
            )
        )
    if not records and not problems:
        problems.append(f"{root}: no Markdown or text files found")
    if problems:
        raise CorpusError(problems)
    return records


def read_corpus(path: Path, fmt: CorpusFormat) -> list[SourceRecord]:
    if fmt == "beir":
        if path.is_dir():
            raise CorpusError([f"{path}: is a directory; --format beir expects a JSONL(.gz) file"])
        return read_beir(path)
    return read_markdown_folder(path)


def source_digest(path: Path, fmt: CorpusFormat) -> str:
    """Digest of the raw source bytes, recorded at registration to keep a revision immutable."""
    if fmt == "beir":
        return bytes_digest(path.read_bytes())
    files = [[p.relative_to(path).as_posix(), bytes_digest(p.read_bytes())] for p in _markdown_files(path)]
    return content_id("source-tree", 1, files)
