"""Hostile and malformed corpus input: each case with its exact outcome.

Markdown folders: symbolic links, special and hidden files, and ambiguous front matter. Records,
IDs, registration and revision keys are in test_corpus_hostile_records.py.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ragpipe.corpus.connectors import read_beir, read_markdown_folder, source_digest
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.registry import RevisionError, read_registered_corpus, register_revision
from ragpipe.corpus.snapshot import build_snapshot
from ragpipe.spec import SnapshotSpec
from ragpipe_tests.support.corpora import write_tree

OK_TEXT = "A document with enough text to be kept.\n"
KEY_RULE = "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"


def problems_of(fn, *args) -> list[str]:
    with pytest.raises(CorpusError) as info:
        fn(*args)
    return info.value.problems


# --- symbolic links and special files ------------------------------------------------------------


@pytest.fixture
def hostile_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A corpus with a symlink to /etc/passwd, a symlinked directory and a dangling link, all
    pointing outside the root, beside one ordinary document."""
    outside = write_tree(tmp_path / "outside", {"secret.md": "# Secret\n\nroot bash secret outside the corpus\n"})
    root = write_tree(tmp_path / "corpus", {"ok.md": OK_TEXT})
    (root / "passwd.md").symlink_to("/etc/passwd")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    (root / "gone.md").symlink_to(tmp_path / "missing.md")
    return root, outside


def test_symlinks_are_excluded_with_a_reason_and_never_followed(hostile_folder):
    root, outside = hostile_folder
    records = read_markdown_folder(root)
    assert [(r.document_id, r.text) for r in records] == [("ok.md", OK_TEXT)]
    expected = [
        ("gone.md", str(root / "gone.md"), "symbolic link: not followed"),
        ("linked", str(root / "linked"), "symbolic link: not followed"),
        ("passwd.md", str(root / "passwd.md"), "symbolic link: not followed"),
    ]
    assert [(e.document_id, e.location, e.reason) for e in records.excluded] == expected
    docs, summary = build_snapshot(records, "r", "public", SnapshotSpec(min_text_chars=1))
    assert [d.document_id for d in docs] == ["ok.md"]
    assert [(e.document_id, e.location, e.reason) for e in summary.excluded] == expected
    # nothing behind a link is read: changing what it points to leaves the source digest as it was
    before = source_digest(root, "markdown")
    (outside / "secret.md").write_text("# Changed\n\nother words entirely\n")
    assert source_digest(root, "markdown") == before
    # adding a link changes the digest (the snapshot's exclusions would differ)
    (root / "another.md").symlink_to(outside / "secret.md")
    assert source_digest(root, "markdown") != before


def test_snapshot_stage_records_the_symlink_exclusions(hostile_folder, tmp_path: Path):
    """The stage as Dagster runs it: registered source → read once → snapshot with exclusions."""
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.spec import load_pipeline_spec
    from ragpipe.stages import steps

    root, _ = hostile_folder
    ws, spec = Workspace(tmp_path / "home"), load_pipeline_spec()
    register_revision(ws.registry, "links", root, "markdown", "public")
    steps.run_source_snapshot(ws, "links", spec)
    facts = steps.read_stage_record(ws, "links", "source_snapshot").facts
    assert (facts["documents"], facts["excluded"]) == (1, 3)


def test_exclusions_sort_with_policy_exclusions_in_the_snapshot(hostile_folder):
    root, _ = hostile_folder
    (root / "a-short.md").write_text("tiny\n")
    _, summary = build_snapshot(read_markdown_folder(root), "r", "public", SnapshotSpec(min_text_chars=20))
    assert [(e.document_id, e.reason) for e in summary.excluded] == [
        ("a-short.md", "text shorter than min_text_chars=20"),
        ("gone.md", "symbolic link: not followed"),
        ("linked", "symbolic link: not followed"),
        ("passwd.md", "symbolic link: not followed"),
    ]


