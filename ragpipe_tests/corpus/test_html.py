"""Folders of HTML pages (``--format html``): main content, metadata, exclusions, refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ragpipe.chunking.models import read_chunks
from ragpipe.corpus import source as source_module
from ragpipe.corpus.connectors import detect_format, read_corpus, source_digest
from ragpipe.corpus.html import render_fragment
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.registry import list_revisions, load_revision, read_registered_corpus, register_revision
from ragpipe.corpus.snapshot import build_snapshot, read_snapshot
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages import steps
from ragpipe.stages.stage_store import read_output
from ragpipe_tests.support.corpus_formats import INSTALL_TEXT, ragpipe, sphinx_page, sphinx_site

NOT_HTML = "not a .html or .htm file (any letter case; --format html): not read"


def write(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return root


def meta(record) -> dict:
    return {k: v.as_json() for k, v in record.metadata.items()}


def test_a_sphinx_page_is_its_main_content_with_title_metadata_and_element_path(tmp_path: Path):
    site = sphinx_site(tmp_path / "html")
    read = read_corpus(site, "html")
    records = {r.document_id: r for r in read}
    assert sorted(records) == ["index.html", "install.html"]
    page = records["install.html"]
    # navigation bar, sidebar (search form, its script), footer, <head>, permalink ¶ all gone
    assert page.text == INSTALL_TEXT
    for boilerplate in ("Navigation", "Quick search", "Copyright", "MathJax", "¶", "Table of Contents"):
        assert boilerplate not in page.text
    assert page.title == "Installing Widget"
    assert page.location == str(site / "install.html")
    assert (page.access_scopes, page.source_role, page.pages) == (None, "primary", ())
    assert meta(page) == {
        "source_file": "install.html",
        "element_path": "/html/body/div[2]/div[1]/div/div",  # div.document > .documentwrapper > .bodywrapper > .body
        "canonical_url": "https://docs.example.com/install.html",
        "html.lang": "en",
        "html.title": "Installing Widget — Widget 2.1 documentation",
        "meta.description": "How to install Widget",
        "meta.keywords": ["install", "setup"],  # given twice: a list
        "meta.og.title": "Installing Widget",  # og:title; viewport (a rendering hint) is not kept
    }
    assert page.not_kept == ()
    # every entry not read is listed with its reason
    assert [(e.document_id, e.reason) for e in read.excluded] == [
        (".buildinfo", "hidden file: not read"),
        ("_sources/install.rst.txt", NOT_HTML),
        ("_static/basic.css", NOT_HTML),
        ("_static/doctools.js", NOT_HTML),
        ("objects.inv", NOT_HTML),
        ("old/setup.html", "redirect page (meta refresh '0; url=install.html'), no main content: not read"),
        ("searchindex.js", NOT_HTML),
    ]


def test_the_main_element_is_the_landmark_then_its_only_article_else_the_body(tmp_path: Path):
    mkdocs = """<html><head><title>Guide - Site</title></head><body>
<header class="md-header"><nav>Site  Home</nav></header>
<main class="md-main"><div class="md-sidebar"><nav class="md-nav">Guide Setup</nav></div>
<div class="md-content"><article class="md-content__inner"><h1 id="guide">Guide<a class="headerlink" href="#guide">&para;</a></h1>
<p>Read   this first.</p><h2>Setup</h2><p>Then this.</p></article></div></main>
<footer>Made with Material</footer></body></html>"""
    plain = """<html><head><title>Plain page</title></head><body>
