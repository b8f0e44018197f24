"""WordPress exports (``--format wxr``): posts, pages, WooCommerce products; statuses; hardened XML."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from lxml import etree

from ragpipe.corpus import wxr
from ragpipe.corpus.connectors import detect_format, read_corpus, source_digest
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.registry import (
    RevisionError,
    list_revisions,
    load_revision,
    read_registered_corpus,
    register_revision,
)
from ragpipe.corpus.snapshot import read_snapshot
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages import steps
from ragpipe.stages.stage_store import read_output
from ragpipe_tests.support.corpus_formats import (
    CLASSIC_TEXT,
    HELLO_TEXT,
    WXR_HEAD,
    WXR_TAIL,
    ragpipe,
    shop_items,
    wxr_export,
    wxr_item,
)


def export(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def item_line(data: bytes, post_id: int) -> int:
    """The line of the ``<item>`` holding ``post_id``."""
    lines = data.decode("utf-8").split("\n")
    at = next(i for i, line in enumerate(lines) if f"<wp:post_id>{post_id}</wp:post_id>" in line)
    return max(i for i in range(at) if lines[i].strip() == "<item>") + 1


def item_lines(data: bytes) -> list[int]:
    return [i for i, line in enumerate(data.decode("utf-8").split("\n"), 1) if line.strip() == "<item>"]


def meta(record) -> dict:
    return {k: v.as_json() for k, v in record.metadata.items()}


def test_posts_pages_and_products_are_documents_with_their_fields(tmp_path: Path):
    data = wxr_export(shop_items())
    path = export(tmp_path / "shop.xml", data)
    read = read_corpus(path, "wxr")
    records = {r.document_id: r for r in read}
    assert list(records) == ["post/12", "page/7", "product/31", "product/32"]
    post = records["post/12"]
    assert post.text == HELLO_TEXT  # Gutenberg blocks rendered, their comments gone
    assert post.title == "Gadget Pro is here & ready"  # entities decoded
    assert post.location == f"{path}:{item_line(data, 12)}"
    assert (post.access_scopes, post.source_role) == (None, "primary")
    assert meta(post) == {
        "source_file": "shop.xml",
        "canonical_url": "https://shop.example.com/gadget-pro-is-here/",
        "categories": ["News"],
        "tags": ["launch", "gadgets"],
        "wp.author": "ann",
        "wp.post_date": "2024-05-01T10:00:00Z",
        "wp.post_id": 12,
        "wp.post_modified": "2024-05-02T10:00:00Z",
        "wp.post_type": "post",
        "wp.slug": "gadget-pro-is-here",
        "wp.status": "publish",
    }
    assert records["page/7"].text == CLASSIC_TEXT  # a blank line in classic content is a paragraph
    product = records["product/31"]
    assert (
        product.text
        == "The best gadget we make.\n\nA gadget for professionals.\n\n### Specifications\n\nWeight | 120 g\n"
    )
    assert {k: v for k, v in meta(product).items() if k.startswith(("wc.", "categories", "tags"))} == {
        "categories": ["Gadgets", "Pro line"],
        "tags": ["bestseller"],
        "wc.price": 199.9,
        "wc.product_type": "simple",
        "wc.regular_price": 219.9,
        "wc.sale_price": 199.9,
        "wc.sku": "GP-001",
        "wc.stock_status": "instock",
    }
    assert product.metadata["wc.price"].type == "number"
    assert meta(records["product/32"])["wc.price"] == 15.0  # "15": a number like the others
    assert "Nice post" not in "".join(r.text for r in read)  # comments are not read
    assert [(e.document_id, e.location, e.reason) for e in read.excluded] == [
        (
            "attachment/50",
            f"{path}:{item_line(data, 50)}",
            "post type 'attachment': not read (posts, pages and products are)",
        ),
        (
            "nav_menu_item/70",
            f"{path}:{item_line(data, 70)}",
            "post type 'nav_menu_item': not read (posts, pages and products are)",
        ),
        (
            "post/40",
            f"{path}:{item_line(data, 40)}",
            "status 'draft': not read (statuses read: publish; see --wxr-status)",
        ),
        (
            "post/41",
            f"{path}:{item_line(data, 41)}",
            "status 'private': not read (statuses read: publish; see --wxr-status)",
        ),
        ("post/60", f"{path}:{item_line(data, 60)}", "password-protected: not read"),
    ]


def test_other_statuses_are_read_only_when_asked_and_are_part_of_the_identity(tmp_path: Path):
    path = export(tmp_path / "shop.xml", wxr_export(shop_items()))
    registry = tmp_path / "reg"
    publish, _ = register_revision(registry, "shop-1", path, "wxr", "public")
    private, _ = register_revision(registry, "shop-2", path, "wxr", "public", ("private", "publish", "private"))
    assert (publish.wxr_statuses, private.wxr_statuses) == (("publish",), ("private", "publish"))
    assert publish.source_digest != private.source_digest  # same bytes, other documents: another source
    assert json.loads((registry / "shop-2.json").read_text())["wxr_statuses"] == ["private", "publish"]
    assert "post/41" in {r.document_id for r in read_registered_corpus(private)}
    assert "post/41" not in {r.document_id for r in read_registered_corpus(publish)}
    # building a registered key again needs no flag: its recorded statuses apply
    assert register_revision(registry, "shop-2", path, "wxr", None) == (load_revision(registry, "shop-2"), False)
    with pytest.raises(RevisionError, match=r"already registered with different content .*statuses private,publish\)"):
        register_revision(registry, "shop-2", path, "wxr", "public", ("publish",))
    with pytest.raises(RevisionError, match=r"unknown WordPress status 'trash' \(use one or more of draft, future"):
        register_revision(registry, "shop-3", path, "wxr", "public", ("publish", "trash"))
    with pytest.raises(RevisionError, match=r"--wxr-status applies to --format wxr only"):
        register_revision(registry, "shop-3", tmp_path, "markdown", "public", ("publish",))
    assert list_revisions(registry) == ["shop-1", "shop-2"]
    assert source_digest(path, "wxr") == publish.source_digest


def billion_laughs() -> bytes:
    entities = "".join(f' <!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">\n' for i in range(1, 10))
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE rss [\n <!ENTITY lol0 "lol">\n'
        + entities
        + "]>\n"
        + WXR_HEAD.split("\n", 1)[1]
        + wxr_item(1, "&lol9;", "<p>&lol9;</p>")
        + WXR_TAIL
    ).encode()


def external_entity(secret: Path, before: str = "") -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n{before}<!DOCTYPE rss [<!ENTITY x SYSTEM "file://{secret}">]>\n'
        + WXR_HEAD.split("\n", 1)[1]
        + wxr_item(1, "Leak", "<p>&x;</p>").replace("<![CDATA[<p>&x;</p>]]>", "&x;")
        + WXR_TAIL
    ).encode()


def test_entity_declarations_are_refused_in_one_line_unexpanded(tmp_path: Path):
    bomb = export(tmp_path / "bomb.xml", billion_laughs())
    started = time.monotonic()
    with pytest.raises(CorpusError) as refused:
        read_corpus(bomb, "wxr")
    assert time.monotonic() - started < 1
    assert refused.value.problems == [
        f"{bomb}:2: a DOCTYPE is not allowed in a WordPress export (entities are never expanded, external ones never loaded)"
    ]
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-PASSWORD")
    xxe = export(tmp_path / "xxe.xml", external_entity(secret))
    with pytest.raises(CorpusError) as refused:
        read_corpus(xxe, "wxr")
    assert refused.value.problems == [
        f"{xxe}:2: a DOCTYPE is not allowed in a WordPress export (entities are never expanded, external ones never loaded)"
    ]
    # a DOCTYPE the prescan misses (a comment before it names an element) is refused after a parse
    # that expanded nothing
    hidden = export(tmp_path / "hidden.xml", external_entity(secret, before="<!-- <rss> -->\n"))
    with pytest.raises(CorpusError) as refused:
        read_corpus(hidden, "wxr")
    assert refused.value.problems == [
        f"{hidden}:1: a DOCTYPE is not allowed in a WordPress export (entities are never expanded)"
    ]
    assert "TOP-SECRET" not in str(refused.value)
    assert list_revisions(tmp_path / "reg") == []


def test_the_parser_itself_expands_no_entity_and_loads_nothing():
    """Beneath the DOCTYPE refusal: the parser's own settings never expand or fetch an entity."""
    started = time.monotonic()
    try:
        root = etree.fromstring(billion_laughs(), wxr._parser())
    except etree.XMLSyntaxError as exc:  # libxml2's amplification bound
        assert "amplification" in str(exc) or "entity" in str(exc).lower()
    else:
        assert len(etree.tostring(root)) < 100_000  # references kept as references
    assert time.monotonic() - started < 1