def test_fifo_is_excluded_without_being_opened(tmp_path: Path):
    root = write_tree(tmp_path / "corpus", {"ok.md": OK_TEXT})
    os.mkfifo(root / "pipe.md")  # opening it for reading would block forever: no writer
    result: list = []
    reader = threading.Thread(target=lambda: result.append(read_markdown_folder(root)), daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert not reader.is_alive(), "reading the folder blocked on the FIFO"
    (records,) = result
    assert [r.document_id for r in records] == ["ok.md"]
    assert [(e.document_id, e.reason) for e in records.excluded] == [("pipe.md", "special file (FIFO): not read")]


def test_fifo_given_as_a_beir_file_is_refused_unopened(tmp_path: Path):
    fifo = tmp_path / "corpus.jsonl"
    os.mkfifo(fifo)
    assert problems_of(read_beir, fifo) == [f"{fifo}: not a regular file"]


def test_entry_swapped_for_a_symlink_after_listing_is_not_followed(tmp_path: Path):
    """The walker opens entries with O_NOFOLLOW relative to the directory's descriptor, so an entry
    that was a regular file when listed and is a symlink when opened is excluded, not followed."""
    from ragpipe.corpus.source import _Walk

    root = tmp_path / "corpus"
    root.mkdir()
    (root / "swapped.md").symlink_to("/etc/passwd")
    (root / "dir").symlink_to("/etc", target_is_directory=True)
    walk = _Walk(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walk.regular(fd, "swapped.md", "swapped.md")  # as if lstat had seen a regular file
        walk.directory(fd, "dir", "dir")  # as if lstat had seen a directory
    finally:
        os.close(fd)
    assert walk.files == [] and walk.problems == []
    assert [(e.rel, e.reason) for e in walk.excluded] == [
        ("swapped.md", "symbolic link: not followed"),
        ("dir", "symbolic link: not followed"),
    ]


def test_only_symlinks_is_no_documents_naming_the_exclusions(tmp_path: Path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "passwd.md").symlink_to("/etc/passwd")
    assert problems_of(read_markdown_folder, root) == [
        f"{root}: no Markdown or text files found (1 excluded: passwd.md: symbolic link: not followed)"
    ]


# --- nothing in a folder is skipped silently ------------------------------------------------------

HR_FRONT = "---\naccess_scopes: [hr]\n---\nsalaries of the board\n"
HIDDEN_FILE, HIDDEN_DIR = "hidden file: not read", "hidden directory: not walked"
NOT_MARKDOWN = "not a .md, .mdx, .markdown or .txt file (any letter case): not read"


def test_every_entry_not_read_is_excluded_with_a_reason(tmp_path: Path):
    """Before: hidden files and directories and files with another (or an upper-case) suffix were
    skipped without a trace. Now upper-case suffixes are read; everything else is an exclusion."""
    root = write_tree(
        tmp_path / "corpus",
        {
            "ok.md": OK_TEXT,
            ".hr.md": HR_FRONT,
            "PAY.MD": "---\naccess_scopes: [payroll]\n---\npayroll run dates\n",
            "Notes.Markdown": OK_TEXT,
            "sub/x.TXT": OK_TEXT,
            "sub/.secret.txt": HR_FRONT,
            "README": OK_TEXT,
            "img.png": "png",
            ".git/config": "[core]\n",
            ".drafts/inner.md": HR_FRONT,
        },
    )
    (root / ".link.md").symlink_to("/etc/passwd")
    records = read_markdown_folder(root)
    assert [(r.document_id, r.access_scopes) for r in records] == [
        ("Notes.Markdown", None),
        ("PAY.MD", ("payroll",)),
        ("ok.md", None),
        ("sub/x.TXT", None),
    ]
    expected = [
        (".drafts", HIDDEN_DIR),
        (".git", HIDDEN_DIR),
        (".hr.md", HIDDEN_FILE),
        (".link.md", HIDDEN_FILE),
        ("README", NOT_MARKDOWN),
        ("img.png", NOT_MARKDOWN),
        ("sub/.secret.txt", HIDDEN_FILE),
    ]
    assert [(e.document_id, e.reason) for e in records.excluded] == expected
    assert [e.location for e in records.excluded] == [str(root / rel) for rel, _ in expected]
    _, summary = build_snapshot(records, "r", "public", SnapshotSpec(min_text_chars=1))
    assert [(e.document_id, e.reason) for e in summary.excluded] == expected


def test_a_hidden_or_other_file_added_after_registration_changes_the_digest(tmp_path: Path):
    root = write_tree(tmp_path / "corpus", {"ok.md": OK_TEXT})
    record, _ = register_revision(tmp_path / "reg", "r1", root, "markdown", "public")
    for rel in (".hr.md", "notes.docx", ".cache/x.md"):
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_text(HR_FRONT)
        with pytest.raises(RevisionError, match="changed since registration"):
            read_registered_corpus(record)
        (root / rel).unlink()
        if rel == ".cache/x.md":
            (root / ".cache").rmdir()
    assert [r.document_id for r in read_registered_corpus(record)] == ["ok.md"]


def test_contents_of_a_hidden_directory_are_not_walked(tmp_path: Path):
    """A FIFO inside a hidden directory would block a walker that descends into it."""
    root = write_tree(tmp_path / "corpus", {"ok.md": OK_TEXT})
    (root / ".hidden").mkdir()
    os.mkfifo(root / ".hidden" / "pipe.md")
    before = source_digest(root, "markdown")
    (root / ".hidden" / "more.md").write_text(HR_FRONT)
    assert source_digest(root, "markdown") == before
    assert [(e.document_id, e.reason) for e in read_markdown_folder(root).excluded] == [(".hidden", HIDDEN_DIR)]


def test_only_hidden_files_is_no_documents_naming_the_exclusions(tmp_path: Path):
    root = write_tree(tmp_path / "corpus", {".hr.md": HR_FRONT, "a.RST": OK_TEXT})
    assert problems_of(read_markdown_folder, root) == [
        f"{root}: no Markdown or text files found (2 excluded: .hr.md: {HIDDEN_FILE}; a.RST: {NOT_MARKDOWN})"
    ]


# --- front matter --------------------------------------------------------------------------------

FENCE_RULE = "(no other dashes, whitespace or invisible characters)"

BAD_FRONT_MATTER = [
    (
        "trailing_space_open",
        "--- \naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter '--- ' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "trailing_tab_open",
        "---\t\naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter '---\\t' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "leading_space_open",
        " ---\naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter ' ---' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "trailing_space_close",
        "---\naccess_scopes: [hr]\n--- \nbody\n",
        "3",
        f"front matter delimiter '--- ' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "after_blank_line",
        "\n---\naccess_scopes: [hr]\n---\nbody\n",
        "2",
        "front matter must open on line 1 (a '---' line after blank lines is ambiguous)",
    ),
    (
        "toml",
        "+++\naccess_scopes = ['hr']\n+++\nbody\n",
        "1",
        "TOML front matter ('+++') is not supported: use YAML between '---' lines",
    ),
    ("unclosed", "---\naccess_scopes: [hr]\nbody\n", "1", "front matter opened with '---' is never closed"),
    (
        "scopes_null",
        "---\naccess_scopes: null\n---\nbody\n",
        "2",
        "access_scopes must be a non-empty list of strings, got null (omit the key to use the revision's default scope)",
    ),
    (
        "scopes_empty_value",
        "---\ntitle: T\naccess_scopes:\n---\nbody\n",
        "3",
        "access_scopes must be a non-empty list of strings, got null (omit the key to use the revision's default scope)",
    ),
    (
        "scopes_empty_list",
        "---\naccess_scopes: []\n---\nbody\n",
        "2",
        "access_scopes must be a non-empty list of strings, got []",
    ),
    (
        "scopes_string",
        "---\naccess_scopes: hr\n---\nbody\n",
        "2",
        'access_scopes must be a non-empty list of strings, got "hr"',
    ),
    (
        "scopes_yaml_bool",
        "---\naccess_scopes: [yes]\n---\nbody\n",
        "2",
        "access_scopes must be a non-empty list of strings, got [true]",
    ),
    (
        "scope_with_newline",
        '---\naccess_scopes: ["hr\\n"]\n---\nbody\n',
        "2",
        "invalid access scope 'hr\\n' (allowed: letters, digits, . _ : -)",
    ),
    ("role_null", "---\nsource_role: ~\n---\nbody\n", "2", "source_role must be a short identifier string, got null"),
    ("title_null", "---\ntitle: null\n---\nbody\n", "2", "front-matter 'title' must be a string, got null"),
    (
        "title_date",
        "---\ntitle: 2024-01-01\n---\nbody\n",
        "2",
        "front-matter 'title' must be a string, got date 2024-01-01",
    ),
    (
        "duplicate_key",
        "---\naccess_scopes: [hr]\naccess_scopes: [public]\n---\nbody\n",
        "3",
        "front matter is not valid YAML: duplicate key 'access_scopes' (first on line 2)",
    ),
    (
        "duplicate_key_flow",
        "---\n{access_scopes: [hr], access_scopes: [public]}\n---\nbody\n",
        "2",
        "front matter is not valid YAML: duplicate key 'access_scopes' (first on line 2)",
    ),
    (
        "bad_yaml",
        "---\naccess_scopes: [hr\n---\nbody\n",
        "2",
        "front matter is not valid YAML: expected ',' or ']', but got '<stream end>'",
    ),
    ("not_mapping", "---\n- hr\n---\nbody\n", "1", "front matter must be a mapping"),
    (
        "scopes_key",
        "---\ntitle: T\nscopes: [hr]\n---\nbody\n",
        "3",
        "metadata key 'scopes' must be spelt exactly 'access_scopes' (a misspelt security key is refused, never kept as metadata)",
    ),
    # fence lookalikes (found by an adversarial review): each was read as text under the default scope
    (
        "four_dashes_open",
        "----\naccess_scopes: [hr]\n----\nbody\n",
        "1",
        f"front matter delimiter '----' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "four_dashes_close",
        "---\naccess_scopes: [hr]\n----\nbody\n",
        "3",
        f"front matter delimiter '----' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "zero_width_space_open",
        "\u200b---\naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter '\\u200b---' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "zero_width_space_after",
        "---\u200b\naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter '---\\u200b' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "word_joiner_open",
        "\u2060---\naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter '\\u2060---' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "second_bom_open",
        "\ufeff\ufeff---\naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter '\\ufeff---' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "no_break_space_open",
        "\u00a0---\naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter '\\xa0---' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "spaced_dashes_open",
        "- - -\naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter '- - -' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "em_dash_open",
        "\u2014\naccess_scopes: [hr]\n\u2014\nbody\n",
        "1",
        f"front matter delimiter '\u2014' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "fullwidth_dashes_open",
        "\uff0d\uff0d\uff0d\naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter '\uff0d\uff0d\uff0d' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "long_rule_open",
        "-" * 100 + "\naccess_scopes: [hr]\n---\nbody\n",
        "1",
        f"front matter delimiter '{'-' * 40}…' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "zero_width_space_close",
        "---\naccess_scopes: [hr]\n\u200b---\nbody\n---\n",
        "3",
        f"front matter delimiter '\\u200b---' must be exactly '---' {FENCE_RULE}",
    ),
    (
        "invisible_line_first",
        "\u200b\n---\naccess_scopes: [hr]\n---\nbody\n",
        "2",
        "front matter must open on line 1 (a '---' line after blank lines is ambiguous)",
    ),
    (
        "zero_width_space_toml",
        "\u200b+++\naccess_scopes = ['hr']\n+++\nbody\n",
        "1",
        "TOML front matter ('+++') is not supported: use YAML between '---' lines",
    ),
]


@pytest.mark.parametrize(("name", "text", "line", "rule"), BAD_FRONT_MATTER, ids=[c[0] for c in BAD_FRONT_MATTER])
def test_ambiguous_or_malformed_front_matter_fails_closed(tmp_path: Path, name: str, text: str, line: str, rule: str):
    root = write_tree(tmp_path / name, {"ok.md": OK_TEXT, "a.md": text})
    assert problems_of(read_markdown_folder, root) == [f"{root / 'a.md'}:{line} [id=a.md]: {rule}"]


VALID_FRONT_MATTER = [
    ("explicit_public", "---\naccess_scopes: [public]\n---\nbody text\n", ("public",), "primary", "a"),
    ("duplicated_scope", "---\naccess_scopes: [hr, hr, finance]\n---\nbody text\n", ("finance", "hr"), "primary", "a"),
    ("empty_block", "---\n---\nbody text\n", None, "primary", "a"),
    ("crlf", "---\r\naccess_scopes: [hr]\r\nsource_role: faq\r\ntitle: T\r\n---\r\nbody text\r\n", ("hr",), "faq", "T"),
    ("rule_in_body", "---\naccess_scopes: [hr]\n---\nbody text\n\n---\n\nmore\n", ("hr",), "primary", "a"),
    ("no_front_matter", "body text\n\n---\n\naccess_scopes: [hr]\n", None, "primary", "a"),
    # the one leading BOM is dropped by the declared normalisation, so this is plain '---'
    ("bom_then_fence", "\ufeff---\naccess_scopes: [hr]\n---\nbody text\n", ("hr",), "primary", "a"),
]


@pytest.mark.parametrize(
    ("name", "text", "scopes", "role", "title"), VALID_FRONT_MATTER, ids=[c[0] for c in VALID_FRONT_MATTER]
)
def test_explicit_valid_front_matter_still_works(tmp_path: Path, name: str, text: str, scopes, role: str, title: str):
    (rec,) = read_markdown_folder(write_tree(tmp_path / name, {"a.md": text}))
    assert (rec.access_scopes, rec.source_role, rec.title) == (scopes, role, title)
    assert rec.text.startswith("body text\n")


NOT_FENCES = ["***\nbody text\n", "- item\n---\n", "-- \nsignature\n", "# T \u2014 x\n\n-----\n", "a\u200d---\nbody\n"]


@pytest.mark.parametrize("text", NOT_FENCES, ids=range(len(NOT_FENCES)))
def test_first_lines_that_do_not_look_like_a_fence_are_text(tmp_path: Path, text: str):
    """No letter or digit plus three hyphens or a typographic dash makes a fence lookalike; a line
    with a word on it, ``***`` or a two-hyphen signature marker is text, as before."""
    (rec,) = read_markdown_folder(write_tree(tmp_path / "c", {"a.md": text}))
    assert (rec.text, rec.access_scopes) == (text, None)


@pytest.mark.parametrize(
    ("front", "problem"),
    [
        ("x: " + "[" * 5000 + "]" * 5000, "2 [id=a.md]: front matter: nesting deeper than 64 levels (column 67)"),
        (
            "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]",
            "3 [id=a.md]: front matter: YAML alias *a is not allowed (anchors and aliases are refused in "
            "configuration: write the value out)",
        ),
        ("a:\n  " + "- " * 70 + "x", "3 [id=a.md]: front matter: nesting deeper than 64 levels (column 129)"),
        ("a:\n  " + "- " * 2000 + "x", "3 [id=a.md]: front matter: nesting deeper than 64 levels (column 129)"),
    ],
    ids=["deep", "alias", "compact-70", "compact-2000"],
)
def test_front_matter_nested_past_the_bound_or_with_aliases_is_one_problem(tmp_path: Path, front, problem):
    (tmp_path / "a.md").write_text(f"---\n{front}\n---\nbody text long enough here\n")
    with pytest.raises(CorpusError) as info:
        read_markdown_folder(tmp_path)
    assert info.value.problems == [f"{tmp_path / 'a.md'}:{problem}"]
