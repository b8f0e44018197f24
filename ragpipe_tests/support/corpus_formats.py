"""Real-shaped corpora in the formats teams keep documents in, generated for the corpus tests:
a Sphinx-built HTML site, PDFs written by a PDF library (fpdf2), a WordPress export (WXR) with
WooCommerce products."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

from ragpipe_tests.support.cli import homes_under, run_cli


def ragpipe(*args: str, home: Path) -> subprocess.CompletedProcess:
    """The ``ragpipe`` command as a user runs it, with its homes under ``home``."""
    return run_cli(*args, env=homes_under(home))


# ------------------------------------------------------------------------------------ HTML site


def sphinx_page(title: str, body: str, *, canonical: str, description: str, charset: str = "utf-8") -> str:
    """A page as Sphinx's basic theme writes it: related-links bar, the document in
    ``div.body[role=main]``, a sidebar with a search form, a footer, scripts and styles."""
    return f"""<!DOCTYPE html>
<html lang="en">
  <head>
    <meta charset="{charset}" />
    <meta name="viewport" content="width=device-width, initial-scale=1.0" />
    <meta name="description" content="{description}" />
    <meta property="og:title" content="{title}" />
    <meta name="keywords" content="install" />
    <meta name="keywords" content="setup" />
    <title>{title} &#8212; Widget 2.1 documentation</title>
    <link rel="stylesheet" type="text/css" href="_static/pygments.css" />
    <link rel="canonical" href="{canonical}" />
    <script src="_static/documentation_options.js"></script>
    <script>window.MathJax = {{"tex": {{"inlineMath": [["$", "$"]]}}}};</script>
    <style>div.body {{ max-width: 800px; }}</style>
  </head>
  <body>
    <div class="related" role="navigation" aria-label="Related">
      <h3>Navigation</h3>
      <ul><li class="right"><a href="genindex.html" title="General Index">index</a></li>
          <li class="nav-item nav-item-0"><a href="index.html">Widget 2.1 documentation</a> &#187;</li></ul>
    </div>
    <div class="document">
      <div class="documentwrapper">
        <div class="bodywrapper">
          <div class="body" role="main">
{body}
          </div>
        </div>
      </div>
      <div class="sphinxsidebar" role="navigation" aria-label="Main">
        <div class="sphinxsidebarwrapper">
          <h3>Table of Contents</h3>
          <ul><li><a class="reference internal" href="#">Install</a></li></ul>
          <div id="searchbox" style="display: none" role="search">
            <h3 id="searchlabel">Quick search</h3>
            <form class="search" action="search.html" method="get"><input type="text" name="q" /></form>
          </div>
          <script>document.getElementById('searchbox').style.display = "block"</script>
        </div>
      </div>
      <div class="clearer"></div>
    </div>
    <div class="footer" role="contentinfo">&#169; Copyright 2024, Widget team. Created using Sphinx 7.2.6.</div>
  </body>
</html>
"""


INSTALL_BODY = """  <section id="installing-widget">
<h1>Installing Widget<a class="headerlink" href="#installing-widget" title="Link to this heading">¶</a></h1>
<p>Widget runs on Python&nbsp;3.11 and
   later. Install it with <code class="docutils literal notranslate"><span class="pre">pip</span></code>:</p>
<div class="highlight-console notranslate"><div class="highlight"><pre><span></span><span class="gp">$ </span>pip install widget
# then check it
<span class="gp">$ </span>widget --version
</pre></div></div>
<section id="from-source">
<h2>From source<a class="headerlink" href="#from-source" title="Link to this heading">¶</a></h2>
<ol class="arabic simple">
<li><p>Clone the repository.</p></li>
<li><p>Run <code>make install</code>.</p></li>
</ol>
<table class="docutils align-default">
<thead><tr class="row-odd"><th class="head"><p>Platform</p></th><th class="head"><p>Status</p></th></tr></thead>
<tbody><tr class="row-even"><td><p>Linux</p></td><td><p>supported</p></td></tr></tbody>
</table>
<div class="admonition note"><p class="admonition-title">Note</p><p>Windows needs WSL.</p></div>
</section>
</section>
"""

INSTALL_TEXT = """# Installing Widget

Widget runs on Python\u00a03.11 and later. Install it with pip:

```
$ pip install widget
# then check it
$ widget --version
```

## From source

1. Clone the repository.
2. Run make install.

Platform | Status
Linux | supported

Note