<header><h1>Site name</h1></header><nav><a href="/">Home</a></nav>
<p>Just a paragraph.</p><aside>Related posts</aside><div hidden>Hidden</div><span aria-hidden="true">x</span>
<footer>(c) us</footer></body></html>"""
    records = {r.document_id: r for r in read_corpus(write(tmp_path / "s", {"g.htm": mkdocs, "P.HTML": plain}), "html")}
    assert records["g.htm"].text == "# Guide\n\nRead this first.\n\n## Setup\n\nThen this.\n"
    assert meta(records["g.htm"])["element_path"] == "/html/body/main/div[2]/article"
    assert records["P.HTML"].text == "Just a paragraph.\n"  # no landmark: the body, less its header
    assert records["P.HTML"].title == "Plain page"  # no heading left: <title>
    assert meta(records["P.HTML"])["element_path"] == "/html/body"


def test_a_page_without_main_content_is_excluded_and_a_site_of_them_refused(tmp_path: Path):
    search = sphinx_page(
        "Search", "<form><input name=q></form><script>search()</script>", canonical="s", description=""
    )
    site = write(tmp_path / "s", {"search.html": search, "ok.html": "<main><p>Content.</p></main>"})
    read = read_corpus(site, "html")
    assert [r.document_id for r in read] == ["ok.html"]
    assert [(e.document_id, e.reason) for e in read.excluded] == [
        (
            "search.html",
            "no main content (nothing left once navigation, scripts and boilerplate are dropped): not read",
        )
    ]
    (site / "ok.html").unlink()
    (site / "logo.png").write_bytes(b"\x89PNG")
    with pytest.raises(CorpusError) as refused:
        read_corpus(site, "html")
    assert refused.value.problems == [
        f"{site}: no HTML pages with main content found (2 excluded: logo.png: {NOT_HTML}; "
        "search.html: no main content (nothing left once navigation, scripts and boilerplate are dropped): not read)"
    ]


def test_pages_are_decoded_by_their_declared_charset_and_refused_in_one_line_otherwise(tmp_path: Path):
    latin = '<html><head><meta charset="iso-8859-1"><title>Caf\xe9</title></head><body><main><p>Cr\xe8me br\xfbl\xe9e \u20ac 5</p></main></body></html>'
    equiv = '<html><head><meta http-equiv="Content-Type" content="text/html; charset=windows-1252"></head><body><p>na\xefve</p></body></html>'
    bom = b"\xef\xbb\xbf<main><p>caf\xc3\xa9</p></main>"
    site = write(
        tmp_path / "s",
        {"latin.html": latin.encode("cp1252"), "equiv.html": equiv.encode("cp1252"), "bom.html": bom},
    )
    records = {r.document_id: r for r in read_corpus(site, "html")}
    assert records["latin.html"].text == "Crème brûlée € 5\n"  # Latin-1 is read as windows-1252
    assert records["latin.html"].title == "Café"
    assert records["equiv.html"].text == "naïve\n"
    assert records["bom.html"].text == "café\n"
    bad = b"<main><p>caf\xe9</p></main>"  # Latin-1 bytes, no declaration: UTF-8, strictly
    undefined = b'<meta charset="windows-1252"><main><p>\x81</p></main>'  # no such windows-1252 byte
    write(
        site,
        {"bad.html": bad, "klingon.html": b'<meta charset="x-klingon"><p>tlhIngan</p>', "undefined.html": undefined},
    )
    with pytest.raises(CorpusError) as refused:
        read_corpus(site, "html")
    assert refused.value.problems == [
        f"{site / 'bad.html'} [id=bad.html]: invalid UTF-8 at byte {bad.index(0xE9)} (no <meta charset>: pages are read as UTF-8)",
        f"{site / 'klingon.html'} [id=klingon.html]: unknown charset 'x-klingon' (declared by <meta> as 'x-klingon')",
        f"{site / 'undefined.html'} [id=undefined.html]: invalid cp1252 at byte {undefined.index(0x81)} (declared by <meta> as 'windows-1252')",
    ]


def test_a_meta_tag_cannot_set_an_audience(tmp_path: Path):
    """HTML pages take the revision's default scope: a <meta> meant to restrict is refused, never
    kept as metadata (which would publish the page under the default scope)."""
    site = write(
        tmp_path / "s",
        {
            "hr.html": '<meta name="access_scopes" content="hr"><main><p>Salaries.</p></main>',
            "role.html": '<meta name="ragpipe:Source-Role" content="faq"><main><p>Q.</p></main>',
        },
    )
    with pytest.raises(CorpusError) as refused:
        read_corpus(site, "html")
    assert refused.value.problems == [
        f"{site / 'hr.html'} [id=hr.html]: <meta name='access_scopes'> cannot set a page's audience (HTML pages "
        "take the revision's default scope): remove it, or build restricted pages as a revision of their own",
        f"{site / 'role.html'} [id=role.html]: <meta name='ragpipe:Source-Role'> cannot set a page's audience (HTML "
        "pages take the revision's default scope): remove it, or build restricted pages as a revision of their own",
    ]


def test_a_page_over_the_byte_bound_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(source_module.DOCUMENT_BYTE_LIMITS, "html", 64)
    site = write(tmp_path / "s", {"big.html": "<main><p>" + "x" * 100 + "</p></main>", "ok.html": "<p>fine</p>"})
    with pytest.raises(CorpusError) as refused:
        read_corpus(site, "html")
    assert refused.value.problems == [
        f"{site / 'big.html'} [id=big.html]: file of 120 bytes is over the html document limit (64 bytes)"
    ]


def test_rendering_keeps_structure_and_survives_deep_nesting():
    html = (
        "<p>one<br>two</p><ul><li>a<ul><li>b</li></ul>after</li></ul><ol><li>x</li></ol>"
        "<blockquote><p>quoted</p></blockquote><pre>```\ncode\n```</pre><table><tr><td>k</td><td><p>v</p></td></tr></table>"
    )
    assert render_fragment(html) == (
        "one\ntwo\n\n- a\n  - b\n  after\n\n1. x\n\n> quoted\n\n````\n```\ncode\n```\n````\n\nk | v\n"
    )
    assert render_fragment("<div>" * 5000 + "deep" + "</div>" * 5000) == "deep\n"


def test_html_folders_have_their_own_digest_and_detection_stays(tmp_path: Path):
    site = sphinx_site(tmp_path / "html")
    assert source_digest(site, "html") != source_digest(site, "markdown")
    assert detect_format(site) == "markdown"  # a folder is Markdown unless --format says otherwise
    before = source_digest(site, "html")
    (site / "_static" / "new.js").write_bytes(b"1")
    assert source_digest(site, "html") != before  # exclusions are part of the digest


def test_registration_snapshot_and_chunks_of_a_site(tmp_path: Path):
    """Register, snapshot, chunk: spans index the extracted text exactly and the heading path of a
    chunk is the page's breadcrumb."""
    site = sphinx_site(tmp_path / "html")
    ws = Workspace(tmp_path / "home")
    spec = load_pipeline_spec()
    record, new = register_revision(ws.registry, "site-1", site, "html", "public")
    assert new and record.format == "html" and record.wxr_statuses is None
    assert "wxr_statuses" not in json.loads((ws.registry / "site-1.json").read_text())
    steps.run_source_snapshot(ws, "site-1", spec)
    steps.run_chunks(ws, "site-1", spec)
    documents, summary = read_snapshot(read_output(ws, "site-1", "source_snapshot").path)
    assert [d.document_id for d in documents] == ["index.html", "install.html"]
    assert {e.document_id for e in summary.excluded} >= {"old/setup.html", "_static/basic.css"}
    assert summary.metadata_fields["element_path"] == {"string": 2}
    chunks = read_chunks(read_output(ws, "site-1", "chunks").path / "chunks.parquet")
    text = {d.document_id: d.text.encode("utf-8") for d in documents}
    for chunk in chunks:
        assert text[chunk.document_id][chunk.byte_start : chunk.byte_end].decode("utf-8") == chunk.text
    paths = {c.heading_path for c in chunks if c.document_id == "install.html"}
    assert ("Installing Widget", "From source") in paths
    # the default scope applies; the snapshot is the same as building it from the registry directly
    docs, again = build_snapshot(read_registered_corpus(record), "site-1", "public", spec.snapshot)
    assert again.corpus_digest == summary.corpus_digest and docs[0].access_scopes == ("public",)


