"""Folder of HTML pages (a static docs site): one document per ``.html``/``.htm`` file (any case).

Parsing is selectolax's Lexbor engine, an HTML5 (WHATWG) parser: a page is read into the tree a
browser builds from it, broken markup included, with no network access, no scripts run and no
entity definitions (HTML has none to expand). The document is the page's **main content**:

1. the landmark: the first element with ``role="main"``, else the first ``<main>``, else
   ``<body>`` (then ``<header>`` counts as boilerplate too);
2. within it, the only ``<article>`` when there is exactly one (MkDocs, Docusaurus, Hugo themes
   wrap the page's text in one, beside sidebars and tables of contents);
3. dropped wherever they are: ``<script>``, ``<style>``, ``<noscript>``, ``<template>``, ``<svg>``,
   embedded frames and media, form controls, ``<nav>``, ``<aside>``, ``<footer>``, the ARIA
   landmarks navigation/search/banner/contentinfo/complementary, ``hidden`` and
   ``aria-hidden="true"`` elements, and Sphinx/MkDocs permalink anchors (``a.headerlink``, the ¶);
4. rendered as text with the structure a chunker can use: ``<h1>``–``<h6>`` as ATX headings
   (``# …`` to ``###### …``, so the heading chunker's heading path is the page's breadcrumb),
   paragraphs separated by a blank line, list items as ``- `` / ``1. ``, table rows as cells
   joined by `` | ``, ``<pre>`` verbatim inside a ``` fence; other whitespace collapsed as a browser
   does. The rendered text, normalised (``utf8-nfc-lf/v1``), is the document's text: spans index it.

The title is the first ``# `` heading of that text, else ``<title>``, else the file stem. Typed
metadata: ``source_file`` (path relative to the folder), ``element_path`` (the main element, as an
XPath over the parsed tree, e.g. ``/html/body/div[2]/div``), ``html.title``, ``html.lang``,
``canonical_url`` (``<link rel="canonical">``) and ``meta.<name>`` for every ``<meta name|property
content>`` (lower case, ``:`` → ``.``: ``meta.og.title``; a name given twice is a list; rendering
hints such as ``viewport`` are not kept). Pages take the revision's default scope: a ``<meta>``
whose name is, or nearly is, ``access_scopes``/``source_role``/``scope`` is refused, never kept as
metadata or ignored.

Bytes are decoded by the page's own declaration: a BOM, else ``<meta charset>`` or
``<meta http-equiv="Content-Type" content="…; charset=…">`` in the first 1024 bytes (labels as
browsers read them: ``iso-8859-1`` and ``ascii`` are windows-1252), else UTF-8 — strictly: a byte
the charset cannot decode is a problem naming its offset. A page with no main content (a redirect
stub, a page that is only a search form) is excluded with its reason, never refused.

``render_fragment`` renders a fragment of HTML (a WordPress post's content) the same way.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import Any

from selectolax.lexbor import LexborHTMLParser, LexborNode

from ragpipe.corpus.metadata import SECURITY_KEYS, near_miss_problems, typed_metadata
from ragpipe.corpus.models import Exclusion
from ragpipe.corpus.normalize import CorpusError, normalize_text
from ragpipe.corpus.records import DEFAULT_SOURCE_ROLE, CorpusRead, SourceRecord
from ragpipe.corpus.source import SourceFile, TreeSource, parse_folder

# never text: code, styling, embedded objects, form controls, the document head
_ALWAYS_DROPPED = frozenset(
    "script style noscript template head title meta link base svg canvas iframe frame frameset object "
    "embed audio video source track map area button input select option optgroup datalist textarea "
    "output progress meter dialog".split()
)
# boilerplate of a page (not of a post's content): navigation, side bars, footers
_PAGE_BOILERPLATE = frozenset({"nav", "aside", "footer"})
_BOILERPLATE_ROLES = frozenset({"navigation", "search", "banner", "contentinfo", "complementary"})
_DROPPED_CLASSES = frozenset({"headerlink"})
_BLOCKS = frozenset(
    "address article aside body center dd details dir div dl dt fieldset figcaption figure footer form "
    "header hgroup hr html legend main menu nav p section summary caption tbody thead tfoot".split()
)
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_CELLS = frozenset({"td", "th"})
_WS = re.compile(r"[ \t\n\r\f]+")  # HTML whitespace (a no-break space is text)
_SPACES = re.compile(r" {2,}")
_BLANK_LINE = re.compile(r"\n[ \t\r\f]*\n")
_BACKTICKS = re.compile(r"^`{3,}", re.MULTILINE)
# <meta> names that are rendering hints, not facts about the document
_META_NOT_KEPT = frozenset({"viewport", "theme-color", "color-scheme", "format-detection"})
_PRESCAN_BYTES = 1024
_META_CHARSET = re.compile(rb"<meta\s[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z0-9_.:-]+)", re.IGNORECASE)
# labels as the WHATWG Encoding standard maps them (browsers read Latin-1 as windows-1252)
_CHARSET_ALIASES = {
    "utf8": "utf-8",
    "unicode-1-1-utf-8": "utf-8",
    "utf-16": "utf-8",  # a <meta> cannot name UTF-16: the page was read as ASCII to find it
    "utf-16le": "utf-8",
    "utf-16be": "utf-8",
    "iso-8859-1": "windows-1252",
    "iso8859-1": "windows-1252",
    "latin1": "windows-1252",
    "latin-1": "windows-1252",
    "l1": "windows-1252",
    "ascii": "windows-1252",
    "us-ascii": "windows-1252",
    "cp1252": "windows-1252",
    "x-cp1252": "windows-1252",
}


# ---------------------------------------------------------------------------------------- bytes


def _declared_charset(data: bytes) -> tuple[str, str]:
    """(charset label, where it was declared) by the page's BOM or its ``<meta>``; UTF-8 otherwise."""
    if data.startswith(codecs.BOM_UTF8):
        return "utf-8", "byte order mark"
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16", "byte order mark"
    found = _META_CHARSET.search(data[:_PRESCAN_BYTES])
    if found is None:
        return "utf-8", "no <meta charset>: pages are read as UTF-8"
    label = found.group(1).decode("ascii").lower()
    return _CHARSET_ALIASES.get(label, label), f"declared by <meta> as {label!r}"