Windows needs WSL.
"""

INDEX_BODY = """  <section id="welcome">
<h1>Welcome to Widget<a class="headerlink" href="#welcome" title="Link to this heading">¶</a></h1>
<p>Widget turns gadgets into widgets.</p>
<div class="toctree-wrapper compound"><ul><li class="toctree-l1"><a class="reference internal" href="install.html">Installing Widget</a></li></ul></div>
</section>
"""

REDIRECT_PAGE = """<!DOCTYPE html>
<html><head><meta http-equiv="refresh" content="0; url=install.html" /><title>Moved</title></head><body></body></html>
"""


def sphinx_site(root: Path) -> Path:
    """A Sphinx ``_build/html`` folder: pages, a redirect stub, and the files every build leaves
    beside them (static assets, sources, the search index, ``.buildinfo``)."""
    pages = {
        "index.html": sphinx_page(
            "Welcome to Widget", INDEX_BODY, canonical="https://docs.example.com/index.html", description="Widget docs"
        ),
        "install.html": sphinx_page(
            "Installing Widget",
            INSTALL_BODY,
            canonical="https://docs.example.com/install.html",
            description="How to install Widget",
        ),
        "old/setup.html": REDIRECT_PAGE,
    }
    files: dict[str, bytes] = {rel: text.encode("utf-8") for rel, text in pages.items()}
    files["_static/basic.css"] = b"div.body { min-width: 360px; }\n"
    files["_static/doctools.js"] = b"'use strict';\n"
    files["_sources/install.rst.txt"] = b"Installing Widget\n=================\n"
    files["searchindex.js"] = b'Search.setIndex({"docnames": ["index", "install"]})\n'
    files["objects.inv"] = b"# Sphinx inventory version 2\n"
    files[".buildinfo"] = b"# Sphinx build info version 1\nconfig: 0\n"
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


# ------------------------------------------------------------------------------------------ PDF

IMAGE = "image"  # a page holding only a picture (as a scanner writes it): no text layer
BLANK = "blank"  # a page with nothing on it


def pdf_bytes(
    pages: list[str], *, user_password: str | None = None, title: str | None = None, author: str | None = None
) -> bytes:
    """A PDF written by fpdf2: one page per entry (text lines, ``IMAGE`` or ``BLANK``)."""
    from fpdf import FPDF
    from PIL import Image

    pdf = FPDF()
    pdf.set_creation_date(dt.datetime(2024, 5, 1, 10, 0, tzinfo=dt.UTC))
    if title:
        pdf.set_title(title)
    if author:
        pdf.set_author(author)
    pdf.set_font("helvetica", size=12)
    for page in pages:
        pdf.add_page()
        if page == IMAGE:
            pdf.image(Image.new("RGB", (240, 320), (230, 230, 220)), x=10, y=10, w=120)
        elif page != BLANK:
            for line in page.split("\n"):
                pdf.cell(0, 10, line, new_x="LMARGIN", new_y="NEXT")
    if user_password is not None:
        pdf.set_encryption(owner_password="owner-secret", user_password=user_password)
    return bytes(pdf.output())


# ------------------------------------------------------------------------------------------ WXR

WXR_HEAD = """<?xml version="1.0" encoding="UTF-8" ?>
<!-- This is a WordPress eXtended RSS file generated by WordPress as an export of your site. -->
<rss version="2.0"
	xmlns:excerpt="http://wordpress.org/export/1.2/excerpt/"
	xmlns:content="http://purl.org/rss/1.0/modules/content/"
	xmlns:wfw="http://wellformedweb.org/CommentAPI/"
	xmlns:dc="http://purl.org/dc/elements/1.1/"
	xmlns:wp="http://wordpress.org/export/1.2/"
>
<channel>
	<title>Gadget Shop</title>
	<link>https://shop.example.com</link>
	<description>Gadgets and widgets</description>
	<language>en-US</language>
	<wp:wxr_version>1.2</wp:wxr_version>
	<wp:base_site_url>https://shop.example.com</wp:base_site_url>
	<wp:base_blog_url>https://shop.example.com</wp:base_blog_url>
	<wp:author><wp:author_id>1</wp:author_id><wp:author_login><![CDATA[ann]]></wp:author_login></wp:author>
	<wp:category><wp:term_id>1</wp:term_id><wp:category_nicename><![CDATA[news]]></wp:category_nicename><wp:cat_name><![CDATA[News]]></wp:cat_name></wp:category>