def test_nothing_is_registered_when_a_page_is_refused(tmp_path: Path):
    site = write(tmp_path / "s", {"ok.html": "<main><p>fine</p></main>", "bad.html": b"<p>\xff</p>"})
    with pytest.raises(CorpusError, match=r"bad.html \[id=bad.html\]: invalid UTF-8 at byte 3"):
        register_revision(tmp_path / "reg", "s-1", site, "html", "public")
    assert list_revisions(tmp_path / "reg") == []
    with pytest.raises(CorpusError, match="not a directory"):
        register_revision(tmp_path / "reg", "s-1", site / "ok.html", "html", "public")
    assert list_revisions(tmp_path / "reg") == []


def test_symbolic_links_in_a_site_are_excluded(tmp_path: Path):
    site = write(tmp_path / "s", {"a.html": "<main><p>A page.</p></main>"})
    os.symlink("/etc/passwd", site / "passwd.html")
    read = read_corpus(site, "html")
    assert [(e.document_id, e.reason) for e in read.excluded] == [("passwd.html", "symbolic link: not followed")]


def test_build_cli_html(tmp_path: Path):
    """``ragpipe build SITE --format html``: registered, snapshotted, chunked, embedded, indexed."""
    site = sphinx_site(tmp_path / "html")
    done = ragpipe(
        "build",
        str(site),
        "--format",
        "html",
        "--revision",
        "site-1",
        "--default-scope",
        "public",
        "--json",
        home=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["documents"], summary["excluded"]) == (2, 7)
    record = load_revision(tmp_path / "ragpipe" / "revisions", "site-1")
    assert (record.format, record.default_scope) == ("html", "public")
    refused = ragpipe(
        "build", str(site), "--format", "html", "--revision", "site-2", "--wxr-status", "draft", home=tmp_path
    )
    assert refused.returncode == 1
    assert "--wxr-status applies to --format wxr only" in refused.stderr