def decode_page(data: bytes, where: str) -> str:
    """The page's text by its declared charset (module docstring), strictly, then normalised."""
    label, declared = _declared_charset(data)
    try:
        codec = codecs.lookup(label)
    except LookupError:
        raise CorpusError([f"{where}: unknown charset {label!r} ({declared})"]) from None
    try:
        text = data.decode(codec.name)
    except UnicodeDecodeError as exc:
        shown = "UTF-8" if codec.name == "utf-8" else codec.name
        raise CorpusError([f"{where}: invalid {shown} at byte {exc.start} ({declared})"]) from None
    return normalize_text(text)


# ------------------------------------------------------------------------------------ rendering


def _children(node: LexborNode) -> Iterator[LexborNode]:
    child = node.child
    while child is not None:
        yield child
        child = child.next


def _dropped(node: LexborNode, boilerplate: frozenset[str]) -> bool:
    tag = node.tag or ""
    if tag in _ALWAYS_DROPPED or tag in boilerplate:
        return True
    attrs = node.attributes
    if not attrs:
        return False
    if "hidden" in attrs or (attrs.get("aria-hidden") or "").strip().lower() == "true":
        return True
    if boilerplate and (attrs.get("role") or "").strip().lower() in _BOILERPLATE_ROLES:
        return True
    classes = (attrs.get("class") or "").split()
    return any(c in _DROPPED_CLASSES for c in classes)


def _one_line(pieces: list[str]) -> str:
    """Inline text as one line: every run of HTML whitespace (and ``<br>``) one space."""
    return _SPACES.sub(" ", _WS.sub(" ", "".join(pieces))).strip(" ")


