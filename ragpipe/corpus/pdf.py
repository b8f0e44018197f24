"""Folder of PDF files: one document per ``.pdf`` file (any case), its text read page by page.

Reading is pypdf (pure Python, maintained, no native code to build, its own bounds on
decompression): each page's text layer as pypdf extracts it (``extract_text()``), each line's
trailing spaces removed, the page stripped of blank lines at its ends. The document's text is the
pages that have text, in order, separated by a blank line and normalised (``utf8-nfc-lf/v1``);
``SourceRecord.pages`` records where each page starts — ``(UTF-8 byte offset, page number)``, the
number being the page's position in the file (1-based), so a span says which pages it is on.

There is no OCR. A page with no text is left out and listed in the exclusions (document ID the
file's, location ``file#page=N``): ``page N has no text layer, only images (scanned? no OCR): not
read``, or ``page N has no text: not read`` for a blank page. A file none of whose pages has text is
excluded as a whole with the same kind of reason.

A file is refused, one line each, when it is encrypted with a password (a file encrypted with an
empty user password — restrictions on printing or copying only — opens and is read), when it is
not a PDF or is damaged beyond what pypdf repairs (``malformed PDF: …``), and when it is larger
than ``DOCUMENT_BYTE_LIMITS["pdf"]`` (the walker refuses it unread). Nothing pypdf raises escapes
as a traceback.

Typed metadata: ``source_file`` (path relative to the folder), ``pdf.page_count``, and the
document information dictionary when present: ``pdf.title``, ``pdf.author``, ``pdf.subject``,
``pdf.keywords``, ``pdf.creator``, ``pdf.producer`` (strings), ``pdf.created``, ``pdf.modified``
(datetimes, UTC when the file gives a time zone). The title is ``pdf.title`` when it is not blank,
else the file stem. Documents take the revision's default scope and role ``primary``.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ragpipe.corpus.metadata import typed_metadata
from ragpipe.corpus.models import Exclusion
from ragpipe.corpus.normalize import normalize_text
from ragpipe.corpus.records import DEFAULT_SOURCE_ROLE, CorpusRead, SourceRecord
from ragpipe.corpus.source import SourceFile, TreeSource, parse_folder

PAGE_SEPARATOR = "\n\n"
_INFO_STRINGS = {
    "title": "pdf.title",
    "author": "pdf.author",
    "subject": "pdf.subject",
    "keywords": "pdf.keywords",
    "creator": "pdf.creator",
    "producer": "pdf.producer",
}
_INFO_DATES = {"creation_date": "pdf.created", "modification_date": "pdf.modified"}
_SHOWN_ERROR_CHARS = 160


@contextmanager
def _quiet_pypdf() -> Iterator[None]:
    """pypdf logs what it repairs ("EOF marker not found" …) as warnings; a file it cannot read
    becomes one problem line here, so its log would only repeat it on stderr."""
    logger = logging.getLogger("pypdf")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _page_text(raw: str) -> str:
    lines = [line.rstrip() for line in normalize_text(raw).split("\n")]
    return "\n".join(lines).strip("\n")


def _has_images(page: Any) -> bool:
    try:
        return len(page.images) > 0
    except Exception:  # an image pypdf cannot decode is still an image
        return True


if TYPE_CHECKING:  # pypdf is imported by the reader only: query processes import this module too
    from pypdf import PdfReader


def _info(reader: PdfReader) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The document information dictionary as raw metadata, and the fields that do not read."""
    raw: dict[str, Any] = {}
    not_kept: list[tuple[str, str]] = []
    try:
        info = reader.metadata
    except Exception:
        return raw, [("pdf.info", "the document information dictionary does not read")]
    if info is None:
        return raw, not_kept
    for attr, key in {**_INFO_STRINGS, **_INFO_DATES}.items():
        try:
            value = getattr(info, attr)
        except Exception:  # a date pypdf cannot parse, a string it cannot decode
            not_kept.append((key, "a value pypdf cannot read"))
            continue
        if isinstance(value, str):
            value = normalize_text(str(value)).strip() or None
        raw[key] = value
    return raw, not_kept


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "no detail"
    return text if len(text) <= _SHOWN_ERROR_CHARS else text[: _SHOWN_ERROR_CHARS - 1] + "…"


def _document(
    file: SourceFile, doc_id: str, where: str, problems: list[str], excluded: list[Exclusion]
) -> SourceRecord | None:
    from pypdf import PasswordType, PdfReader  # 0.2-0.6 s of imports: only where a PDF is read

    try:
        reader = PdfReader(io.BytesIO(file.data), strict=False)
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("") != PasswordType.NOT_DECRYPTED
            except Exception as exc:  # an encryption pypdf cannot undo
                problems.append(f"{where}: encrypted PDF: cannot be decrypted ({type(exc).__name__}: {_short(exc)})")
                return None
            if not opened:
                problems.append(f"{where}: encrypted PDF: it needs a password to open (decrypt it, or remove it)")
                return None
        pages: list[tuple[int, str]] = []
        blank: list[tuple[int, bool]] = []  # (page number, has images)
        for number, page in enumerate(reader.pages, start=1):
            text = _page_text(page.extract_text() or "")
            if text.strip():
                pages.append((number, text))
            else:
                blank.append((number, _has_images(page)))
        info, not_kept = _info(reader)
        count = len(reader.pages)
    except Exception as exc:  # pypdf raises many kinds on damaged input: each file is one line
        problems.append(f"{where}: malformed PDF: {type(exc).__name__}: {_short(exc)}")
        return None
    location = str(file.path)
    if not pages:
        scanned = sum(1 for _, images in blank if images)
        reason = (
            f"no page has a text layer ({count} pages, {scanned} with only images: scanned? no OCR): not read"
            if count
            else "no pages: not read"
        )
        excluded.append(Exclusion(document_id=doc_id, location=location, reason=reason))
        return None
    for number, images in blank:
        reason = (
            f"page {number} has no text layer, only images (scanned? no OCR): not read"
            if images
            else f"page {number} has no text: not read"
        )
        excluded.append(Exclusion(document_id=doc_id, location=f"{location}#page={number}", reason=reason))
    starts: list[tuple[int, int]] = []
    offset = 0
    for number, text in pages:
        starts.append((offset, number))
        offset += len(text.encode("utf-8")) + len(PAGE_SEPARATOR)
    text = PAGE_SEPARATOR.join(t for _, t in pages) + "\n"
    if normalize_text(text) != text:  # pages are NFC and end at a line break: never expected
        problems.append(f"{where}: extracted text does not stay normalised across page breaks")
        return None
    before = len(problems)
    raw = {"source_file": file.rel, "pdf.page_count": count, **info}
    kept, more_not_kept = typed_metadata(raw, lambda _key: where, problems)
    if len(problems) > before:
        return None
    title = str(info.get("pdf.title") or "") or file.path.stem
    return SourceRecord(
        document_id=doc_id,
        title=normalize_text(title).strip(),
        text=text,
        access_scopes=None,
        source_role=DEFAULT_SOURCE_ROLE,
        location=location,
        metadata=kept,
        not_kept=tuple(not_kept + more_not_kept),
        pages=tuple(starts),
    )


def parse_pdf_tree(tree: TreeSource) -> CorpusRead:
    """Parse the PDF files held by ``tree`` (never re-reading them); raise every problem at once."""
    with _quiet_pypdf():
        return parse_folder(tree, _document, "PDF files with a text layer")
