"""Folders of PDF files (``--format pdf``), written by a PDF library: pages, exclusions, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragpipe.chunking.models import read_chunks
from ragpipe.corpus import source as source_module
from ragpipe.corpus.connectors import read_corpus, source_digest
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.registry import list_revisions, register_revision
from ragpipe.corpus.snapshot import read_snapshot
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages import steps
from ragpipe.stages.stage_store import read_output
from ragpipe_tests.support.corpus_formats import BLANK, IMAGE, pdf_bytes, ragpipe

PAGES = ["Terms of service\nYou agree to the terms.", "Refunds are paid within 14 days.", "Contact: café@example.com"]


def folder(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def page_texts(record) -> dict[int, str]:
    """Each page's text, cut out of the document's UTF-8 bytes at the recorded offsets."""
    data = record.text.encode("utf-8")
    bounds = [start for start, _ in record.pages] + [len(data)]
    return {page: data[bounds[i] : bounds[i + 1]].decode("utf-8") for i, (_, page) in enumerate(record.pages)}


def test_pages_are_exact_byte_offsets_into_the_text(tmp_path: Path):
    root = folder(tmp_path / "pdf", {"terms.pdf": pdf_bytes(PAGES, title="Terms", author="Legal team")})
    (record,) = read_corpus(root, "pdf")
    assert record.text == (
        "Terms of service\nYou agree to the terms.\n\nRefunds are paid within 14 days.\n\nContact: café@example.com\n"
    )
    first, second = len(b"Terms of service\nYou agree to the terms.\n\n"), len(b"Refunds are paid within 14 days.\n\n")
    assert record.pages == ((0, 1), (first, 2), (first + second, 3))
    assert page_texts(record) == {
        1: "Terms of service\nYou agree to the terms.\n\n",
        2: "Refunds are paid within 14 days.\n\n",
        3: "Contact: café@example.com\n",  # é is two bytes: offsets are UTF-8 bytes
    }
    assert (record.document_id, record.title, record.access_scopes, record.source_role) == (
        "terms.pdf",
        "Terms",
        None,
        "primary",
    )
    assert {k: v.as_json() for k, v in record.metadata.items()} == {
        "pdf.author": "Legal team",
        "pdf.created": "2024-05-01T10:00:00Z",
        "pdf.page_count": 3,
        "pdf.title": "Terms",
        "source_file": "terms.pdf",
    }


def test_a_page_without_a_text_layer_is_excluded_and_listed(tmp_path: Path):
    root = folder(tmp_path / "pdf", {"report.PDF": pdf_bytes(["Summary page.", IMAGE, BLANK, "Appendix."])})
    read = read_corpus(root, "pdf")
    (record,) = read
    assert record.title == "report"  # no /Title: the file stem
    assert record.pages == ((0, 1), (len(b"Summary page.\n\n"), 4))
    assert page_texts(record) == {1: "Summary page.\n\n", 4: "Appendix.\n"}
    assert [(e.document_id, e.location, e.reason) for e in read.excluded] == [
        (
            "report.PDF",
            f"{root / 'report.PDF'}#page=2",
            "page 2 has no text layer, only images (scanned? no OCR): not read",
        ),
        ("report.PDF", f"{root / 'report.PDF'}#page=3", "page 3 has no text: not read"),
    ]


def test_a_scanned_document_is_excluded_and_a_folder_of_them_refused(tmp_path: Path):
    root = folder(tmp_path / "pdf", {"scan.pdf": pdf_bytes([IMAGE, IMAGE]), "text.pdf": pdf_bytes(["Text."])})
    read = read_corpus(root, "pdf")
    assert [r.document_id for r in read] == ["text.pdf"]
    reason = "no page has a text layer (2 pages, 2 with only images: scanned? no OCR): not read"
    assert [(e.document_id, e.location, e.reason) for e in read.excluded] == [
        ("scan.pdf", str(root / "scan.pdf"), reason)
    ]
    (root / "text.pdf").unlink()
    with pytest.raises(CorpusError) as refused:
        read_corpus(root, "pdf")
    assert refused.value.problems == [f"{root}: no PDF files with a text layer found (1 excluded: scan.pdf: {reason})"]


def test_encrypted_and_malformed_files_are_one_line_each(tmp_path: Path, capfd: pytest.CaptureFixture[str]):
    good = pdf_bytes(PAGES)
    root = folder(
        tmp_path / "pdf",
        {
            "locked.pdf": pdf_bytes(["Salaries."], user_password="s3cret"),
            "open-locked.pdf": pdf_bytes(["Printing is restricted, reading is not."], user_password=""),
            "truncated.pdf": good[: len(good) // 2],
            "garbage.pdf": b"this is not a PDF at all\n",
            "empty.pdf": b"",
            "ok.pdf": good,
        },
    )
    with pytest.raises(CorpusError) as refused:
        read_corpus(root, "pdf")
    problems = refused.value.problems
    assert [p.split(": ", 1)[0] for p in problems] == [
        f"{root / name} [id={name}]" for name in ("empty.pdf", "garbage.pdf", "locked.pdf", "truncated.pdf")
    ]
    assert problems[2].endswith(": encrypted PDF: it needs a password to open (decrypt it, or remove it)")
    for problem in (problems[0], problems[1], problems[3]):
        assert ": malformed PDF: " in problem and "\n" not in problem and "Traceback" not in problem
    assert "Salaries" not in str(refused.value)
    assert capfd.readouterr().err == ""  # pypdf's repair log does not leak onto stderr
    for name in ("empty.pdf", "garbage.pdf", "locked.pdf", "truncated.pdf"):
        (root / name).unlink()
    records = {r.document_id: r for r in read_corpus(root, "pdf")}
    assert records["open-locked.pdf"].text == "Printing is restricted, reading is not.\n"  # empty user password


def test_a_file_over_the_byte_bound_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    assert source_module.DOCUMENT_BYTE_LIMITS["pdf"] == 50 * 1024 * 1024
    assert source_module.limit_problem(50 * 1024 * 1024 + 1, "pdf", "file") == (
        "file of 52428801 bytes is over the pdf document limit (50 MiB)"
    )
    data = pdf_bytes(PAGES)
    monkeypatch.setitem(source_module.DOCUMENT_BYTE_LIMITS, "pdf", len(data) - 1)
    root = folder(tmp_path / "pdf", {"big.pdf": data})
    with pytest.raises(CorpusError) as refused:
        read_corpus(root, "pdf")
    assert refused.value.problems == [
        f"{root / 'big.pdf'} [id=big.pdf]: file of {len(data)} bytes is over the pdf document limit ({len(data) - 1} bytes)"
    ]


def test_other_files_are_excluded_with_the_format_in_the_reason(tmp_path: Path):
    root = folder(tmp_path / "pdf", {"a.pdf": pdf_bytes(["A."]), "notes.md": b"# Notes\n", ".DS_Store": b"x"})
    read = read_corpus(root, "pdf")
    assert [(e.document_id, e.reason) for e in read.excluded] == [
        (".DS_Store", "hidden file: not read"),
        ("notes.md", "not a .pdf file (any letter case; --format pdf): not read"),
    ]
    assert source_digest(root, "pdf") != source_digest(root, "markdown")


def test_registration_snapshot_and_chunks_say_which_page(tmp_path: Path):
    long_pages = [
        "\n".join(f"Clause {p}.{i}: the customer may cancel at any time." for i in range(1, 20)) for p in (1, 2, 3)
    ]
    root = folder(tmp_path / "pdf", {"contract.pdf": pdf_bytes(long_pages), "scan.pdf": pdf_bytes([IMAGE])})
    ws = Workspace(tmp_path / "home")
    spec = load_pipeline_spec()
    register_revision(ws.registry, "pdf-1", root, "pdf", "legal")
    steps.run_source_snapshot(ws, "pdf-1", spec)
    steps.run_chunks(ws, "pdf-1", spec)
    (document,), summary = read_snapshot(read_output(ws, "pdf-1", "source_snapshot").path)
    assert document.access_scopes == ("legal",)
    assert [p for _, p in document.pages] == [1, 2, 3]
    assert [e.document_id for e in summary.excluded] == ["scan.pdf"]
    chunks = read_chunks(read_output(ws, "pdf-1", "chunks").path / "chunks.parquet")
    data = document.text.encode("utf-8")
    assert len(chunks) >= 3
    seen, spans = set(), []
    for chunk in chunks:
        assert data[chunk.byte_start : chunk.byte_end].decode("utf-8") == chunk.text
        first, last = document.pages_of(chunk.byte_start, chunk.byte_end)
        assert f"Clause {first}." in chunk.text and f"Clause {last}." in chunk.text
        seen.update(range(first, last + 1))
        spans.append((first, last))
    assert seen == {1, 2, 3} and any(first != last for first, last in spans)  # a chunk across a page break


def test_nothing_is_registered_when_a_file_is_refused(tmp_path: Path):
    root = folder(tmp_path / "pdf", {"ok.pdf": pdf_bytes(["Fine."]), "bad.pdf": b"%PDF-1.7\n%%EOF"})
    with pytest.raises(CorpusError, match=r"bad.pdf \[id=bad.pdf\]: malformed PDF: "):
        register_revision(tmp_path / "reg", "pdf-1", root, "pdf", "public")
    assert list_revisions(tmp_path / "reg") == []


def test_build_cli_pdf(tmp_path: Path):
    root = folder(tmp_path / "pdf", {"terms.pdf": pdf_bytes(PAGES), "scan.pdf": pdf_bytes([IMAGE, IMAGE])})
    done = ragpipe(
        "build",
        str(root),
        "--format",
        "pdf",
        "--revision",
        "pdf-1",
        "--default-scope",
        "public",
        "--json",
        home=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["documents"], summary["excluded"]) == (1, 1)
