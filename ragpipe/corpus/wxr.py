"""WordPress export (WXR, the XML file of Tools → Export): posts, pages and WooCommerce products.

**Parsing is hardened.** The XML is parsed by lxml with ``resolve_entities=False``,
``no_network=True``, ``load_dtd=False`` and ``huge_tree=False`` (libxml2's bounds on text node
size and nesting depth stay on), and an export with a document type declaration is refused before
the parser sees it (WordPress writes none; a DTD is how entity bombs and external entities come
in): ``export.xml:2: a DOCTYPE is not allowed in a WordPress export (entities are never expanded,
external ones never loaded)``. A DTD the prescan missed is refused after parsing, unexpanded.

One document per ``<item>`` whose ``wp:post_type`` is ``post``, ``page`` or ``product`` and whose
``wp:status`` is among the statuses read — ``publish`` only, unless the revision was registered
with others (``ragpipe build --wxr-status publish,private``; the statuses are part of the source's
digest, so the same file read with other statuses is another revision). Every other item is listed
in the exclusions with its reason, never dropped silently: another post type (attachments, menu
items, blocks …), another status (drafts, pending, private, scheduled, trash), a password-protected
post (its content is not public even when published), an item with no text.

Document ID: ``<post type>/<post id>`` (``post/12``, ``page/7``, ``product/31``): WordPress's post
ID is stable across exports of one site and across slug changes; a repeated ID is refused. Text:
``content:encoded`` rendered like an HTML page's main content (``ragpipe.corpus.html``), a blank
line in classic-editor content being a paragraph break as WordPress shows it; for a product, its
short description (``excerpt:encoded``) first. Shortcodes (``[gallery]``) stay as written. Comments
are not read. Title: ``<title>``, HTML entities decoded.

Typed metadata: ``source_file``, ``canonical_url`` (``<link>``), ``wp.post_id``, ``wp.post_type``,
``wp.status``, ``wp.slug``, ``wp.author``, ``wp.parent``, ``wp.post_date`` and
``wp.post_modified`` (datetimes, UTC from the ``_gmt`` fields, else the site's local time without a
zone), ``categories`` and ``tags`` (``category``/``post_tag`` and WooCommerce's
``product_cat``/``product_tag``), ``wp.post_format``, ``wp.terms.<taxonomy>`` for other taxonomies,
and for products ``wc.sku``, ``wc.price``, ``wc.regular_price``, ``wc.sale_price`` (numbers),
``wc.stock_status``, ``wc.product_type``, ``wc.visibility``. Problems read
``file:line [id=…]: rule``, the line being the item's.
"""

from __future__ import annotations

import datetime as dt
import html
import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

from lxml import etree

from ragpipe.corpus.html import render_fragment
from ragpipe.corpus.metadata import typed_metadata
from ragpipe.corpus.models import Exclusion
from ragpipe.corpus.normalize import CorpusError, normalize_text
from ragpipe.corpus.records import DEFAULT_SOURCE_ROLE, CorpusRead, SourceRecord
from ragpipe.corpus.rules import id_problem, normalize_id, shown_id
from ragpipe.corpus.source import DOCUMENT_BYTE_LIMITS, WxrSource, escaped_path, shown_bytes

READ_TYPES = ("post", "page", "product")
WXR_STATUSES = ("draft", "future", "pending", "private", "publish")
DEFAULT_WXR_STATUSES: tuple[str, ...] = ("publish",)
_WP_NS = re.compile(r"^https?://wordpress\.org/export/1\.\d+/$")
_CONTENT_NS = "http://purl.org/rss/1.0/modules/content/"
_DC_NS = "http://purl.org/dc/elements/1.1/"
# the first element (the root) starts at the first '<' that opens neither a declaration nor a PI
_ROOT_START = re.compile(rb"<[^?!]")
_DOCTYPE = re.compile(rb"<!DOCTYPE", re.IGNORECASE)
_TAXONOMIES = {
    "category": "categories",
    "product_cat": "categories",
    "post_tag": "tags",
    "product_tag": "tags",
    "post_format": "wp.post_format",
    "product_type": "wc.product_type",
    "product_visibility": "wc.visibility",
}
# taxonomies a post has one term of: a string, not a list
_SINGLE_TERM = frozenset({"wp.post_format", "wc.product_type"})
_PRODUCT_META = {"_sku": "wc.sku", "_stock_status": "wc.stock_status"}
_PRODUCT_PRICES = {"_price": "wc.price", "_regular_price": "wc.regular_price", "_sale_price": "wc.sale_price"}
_NO_DATE = "0000-00-00 00:00:00"


def check_wxr_statuses(values: Iterable[str]) -> tuple[str, ...]:
    """The statuses to read, sorted and unique; ``ValueError`` naming an unknown or missing one."""
    statuses = {v.strip() for v in values if v.strip()}
    if not statuses:
        raise ValueError(f"no WordPress status given (use one or more of {', '.join(WXR_STATUSES)})")
    unknown = sorted(statuses - set(WXR_STATUSES))
    if unknown:
        raise ValueError(f"unknown WordPress status {unknown[0]!r} (use one or more of {', '.join(WXR_STATUSES)})")
    return tuple(sorted(statuses))