class _Item:
    """A list item being rendered: its indent and its marker until its first line is out."""

    def __init__(self, indent: str, marker: str):
        self.indent, self.marker, self.started = indent, marker, False


class _Renderer:
    """HTML elements to text (module docstring, step 4), walked without recursion: a page nested
    ten thousand levels deep renders like any other."""

    def __init__(self, boilerplate: frozenset[str], blank_line_paragraphs: bool):
        self.boilerplate = boilerplate
        self.autop = blank_line_paragraphs
        self.blocks: list[tuple[bool, str]] = []  # (joined to the previous by one \n: an item's next line, text)
        self.last_item = False  # the last block was a list item or table row
        self.new_list = False  # a list or table opened since: its first line starts a new block
        self.inline: list[str] = []
        self.saved: list[list[str]] = []  # the inline text around each open table cell
        self.pre: list[str] = []
        self.pre_depth = 0
        self.cell_depth = 0
        self.quote_depth = 0
        self.heading = 0
        self.lists: list[list[Any]] = []  # [ordered, items so far]
        self.items: list[_Item] = []
        self.rows: list[list[str]] = []

    def render(self, root: LexborNode) -> str:
        stack: list[tuple[LexborNode, bool]] = [(root, False)]
        while stack:
            node, leaving = stack.pop()
            if leaving:
                self.leave(node.tag or "")
            elif node.is_text_node:
                self.text(node.text_content or "")
            elif node.is_element_node and not _dropped(node, self.boilerplate):
                self.enter(node.tag or "")
                stack.append((node, True))
                stack.extend((child, False) for child in reversed(list(_children(node))))
        self.flush()
        out: list[str] = []
        for tight, text in self.blocks:
            if out:
                out.append("\n" if tight else "\n\n")
            out.append(text)
        text = normalize_text("".join(out)).strip("\n")
        return text + "\n" if text else ""

    # -- events

    def text(self, value: str) -> None:
        if self.pre_depth:
            self.pre.append(value)
        elif self.autop and not (self.heading or self.cell_depth) and _BLANK_LINE.search(value):
            for i, part in enumerate(_BLANK_LINE.split(value)):
                if i:
                    self.flush()
                self.inline.append(_WS.sub(" ", part))
        else:
            self.inline.append(_WS.sub(" ", value))

    def enter(self, tag: str) -> None:
        if self.pre_depth:
            if tag == "pre":
                self.pre_depth += 1
            elif tag == "br":
                self.pre.append("\n")
            return
        if tag == "br":
            self.inline.append("\n")
        elif tag in _HEADINGS:
            self.flush()
            self.heading = _HEADINGS[tag]
        elif tag == "pre":
            self.flush()
            self.pre_depth, self.pre = 1, []
        elif tag in ("ul", "ol"):
            self.flush()
            self.new_list = self.new_list or not self.items
            self.lists.append([tag == "ol", 0])
        elif tag == "li":
            self.flush()
            ordered, count = self.lists[-1] if self.lists else (False, 0)
            if self.lists:
                self.lists[-1][1] = count + 1
            marker = f"{count + 1}. " if ordered else "- "
            self.items.append(_Item("  " * max(len(self.lists) - 1, 0), marker))
        elif tag == "blockquote":
            self.flush()
            self.quote_depth += 1
        elif tag == "table":
            self.flush()
            self.new_list = True
        elif tag == "tr":
            self.flush()
            self.rows.append([])
        elif tag in _CELLS:
            self.cell_depth += 1
            self.saved.append(self.inline)
            self.inline = []
        elif tag in _BLOCKS:
            self.flush()

    def leave(self, tag: str) -> None:
        if self.pre_depth:
            if tag == "pre":
                self.pre_depth -= 1
                if not self.pre_depth:
                    self.code_block()
            return
        if tag in _HEADINGS and self.heading:
            text = _one_line(self.inline)
            self.inline, level, self.heading = [], self.heading, 0
            if text:
                self.emit("#" * level + " " + text, heading=True)
        elif tag in ("ul", "ol"):
            self.flush()
            if self.lists:
                self.lists.pop()
        elif tag == "li":
            self.flush()
            if self.items:
                self.items.pop()
        elif tag == "blockquote":
            self.flush()
            self.quote_depth = max(self.quote_depth - 1, 0)
        elif tag in _CELLS and self.cell_depth:
            cell = _one_line(self.inline)
            self.cell_depth -= 1
            self.inline = self.saved.pop()
            if self.rows:
                self.rows[-1].append(cell)
        elif tag == "tr" and self.rows:
            self.flush()
            cells = self.rows.pop()
            if any(cells):
                self.emit(" | ".join(cells), item=True)
        elif tag in _BLOCKS or tag == "table":
            self.flush()

    # -- output

    def code_block(self) -> None:
        lines = [line.rstrip() for line in "".join(self.pre).split("\n")]
        code = "\n".join(lines).strip("\n")
        self.pre = []
        if not code.strip():
            return
        longest = max((len(m.group(0)) for m in _BACKTICKS.finditer(code)), default=2)
        fence = "`" * max(3, longest + 1)
        self.emit(f"{fence}\n{code}\n{fence}")

    def flush(self) -> None:
        """The inline text so far as a paragraph (or a list item's line)."""
        if self.heading:
            return  # a block inside a heading: the heading stays one line
        if self.cell_depth:
            self.inline.append(" ")
            return
        lines = [_SPACES.sub(" ", line).strip(" ") for line in "".join(self.inline).split("\n")]
        self.inline = []
        text = "\n".join(line for line in lines if line)
        if text:
            self.emit(text)

    def emit(self, text: str, *, item: bool = False, heading: bool = False) -> None:
        if self.cell_depth:
            self.inline.append(" " + _WS.sub(" ", text) + " ")
            return
        if self.items and not heading:
            current = self.items[-1]
            first = current.indent + (current.marker if not current.started else " " * len(current.marker))
            rest = current.indent + " " * len(current.marker)
            lines = text.split("\n")
            text = "\n".join([first + lines[0], *(rest + line for line in lines[1:])])
            current.started, item = True, True
        if self.quote_depth:
            prefix = "> " * self.quote_depth
            text = "\n".join(prefix + line for line in text.split("\n"))
        self.blocks.append((item and self.last_item and not self.new_list, text))
        self.last_item, self.new_list = item, False


