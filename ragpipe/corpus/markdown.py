"""Folder of Markdown/text files: one document per ``.md``/``.mdx``/``.markdown``/``.txt`` file (any
case). MDX is read as Markdown: its ``import`` lines and JSX elements stay in the text as written.

Document ID = the file's path relative to the root, NFC-normalised, obeying
``ragpipe.corpus.rules`` (two files whose paths are equal after NFC are refused). Optional front
matter (``ragpipe.corpus.front_matter``) sets ``title``, ``access_scopes`` and ``source_role``;
every other key is kept as typed document metadata (``ragpipe.corpus.metadata``), and a near miss
of a security key is refused (``metadata.near_miss_problems``). The title otherwise is the first
``# `` heading or the file stem. The text is the
body after the front matter. Which entries are read, and which are excluded with a reason (hidden
entries, other suffixes, symbolic links, special files), is decided by ``ragpipe.corpus.source``. Problems read
``file[:line] [id=…]: rule``, the line being the front-matter line at fault.
"""

from __future__ import annotations

from collections.abc import Callable

from ragpipe.corpus.front_matter import split_front_matter
from ragpipe.corpus.metadata import near_miss_problems, typed_metadata
from ragpipe.corpus.models import Exclusion
from ragpipe.corpus.normalize import CorpusError, decode_utf8, normalize_text
from ragpipe.corpus.records import CorpusRead, SourceRecord, role_of, scopes_of, shown_value
from ragpipe.corpus.rules import id_problem, normalize_id, shown_id
from ragpipe.corpus.source import SourceFile, TreeSource, escaped_path

CORE_KEYS = ("title", "access_scopes", "source_role")
_SHOWN_EXCLUSIONS = 3


def _first_heading(body: str) -> str | None:
    for line in body.split("\n"):
        if line.startswith("# "):
            return line[2:].strip()
    return None


def _record(
    file: SourceFile, doc_id: str, where: Callable[[int | None], str], problems: list[str]
) -> SourceRecord | None:
    try:
        text = normalize_text(decode_utf8(file.data, where(None)))
    except CorpusError as exc:
        problems.extend(exc.problems)
        return None
    front, refused = split_front_matter(text)
    problems.extend(f"{where(line)}: {rule}" for line, rule in refused)
    if front is None:
        return None
    meta, key_line = front.meta, lambda key: where(front.key_lines.get(str(key), 1))
    near_misses = near_miss_problems(meta, key_line)
    if near_misses:
        problems.extend(near_misses)
        return None
    before = len(problems)
    kept, not_kept = typed_metadata({k: v for k, v in meta.items() if k not in CORE_KEYS}, key_line, problems)
    if len(problems) > before:
        return None
    if not front.body.strip():
        problems.append(f"{where(None)}: empty text")
        return None
    title = meta.get("title")
    if "title" in meta and not isinstance(title, str):
        problems.append(f"{key_line('title')}: front-matter 'title' must be a string, got {shown_value(title)}")
        return None
    return SourceRecord(
        document_id=doc_id,
        title=normalize_text(title or _first_heading(front.body) or file.path.stem).strip(),
        text=front.body,
        access_scopes=scopes_of(meta, key_line("access_scopes"), problems),
        source_role=role_of(meta, key_line("source_role"), problems),
        location=str(file.path),
        metadata=kept,
        not_kept=tuple(not_kept),
    )


def _no_documents(tree: TreeSource, excluded: list[Exclusion]) -> str:
    message = f"{escaped_path(tree.root)}: no Markdown or text files found"
    if not excluded:
        return message
    shown = "; ".join(f"{shown_id(e.document_id)}: {e.reason}" for e in excluded[:_SHOWN_EXCLUSIONS])
    more = f"; … and {len(excluded) - _SHOWN_EXCLUSIONS} more" if len(excluded) > _SHOWN_EXCLUSIONS else ""
    return f"{message} ({len(excluded)} excluded: {shown}{more})"


def parse_tree(tree: TreeSource) -> CorpusRead:
    """Parse the files held by ``tree`` (never re-reading them); raise every problem at once."""
    problems = list(tree.problems)
    records: list[SourceRecord] = []
    first_seen: dict[str, SourceFile] = {}  # NFC ID -> its first file
    for file in tree.files:
        doc_id = normalize_id(file.rel)
        location = escaped_path(file.path)

        def where(line: int | None, _loc: str = location, _id: str = doc_id) -> str:
            return f"{_loc}{'' if line is None else f':{line}'} [id={shown_id(_id)}]"

        rule = id_problem(doc_id)
        if rule:
            problems.append(f"{where(None)}: {rule}")
            continue
        if doc_id in first_seen:
            first = first_seen[doc_id]
            problems.append(
                f"{where(None)}: duplicate document ID after NFC normalization: {ascii(file.rel)} and "
                f"{ascii(first.rel)} (first seen at {escaped_path(first.path)})"
            )
            continue
        first_seen[doc_id] = file
        record = _record(file, doc_id, where, problems)
        if record is not None:
            records.append(record)
    excluded = [
        Exclusion(document_id=normalize_id(e.rel), location=str(e.path), reason=e.reason) for e in tree.excluded
    ]
    if not records and not problems:
        problems.append(_no_documents(tree, excluded))
    if problems:
        raise CorpusError(problems)
    return CorpusRead(records, excluded)
