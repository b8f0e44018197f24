"""Corpus readers, timed: documents and bytes per second for every corpus format.

    python -m benchmarks.corpus_formats_bench --scifact PATH [--documents 600]
        [--root DIR] [--repeats 3]

The first ``--documents`` SciFact abstracts (title and text) are written once in each format, as a
team would have them: BEIR JSONL with metadata, a Markdown folder with Hugo-style front matter, a
Sphinx-like HTML site (navigation, sidebar, footer, scripts around the main content), a folder of
PDFs written by fpdf2 (the abstract over two pages, in Latin-1: fpdf2's core fonts) and a WordPress export of WooCommerce products
(SKU, price, categories, tags). For each, the reader runs as registration runs it —
``load_source`` (walk and read the bytes) then ``parse_source`` (validate, extract, normalise, type
the metadata) — ``--repeats`` times; the best run is reported as documents/s and source MB/s.
Prints one JSON object per format.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import tempfile
import time
from pathlib import Path

from benchmarks.scifact import add_scifact_argument
from ragpipe.corpus.connectors import load_source, parse_source
from ragpipe_tests.support.corpus_formats import pdf_bytes, sphinx_page, wxr_export, wxr_item


def abstracts(scifact: Path, n: int) -> list[dict]:
    out = []
    with gzip.open(scifact / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            if doc["text"].strip():
                out.append(doc)
            if len(out) == n:
                break
    return out


def _year(i: int) -> int:
    return 2000 + (i * 7) % 25


def write_all(root: Path, docs: list[dict]) -> dict[str, Path]:
    """Every format's corpus under ``root``; returns format -> path."""
    paths = {f: root / f for f in ("beir", "markdown", "html", "pdf")} | {"wxr": root / "shop.xml"}
    with paths["beir"].with_suffix(".jsonl").open("w", encoding="utf-8") as fh:
        for i, d in enumerate(docs):
            meta = {"year": _year(i), "category": ("faq", "guide", "policy")[i % 3], "tags": ["a", "b"][: 1 + i % 2]}
            fh.write(json.dumps({"_id": d["_id"], "title": d["title"], "text": d["text"], "metadata": meta}) + "\n")
    paths["beir"] = paths["beir"].with_suffix(".jsonl")
    for fmt in ("markdown", "html", "pdf"):
        paths[fmt].mkdir()
    items = []
    for i, d in enumerate(docs):
        title = d["title"].replace('"', "'")
        front = f'---\ntitle: "{title}"\ndate: {_year(i)}-05-01\ntags: [science, y{_year(i)}]\nweight: {i}\n---\n'
        (paths["markdown"] / f"{d['_id']}.md").write_text(front + d["text"] + "\n", encoding="utf-8")
        page = sphinx_page(
            d["title"], f"<p>{d['text']}</p>", canonical=f"https://docs.example/{d['_id']}.html", description=title
        )
        (paths["html"] / f"{d['_id']}.html").write_text(page, encoding="utf-8")
        # fpdf2's core fonts hold Latin-1 only: other characters become "?" in the PDFs
        words = d["text"].encode("latin-1", "replace").decode("latin-1").split()
        half = len(words) // 2
        (paths["pdf"] / f"{d['_id']}.pdf").write_bytes(
            pdf_bytes(
                [" ".join(words[:half]) or "x", " ".join(words[half:]) or "y"],
                title=title[:80].encode("latin-1", "replace").decode("latin-1"),
            )
        )
        meta = (("_sku", f"SKU-{i:05d}"), ("_price", f"{10 + i % 90}.99"))
        terms = (("product_cat", ("Books", "Lab", "Kits")[i % 3]), ("product_tag", f"y{_year(i)}"))
        items.append(wxr_item(1000 + i, d["title"], f"<p>{d['text']}</p>", post_type="product", terms=terms, meta=meta))
    paths["wxr"].write_bytes(wxr_export(items))
    return paths


def source_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def time_reader(path: Path, fmt: str, repeats: int) -> dict[str, float | int | str]:
    best, documents = float("inf"), 0
    for _ in range(repeats):
        started = time.perf_counter()
        records = parse_source(load_source(path, fmt))
        best = min(best, time.perf_counter() - started)
        documents = len(records)
    size = source_bytes(path)
    return {
        "format": fmt,
        "documents": documents,
        "source_mb": round(size / 1e6, 2),
        "best_seconds": round(best, 3),
        "documents_per_second": round(documents / best, 1),
        "mb_per_second": round(size / 1e6 / best, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    add_scifact_argument(ap)
    ap.add_argument("--documents", type=int, default=600)
    ap.add_argument("--root", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    docs = abstracts(args.scifact, args.documents)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        paths = write_all(root, docs)
        for fmt in ("beir", "markdown", "html", "pdf", "wxr"):
            row = time_reader(paths[fmt], fmt, args.repeats)
            print(json.dumps({**row, "python": platform.python_version()}), flush=True)


if __name__ == "__main__":
    main()