def render_fragment(html: str, *, blank_line_paragraphs: bool = False) -> str:
    """A fragment of HTML (a WordPress post's content) as text, rendered like a page's main
    content but without dropping ``<nav>``/``<aside>``/``<footer>``; with
    ``blank_line_paragraphs`` a blank line in text is a paragraph break, as WordPress's
    ``wpautop`` displays classic-editor content."""
    tree = LexborHTMLParser(html)
    if tree.body is None:
        return ""
    return _Renderer(frozenset(), blank_line_paragraphs).render(tree.body)


# ------------------------------------------------------------------------------------ one page


def _main_element(tree: LexborHTMLParser) -> tuple[LexborNode | None, bool]:
    """(the main content element, whether it is ``<body>`` for want of a landmark)."""
    landmark = tree.css_first('[role="main" i]') or tree.css_first("main")
    fallback = landmark is None
    node = tree.body if fallback else landmark
    if node is None:
        return None, True
    articles = node.css("article")
    if len(articles) == 1:
        node = articles[0]
    return node, fallback


def element_path(node: LexborNode) -> str:
    """``/html/body/div[2]/main``: each step the tag, with its position among same-tag siblings
    when it has any (1-based, as XPath counts) — the node in the tree the HTML5 parser built."""
    steps: list[str] = []
    current: LexborNode | None = node
    while current is not None and current.is_element_node:
        tag = current.tag or ""
        parent = current.parent
        if parent is not None:
            same = [c for c in _children(parent) if c.is_element_node and c.tag == tag]
            if len(same) > 1:
                position = next(i for i, c in enumerate(same, 1) if c.mem_id == current.mem_id)
                tag = f"{tag}[{position}]"
        steps.append(tag)
        current = parent
    return "/" + "/".join(reversed(steps))