"""
WXR_TAIL = "</channel>\n</rss>\n"


def wxr_item(
    post_id: int,
    title: str,
    content: str,
    *,
    post_type: str = "post",
    status: str = "publish",
    slug: str = "",
    excerpt: str = "",
    terms: tuple[tuple[str, str], ...] = (),
    meta: tuple[tuple[str, str], ...] = (),
    password: str = "",
    date_gmt: str = "2024-05-01 10:00:00",
) -> str:
    """One ``<item>`` as WordPress 6 exports it (terms: (domain, name); meta: (key, value))."""
    categories = "".join(
        f'\t\t<category domain="{domain}" nicename="{name.lower().replace(" ", "-")}"><![CDATA[{name}]]></category>\n'
        for domain, name in terms
    )
    postmeta = "".join(
        f"\t\t<wp:postmeta>\n\t\t\t<wp:meta_key><![CDATA[{key}]]></wp:meta_key>\n"
        f"\t\t\t<wp:meta_value><![CDATA[{value}]]></wp:meta_value>\n\t\t</wp:postmeta>\n"
        for key, value in meta
    )
    slug = slug or title.lower().replace(" ", "-")
    link = f"https://shop.example.com/{slug}/" if status == "publish" else f"https://shop.example.com/?p={post_id}"
    return f"""	<item>
		<title><![CDATA[{title}]]></title>
		<link>{link}</link>
		<pubDate>Wed, 01 May 2024 10:00:00 +0000</pubDate>
		<dc:creator><![CDATA[ann]]></dc:creator>
		<guid isPermaLink="false">https://shop.example.com/?p={post_id}</guid>
		<description></description>
		<content:encoded><![CDATA[{content}]]></content:encoded>
		<excerpt:encoded><![CDATA[{excerpt}]]></excerpt:encoded>
		<wp:post_id>{post_id}</wp:post_id>
		<wp:post_date><![CDATA[2024-05-01 12:00:00]]></wp:post_date>
		<wp:post_date_gmt><![CDATA[{date_gmt}]]></wp:post_date_gmt>
		<wp:post_modified><![CDATA[2024-05-02 12:00:00]]></wp:post_modified>
		<wp:post_modified_gmt><![CDATA[2024-05-02 10:00:00]]></wp:post_modified_gmt>
		<wp:comment_status><![CDATA[open]]></wp:comment_status>
		<wp:ping_status><![CDATA[open]]></wp:ping_status>
		<wp:post_name><![CDATA[{slug}]]></wp:post_name>
		<wp:status><![CDATA[{status}]]></wp:status>
		<wp:post_parent>0</wp:post_parent>
		<wp:menu_order>0</wp:menu_order>
		<wp:post_type><![CDATA[{post_type}]]></wp:post_type>
		<wp:post_password><![CDATA[{password}]]></wp:post_password>
		<wp:is_sticky>0</wp:is_sticky>
{categories}{postmeta}		<wp:comment>
			<wp:comment_id>5</wp:comment_id>
			<wp:comment_author><![CDATA[A visitor]]></wp:comment_author>
			<wp:comment_content><![CDATA[Nice post, buy my pills.]]></wp:comment_content>
		</wp:comment>
	</item>
"""


HELLO_CONTENT = """<!-- wp:paragraph -->
<p>Our new <strong>Gadget&nbsp;Pro</strong> ships this week.</p>
<!-- /wp:paragraph -->

<!-- wp:heading -->
<h2 class="wp-block-heading">What is new</h2>
<!-- /wp:heading -->

<!-- wp:list -->
<ul><li>Longer battery</li><li>USB-C</li></ul>
<!-- /wp:list -->"""

HELLO_TEXT = "Our new Gadget\u00a0Pro ships this week.\n\n## What is new\n\n- Longer battery\n- USB-C\n"

CLASSIC_CONTENT = "Shipping takes three days.\n\nReturns are free for thirty days.\nKeep the receipt."
CLASSIC_TEXT = "Shipping takes three days.\n\nReturns are free for thirty days. Keep the receipt.\n"


def shop_items() -> list[str]:
    """A shop's export: a post, a classic-editor page, two products, a draft, an attachment, a
    password-protected post, a menu item."""
    return [
        wxr_item(
            12,
            "Gadget Pro is here &amp; ready",
            HELLO_CONTENT,
            slug="gadget-pro-is-here",
            terms=(("category", "News"), ("post_tag", "launch"), ("post_tag", "gadgets")),
        ),
        wxr_item(7, "Shipping and returns", CLASSIC_CONTENT, post_type="page"),
        wxr_item(
            31,
            "Gadget Pro",
            "<p>A gadget for professionals.</p><h3>Specifications</h3><table><tr><td>Weight</td><td>120 g</td></tr></table>",
            post_type="product",
            excerpt="<p>The best gadget we make.</p>",
            terms=(
                ("product_type", "simple"),
                ("product_cat", "Gadgets"),
                ("product_cat", "Pro line"),
                ("product_tag", "bestseller"),
            ),
            meta=(
                ("_sku", "GP-001"),
                ("_price", "199.90"),
                ("_regular_price", "219.90"),
                ("_sale_price", "199.90"),
                ("_stock_status", "instock"),
                ("_edit_lock", "1714550000:1"),
            ),
        ),
        wxr_item(
            32,
            "Widget Mini",
            "<p>Small, cheap and good enough for most homes.</p>",
            post_type="product",
            terms=(("product_cat", "Widgets"),),
            meta=(("_sku", "WM-7"), ("_price", "15")),
        ),
        wxr_item(
            40, "Upcoming sale", "<p>Not announced yet: 50% off.</p>", status="draft", date_gmt="0000-00-00 00:00:00"
        ),
        wxr_item(
            41, "Staff notes", "<p>Internal only: the staff discount code changes every Monday.</p>", status="private"
        ),
        wxr_item(50, "gadget-photo", "", post_type="attachment", status="inherit"),
        wxr_item(60, "Members deal", "<p>Secret price.</p>", password="hunter2"),
        wxr_item(70, "Home", "", post_type="nav_menu_item"),
    ]


def wxr_export(items: list[str]) -> bytes:
    return (WXR_HEAD + "".join(items) + WXR_TAIL).encode("utf-8")