def _parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
        collect_ids=False,
    )


def _prolog_problem(raw: bytes, path: str) -> str | None:
    root = _ROOT_START.search(raw)
    prolog = raw[: root.start()] if root else raw
    found = _DOCTYPE.search(prolog)
    if found is None:
        return None
    line = prolog.count(b"\n", 0, found.start()) + 1
    return (
        f"{path}:{line}: a DOCTYPE is not allowed in a WordPress export "
        "(entities are never expanded, external ones never loaded)"
    )


def parse_wxr_xml(raw: bytes, path: str) -> etree._Element:
    """The export's root element, parsed by the hardened parser; ``CorpusError`` (one line) for a
    DOCTYPE, malformed XML or a root that is not a WordPress export's."""
    refused = _prolog_problem(raw, path)
    if refused:
        raise CorpusError([refused])
    try:
        root = etree.fromstring(raw, _parser())
    except etree.XMLSyntaxError as exc:
        raise CorpusError([f"{path}:{exc.lineno or 1}: malformed XML: {exc.msg}"]) from None
    docinfo = root.getroottree().docinfo
    if docinfo.internalDTD is not None or docinfo.doctype:
        raise CorpusError([f"{path}:1: a DOCTYPE is not allowed in a WordPress export (entities are never expanded)"])
    return root


def _wp_namespace(root: etree._Element, path: str) -> str:
    if root.tag != "rss" or root.find("channel") is None:
        raise CorpusError([f"{path}:{root.sourceline or 1}: not a WordPress export (WXR): root element <{root.tag}>"])
    ns = next((uri for uri in root.nsmap.values() if uri and _WP_NS.match(uri)), None)
    channel = root.find("channel")
    if ns is None or channel is None or channel.find(f"{{{ns}}}wxr_version") is None:
        raise CorpusError([f"{path}:{root.sourceline or 1}: not a WordPress export (WXR): no wp:wxr_version"])
    return ns