def _text_of(node: LexborNode | None) -> str:
    return " ".join((node.text(deep=True) if node is not None else "").split())


def _security_meta(name: str) -> bool:
    """Whether a ``<meta>`` name is, or nearly is, a security key (the last ``:``/``.`` segment)."""
    last = re.split(r"[:.]", name)[-1]
    return last in SECURITY_KEYS or bool(near_miss_problems([last], lambda _k: ""))


def _page_metadata(tree: LexborHTMLParser, where: str, problems: list[str]) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    title = _text_of(tree.css_first("title"))
    if title:
        raw["html.title"] = title
    root = tree.css_first("html")
    lang = ((root.attributes.get("lang") if root is not None else None) or "").strip()
    if lang:
        raw["html.lang"] = lang
    for link in tree.css("link[rel][href]"):
        if "canonical" in (link.attributes.get("rel") or "").lower().split():
            raw["canonical_url"] = (link.attributes.get("href") or "").strip() or None
            break
    metas: dict[str, list[str]] = {}
    for meta in tree.css("meta"):
        attrs = meta.attributes
        name = (attrs.get("name") or attrs.get("property") or "").strip()
        content = attrs.get("content")
        if not name or content is None:
            continue
        if _security_meta(name):
            problems.append(
                f"{where}: <meta name={name!r}> cannot set a page's audience (HTML pages take the revision's "
                "default scope): remove it, or build restricted pages as a revision of their own"
            )
            continue
        name = name.lower()
        if name in _META_NOT_KEPT:
            continue
        metas.setdefault("meta." + name.replace(":", "."), []).append(content.strip())
    for key, values in metas.items():
        raw[key] = values[0] if len(values) == 1 else values
    return raw


def _redirect(tree: LexborHTMLParser) -> str | None:
    for meta in tree.css("meta[http-equiv]"):
        if (meta.attributes.get("http-equiv") or "").strip().lower() == "refresh":
            return (meta.attributes.get("content") or "").strip()
    return None


def _page(
    file: SourceFile, doc_id: str, where: str, problems: list[str], excluded: list[Exclusion]
) -> SourceRecord | None:
    try:
        html = decode_page(file.data, where)
    except CorpusError as exc:
        problems.extend(exc.problems)
        return None
    tree = LexborHTMLParser(html)
    main, fallback = _main_element(tree)
    boilerplate = _PAGE_BOILERPLATE | ({"header"} if fallback else frozenset())
    text = _Renderer(boilerplate, False).render(main) if main is not None else ""
    before = len(problems)
    raw = _page_metadata(tree, where, problems)
    if len(problems) > before:
        return None
    if not text.strip():
        refresh = _redirect(tree)
        reason = (
            f"redirect page (meta refresh {refresh!r}), no main content: not read"
            if refresh is not None
            else "no main content (nothing left once navigation, scripts and boilerplate are dropped): not read"
        )
        excluded.append(Exclusion(document_id=doc_id, location=str(file.path), reason=reason))
        return None
    path = element_path(main) if main is not None else ""
    raw = {"source_file": file.rel, "element_path": path, **raw}
    kept, not_kept = typed_metadata(raw, lambda _key: where, problems)
    if len(problems) > before:
        return None
    heading = next((line[2:].strip() for line in text.split("\n") if line.startswith("# ")), "")
    title = heading or str(raw.get("html.title") or "") or file.path.stem
    return SourceRecord(
        document_id=doc_id,
        title=normalize_text(title).strip(),
        text=text,
        access_scopes=None,
        source_role=DEFAULT_SOURCE_ROLE,
        location=str(file.path),
        metadata=kept,
        not_kept=tuple(not_kept),
    )


def parse_html_tree(tree: TreeSource) -> CorpusRead:
    """Parse the pages held by ``tree`` (never re-reading them); raise every problem at once."""
    return parse_folder(tree, _page, "HTML pages with main content")