def test_the_parser_does_not_read_external_entities(tmp_path: Path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-PASSWORD")
    root = etree.fromstring(external_entity(secret), wxr._parser())
    assert b"TOP-SECRET" not in etree.tostring(root)


def test_malformed_and_foreign_xml_and_bad_items_are_one_line_each(tmp_path: Path):
    broken = export(tmp_path / "broken.xml", wxr_export(shop_items())[:-40])
    with pytest.raises(CorpusError) as refused:
        read_corpus(broken, "wxr")
    (problem,) = refused.value.problems
    assert problem.startswith(f"{broken}:") and ": malformed XML: " in problem
    feed = export(tmp_path / "feed.xml", b'<?xml version="1.0"?>\n<rss><channel><title>Blog</title></channel></rss>')
    with pytest.raises(CorpusError) as refused:
        read_corpus(feed, "wxr")
    assert refused.value.problems == [f"{feed}:2: not a WordPress export (WXR): no wp:wxr_version"]
    page = export(tmp_path / "page.xml", b"<html><body/></html>")
    with pytest.raises(CorpusError, match=r"page.xml:1: not a WordPress export \(WXR\): root element <html>"):
        read_corpus(page, "wxr")
    items = [
        wxr_item(12, "First", "<p>One.</p>"),
        wxr_item(12, "Again", "<p>Two.</p>"),  # the same post twice
        wxr_item(13, "No type", "<p>x</p>", post_type=""),
        wxr_item(14, "Odd price", "<p>y</p>", post_type="product", meta=(("_price", "call us"),)),
    ]
    data = wxr_export(items)
    bad = export(tmp_path / "bad.xml", data)
    with pytest.raises(CorpusError) as refused:
        read_corpus(bad, "wxr")
    assert refused.value.problems == [
        f"{bad}:{item_lines(data)[1]} [id=post/12]: duplicate document ID (first seen on line {item_line(data, 12)})",
        f"{bad}:{item_line(data, 13)}: item without a numeric wp:post_id and a wp:post_type",
    ]
    good = export(tmp_path / "good.xml", wxr_export([items[0], items[3]]))
    records = {r.document_id: r for r in read_corpus(good, "wxr")}
    assert "wc.price" not in records["product/14"].metadata
    assert records["product/14"].not_kept == (("wc.price", "a price that is not a decimal number"),)


def test_an_item_over_the_byte_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(wxr.DOCUMENT_BYTE_LIMITS, "wxr", 100)
    data = wxr_export([wxr_item(5, "Long", "<p>" + "word " * 40 + "</p>"), wxr_item(6, "Short", "<p>ok</p>")])
    path = export(tmp_path / "long.xml", data)
    with pytest.raises(CorpusError) as refused:
        read_corpus(path, "wxr")
    assert refused.value.problems == [
        f"{path}:{item_line(data, 5)} [id=post/5]: content of 207 bytes is over the wxr document limit (100 bytes)"
    ]


def test_an_export_with_nothing_to_read_is_refused_naming_the_exclusions(tmp_path: Path):
    data = wxr_export([wxr_item(1, "Draft", "<p>x</p>", status="draft"), wxr_item(2, "Empty", "<!-- wp:spacer /-->")])
    path = export(tmp_path / "drafts.xml", data)
    with pytest.raises(CorpusError) as refused:
        register_revision(tmp_path / "reg", "d-1", path, "wxr", "public")
    assert refused.value.problems == [
        f"{path}: no posts, pages or products to read (2 excluded: post/1: status 'draft': not read "
        "(statuses read: publish; see --wxr-status); post/2: no text (empty content): not read)"
    ]
    assert list_revisions(tmp_path / "reg") == []


def test_an_xml_file_is_detected_as_a_wordpress_export(tmp_path: Path):
    assert detect_format(tmp_path / "export.XML") == "wxr"
    assert detect_format(tmp_path / "corpus.jsonl") == "beir"
    assert detect_format(tmp_path) == "markdown"


def test_registration_and_snapshot_of_an_export(tmp_path: Path):
    path = export(tmp_path / "shop.xml", wxr_export(shop_items()))
    ws = Workspace(tmp_path / "home")
    spec = load_pipeline_spec()
    register_revision(ws.registry, "shop-1", path, "wxr", "public")
    steps.run_source_snapshot(ws, "shop-1", spec)
    documents, summary = read_snapshot(read_output(ws, "shop-1", "source_snapshot").path)
    assert [d.document_id for d in documents] == ["page/7", "post/12", "product/31", "product/32"]
    assert {d.access_scopes for d in documents} == {("public",)}
    assert summary.metadata_fields["wc.price"] == {"number": 2}
    assert summary.metadata_fields["categories"] == {"list<string>": 3}
    assert [e.document_id for e in summary.excluded] == [
        "attachment/50",
        "nav_menu_item/70",
        "post/40",
        "post/41",
        "post/60",
    ]


def test_build_cli_wxr(tmp_path: Path):
    path = export(tmp_path / "shop.xml", wxr_export(shop_items()))
    done = ragpipe(
        "build", str(path), "--revision", "shop-1", "--default-scope", "public", "--wxr-status", "publish,private",
        "--json", home=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["documents"], summary["excluded"]) == (5, 4)  # the private post is read
    record = load_revision(tmp_path / "ragpipe" / "revisions", "shop-1")
    assert (record.format, record.wxr_statuses) == ("wxr", ("private", "publish"))


def test_an_export_and_its_statuses_travel_through_the_object_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Registered on one machine, read on another that has only the store: same file, same statuses."""
    monkeypatch.setenv("RAGPIPE_STORE", str(tmp_path / "store"))
    path = export(tmp_path / "shop.xml", wxr_export(shop_items()))
    register_revision(tmp_path / "here", "shop-1", path, "wxr", "public", ("publish", "private"))
    path.unlink()
    elsewhere = load_revision(tmp_path / "there", "shop-1")
    assert elsewhere.wxr_statuses == ("private", "publish")
    read = read_registered_corpus(elsewhere, tmp_path / "cache")
    assert [r.document_id for r in read] == ["post/12", "page/7", "product/31", "product/32", "post/41"]


def test_an_id_that_only_looks_like_digits_is_one_line_not_a_traceback(tmp_path: Path):
    """Found by an adversarial review: ``"²".isdigit()`` is true and ``int("²")`` raises."""
    data = wxr_export([wxr_item(12, "Ok", "<p>One.</p>")]).replace(
        b"<wp:post_id>12</wp:post_id>", "<wp:post_id>²</wp:post_id>".encode()
    )
    odd = export(tmp_path / "odd.xml", data)
    with pytest.raises(CorpusError) as refused:
        read_corpus(odd, "wxr")
    (problem,) = refused.value.problems
    assert problem.endswith(": item without a numeric wp:post_id and a wp:post_type")
    long = export(tmp_path / "long.xml", data.replace("²".encode(), b"9" * 5000))
    with pytest.raises(CorpusError) as refused:
        read_corpus(long, "wxr")
    assert refused.value.problems[0].endswith(": item without a numeric wp:post_id and a wp:post_type")