class _Item:
    """One ``<item>``: its fields by tag."""

    def __init__(self, element: etree._Element, wp: str):
        self.element, self.wp = element, wp
        self.line = element.sourceline or 0

    def text(self, tag: str) -> str:
        found = self.element.find(tag)
        return (found.text or "") if found is not None else ""

    def wp_text(self, name: str) -> str:
        return self.text(f"{{{self.wp}}}{name}").strip()

    def terms(self) -> dict[str, list[str] | str]:
        out: dict[str, list[str]] = {}
        for category in self.element.findall("category"):
            domain = (category.get("domain") or "category").strip()
            name = normalize_text(html.unescape(category.text or "")).strip()
            key = _TAXONOMIES.get(domain, f"wp.terms.{domain}")
            if name and name not in out.setdefault(key, []):
                out[key].append(name)
        return {k: v[0] if k in _SINGLE_TERM and len(v) == 1 else v for k, v in out.items()}

    def postmeta(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for meta in self.element.findall(f"{{{self.wp}}}postmeta"):
            key = meta.find(f"{{{self.wp}}}meta_key")
            value = meta.find(f"{{{self.wp}}}meta_value")
            if key is not None and key.text:
                out.setdefault(key.text.strip(), (value.text or "") if value is not None else "")
        return out


def _date(value: str, utc: bool) -> dt.datetime | None:
    if not value or value == _NO_DATE:
        return None
    try:
        parsed = dt.datetime.strptime(value, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    return parsed.replace(tzinfo=dt.UTC) if utc else parsed


def _price(value: str) -> float | None | str:
    """A price as a number, None when empty, or the reason it is not kept."""
    value = value.strip()
    if not value:
        return None
    try:
        number = Decimal(value)
    except InvalidOperation:
        return "a price that is not a decimal number"
    return float(number) if number.is_finite() else "a price that is not a decimal number"


def _metadata(item: _Item, post_type: str, source_file: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    not_kept: list[tuple[str, str]] = []
    parent = item.wp_text("post_parent")
    raw: dict[str, Any] = {
        "source_file": source_file,
        "canonical_url": item.text("link").strip() or None,
        "wp.post_id": int(item.wp_text("post_id")),
        "wp.post_type": post_type,
        "wp.status": item.wp_text("status"),
        "wp.slug": item.wp_text("post_name") or None,
        "wp.author": item.text(f"{{{_DC_NS}}}creator").strip() or None,
        "wp.parent": int(parent) if _is_id(parent) and int(parent) else None,
    }
    for key, field in (("wp.post_date", "post_date"), ("wp.post_modified", "post_modified")):
        gmt, local = item.wp_text(field + "_gmt"), item.wp_text(field)
        raw[key] = _date(gmt, utc=True) or _date(local, utc=False)
        if raw[key] is None and (gmt or local) not in ("", _NO_DATE):
            not_kept.append((key, "a date that is not 'YYYY-MM-DD HH:MM:SS'"))
    raw.update(item.terms())
    if post_type == "product":
        meta = item.postmeta()
        for source, key in _PRODUCT_META.items():
            raw[key] = normalize_text(meta.get(source, "")).strip() or None
        for source, key in _PRODUCT_PRICES.items():
            price = _price(meta.get(source, ""))
            if isinstance(price, str):
                not_kept.append((key, price))
            else:
                raw[key] = price
    return raw, not_kept


def _text(item: _Item, wp: str, post_type: str, where: str, problems: list[str]) -> str | None:
    parts = [item.text(f"{{{_CONTENT_NS}}}encoded")]
    if post_type == "product":
        excerpt_ns = wp + "excerpt/"
        parts.insert(0, item.text(f"{{{excerpt_ns}}}encoded"))
    size = sum(len(p.encode("utf-8")) for p in parts)
    limit = DOCUMENT_BYTE_LIMITS["wxr"]
    if size > limit:
        problems.append(f"{where}: content of {size} bytes is over the wxr document limit ({shown_bytes(limit)})")
        return None
    rendered = [render_fragment(normalize_text(p), blank_line_paragraphs=True) for p in parts if p.strip()]
    return normalize_text("\n".join(r for r in rendered if r))


def _is_id(text: str) -> bool:
    """A WordPress ID: ASCII digits only (``str.isdigit`` also takes ``²``, which ``int`` refuses),
    at most 15 of them (within ±(2^53-1), and far from Python's limit on digits)."""
    return text.isascii() and text.isdigit() and len(text) <= 15


def parse_wxr(source: WxrSource) -> CorpusRead:
    """Parse the export held by ``source`` (never re-reading the file); raise every problem at once."""
    path = escaped_path(source.path)
    root = parse_wxr_xml(source.raw, path)
    wp = _wp_namespace(root, path)
    statuses = set(source.statuses)
    problems: list[str] = []
    records: list[SourceRecord] = []
    excluded: list[Exclusion] = []
    first_line: dict[str, int] = {}
    channel = root.find("channel")
    for element in channel.findall("item") if channel is not None else []:
        item = _Item(element, wp)
        at = f"{path}:{item.line}"
        post_id, post_type, status = item.wp_text("post_id"), item.wp_text("post_type"), item.wp_text("status")
        if not _is_id(post_id) or not post_type:
            problems.append(f"{at}: item without a numeric wp:post_id and a wp:post_type")
            continue
        doc_id = normalize_id(f"{post_type}/{int(post_id)}")
        where = f"{at} [id={shown_id(doc_id)}]"
        rule = id_problem(doc_id)
        if rule:
            problems.append(f"{where}: {rule}")
            continue
        if doc_id in first_line:
            problems.append(f"{where}: duplicate document ID (first seen on line {first_line[doc_id]})")
            continue
        first_line[doc_id] = item.line

        def exclude(reason: str, _id: str = doc_id, _at: str = at) -> None:
            excluded.append(Exclusion(document_id=_id, location=_at, reason=reason))

        if post_type not in READ_TYPES:
            exclude(f"post type {post_type!r}: not read (posts, pages and products are)")
            continue
        if status not in statuses:
            exclude(f"status {status!r}: not read (statuses read: {', '.join(sorted(statuses))}; see --wxr-status)")
            continue
        if item.wp_text("post_password"):
            exclude("password-protected: not read")
            continue
        text = _text(item, wp, post_type, where, problems)
        if text is None:
            continue
        if not text.strip():
            exclude("no text (empty content): not read")
            continue
        before = len(problems)
        raw, not_kept = _metadata(item, post_type, source.path.name)
        kept, more_not_kept = typed_metadata(raw, lambda _key, _w=where: _w, problems)
        if len(problems) > before:
            continue
        title = normalize_text(html.unescape(item.text("title"))).strip()
        records.append(
            SourceRecord(
                document_id=doc_id,
                title=title or item.wp_text("post_name") or doc_id,
                text=text,
                access_scopes=None,
                source_role=DEFAULT_SOURCE_ROLE,
                location=at,
                metadata=kept,
                not_kept=tuple(not_kept + more_not_kept),
            )
        )
    if not records and not problems:
        shown = "; ".join(f"{shown_id(e.document_id)}: {e.reason}" for e in excluded[:3])
        more = f"; … and {len(excluded) - 3} more" if len(excluded) > 3 else ""
        detail = f" ({len(excluded)} excluded: {shown}{more})" if excluded else ""
        problems.append(f"{path}: no posts, pages or products to read{detail}")
    if problems:
        raise CorpusError(problems)
    return CorpusRead(records, sorted(excluded, key=lambda e: (e.document_id, e.location)))
