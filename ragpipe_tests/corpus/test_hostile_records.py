"""Hostile and malformed records, IDs, registration and revision keys; the
Markdown-folder cases (links, special and hidden files, front matter) are in test_corpus_hostile.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ragpipe.corpus import registry as registry_module
from ragpipe.corpus.connectors import read_beir, read_markdown_folder, source_digest
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.registry import (
    RevisionError,
    check_revision_key,
    list_revisions,
    load_revision,
    read_registered_corpus,
    register_revision,
)
from ragpipe.corpus.rules import MAX_ID_BYTES
from ragpipe.kernel.ids import bytes_digest
from ragpipe_tests.support.cli import homes_under, run_cli
from ragpipe_tests.support.corpora import write_tree

OK_TEXT = "A document with enough text to be kept.\n"
KEY_RULE = "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"


def problems_of(fn, *args) -> list[str]:
    with pytest.raises(CorpusError) as info:
        fn(*args)
    return info.value.problems


# --- JSONL: explicit nulls, wrong types, duplicate keys ------------------------------------------

GOOD = '{"_id": "d1", "text": "Some text that is long enough."}\n'

BAD_JSONL = [
    (
        "metadata_null",
        '{"_id": "d2", "text": "t", "metadata": null}',
        "[id=d2]: 'metadata' must be an object, got null",
    ),
    ("metadata_list", '{"_id": "d2", "text": "t", "metadata": []}', "[id=d2]: 'metadata' must be an object, got []"),
    (
        "metadata_false",
        '{"_id": "d2", "text": "t", "metadata": false}',
        "[id=d2]: 'metadata' must be an object, got false",
    ),
    (
        "scopes_null",
        '{"_id": "d2", "text": "t", "metadata": {"access_scopes": null}}',
        "[id=d2]: access_scopes must be a non-empty list of strings, got null (omit the key to use the revision's default scope)",
    ),
    (
        "scopes_empty",
        '{"_id": "d2", "text": "t", "metadata": {"access_scopes": []}}',
        "[id=d2]: access_scopes must be a non-empty list of strings, got []",
    ),
    (
        "scope_newline",
        '{"_id": "d2", "text": "t", "metadata": {"access_scopes": ["hr\\n"]}}',
        "[id=d2]: invalid access scope 'hr\\n' (allowed: letters, digits, . _ : -)",
    ),
    (
        "role_null",
        '{"_id": "d2", "text": "t", "metadata": {"source_role": null}}',
        "[id=d2]: source_role must be a short identifier string, got null",
    ),
    ("duplicate_id_key", '{"_id": "d2", "_id": "d3", "text": "t"}', ": duplicate key '_id' in a JSON object"),
    (
        "duplicate_text_key",
        '{"_id": "d2", "text": "public words", "text": "t"}',
        "[id=d2]: duplicate key 'text' in a JSON object",
    ),
    (
        "duplicate_metadata_key",
        '{"_id": "d2", "text": "t", "metadata": {"access_scopes": ["hr"], "access_scopes": ["public"]}}',
        "[id=d2]: duplicate key 'access_scopes' in a JSON object",
    ),
    (
        "nan",
        '{"_id": "d2", "text": "t", "metadata": {"x": NaN}}',
        ": malformed JSON: non-finite number NaN is not JSON",
    ),
    (
        "surrogate_text",
        '{"_id": "d2", "text": "a\\ud800b"}',
        "[id=d2]: 'text' contains a lone surrogate U+D800 at index 1 (not valid Unicode)",
    ),
    (
        "surrogate_title",
        '{"_id": "d2", "title": "\\udfff", "text": "t"}',
        "[id=d2]: 'title' contains a lone surrogate U+DFFF at index 0 (not valid Unicode)",
    ),
]


@pytest.mark.parametrize(("name", "line", "rule"), BAD_JSONL, ids=[c[0] for c in BAD_JSONL])
def test_jsonl_nulls_wrong_types_and_duplicate_keys_are_refused(tmp_path: Path, name: str, line: str, rule: str):
    path = tmp_path / f"{name}.jsonl"
    path.write_text(GOOD + line + "\n", encoding="utf-8")
    sep = "" if rule.startswith(":") else " "
    assert problems_of(read_beir, path) == [f"{path}:2{sep}{rule}"]


def test_explicit_valid_metadata_still_works(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        GOOD
        + '{"_id": "d2", "text": "t", "metadata": {}}\n'
        + '{"_id": "d3", "text": "t", "metadata": {"access_scopes": ["public"], "source_role": "faq"}}\n',
        encoding="utf-8",
    )
    assert [(r.document_id, r.access_scopes, r.source_role) for r in read_beir(path)] == [
        ("d1", None, "primary"),
        ("d2", None, "primary"),
        ("d3", ("public",), "faq"),
    ]


NEAR_MISS_KEYS = [
    ("access_scope", "access_scopes"),
    ("Access_Scopes", "access_scopes"),
    ("access_scopes ", "access_scopes"),
    (" access_scopes", "access_scopes"),
    ("ACCESS-SCOPES", "access_scopes"),
    ("accessScopes", "access_scopes"),
    ("access scopes", "access_scopes"),
    ("access.scope", "access_scopes"),
    ("access_scopes\u200b", "access_scopes"),
    ("\uff41ccess_scopes", "access_scopes"),  # fullwidth "a": NFKC
    ("source-role", "source_role"),
    ("sourceRole", "source_role"),
    ("source_roles", "source_role"),
    ("SOURCE_ROLE", "source_role"),
]


@pytest.mark.parametrize(("key", "intended"), NEAR_MISS_KEYS, ids=[repr(k) for k, _ in NEAR_MISS_KEYS])
def test_jsonl_near_miss_security_metadata_keys_are_refused(tmp_path: Path, key: str, intended: str):
    """Before: listed under ignored_metadata_keys, and the document got the default scope; a
    near miss must never become ordinary metadata either."""
    path = tmp_path / "c.jsonl"
    path.write_text(GOOD + json.dumps({"_id": "d2", "text": "t", "metadata": {key: ["hr"]}}) + "\n")
    assert problems_of(read_beir, path) == [
        f"{path}:2 [id=d2]: metadata key {key!r} must be spelt exactly {intended!r} (a misspelt security key is refused, never kept as metadata)"
    ]
    with pytest.raises(CorpusError):
        register_revision(tmp_path / "reg", "k1", path, "beir", "public")
    assert list_revisions(tmp_path / "reg") == []


def test_jsonl_near_miss_beside_the_exact_key_and_every_near_miss_is_named(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    metadata = {"access_scopes": ["hr"], "Access_Scopes": ["public"], "url": "x", "sourceRole": "faq"}
    path.write_text(GOOD + json.dumps({"_id": "d2", "text": "t", "metadata": metadata}) + "\n")
    rule = "(a misspelt security key is refused, never kept as metadata)"
    assert problems_of(read_beir, path) == [
        f"{path}:2 [id=d2]: metadata key 'Access_Scopes' must be spelt exactly 'access_scopes' {rule}",
        f"{path}:2 [id=d2]: metadata key 'sourceRole' must be spelt exactly 'source_role' {rule}",
    ]


def test_jsonl_unrelated_metadata_keys_are_kept_as_metadata(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    unrelated = {
        "url": "x",
        "access": "y",
        "access_level": 3,
        "scopes_note": "z",
        "source": "s",
        "role": "r",
        "access_scopes_v2": ["hr"],
    }
    path.write_text(
        json.dumps({"_id": "d1", "text": "t", "metadata": {"access_scopes": ["staff"], **unrelated}}) + "\n"
    )
    (rec,) = read_beir(path)
    assert (rec.access_scopes, rec.source_role) == (("staff",), "primary")
    assert {k: v.as_json() for k, v in rec.metadata.items()} == unrelated


# --- document IDs ---------------------------------------------------------------------------------

BAD_IDS = [
    ("nfc_collision", "cafe\u0301", "[id=café]: duplicate document ID after NFC normalization (first seen on line 1)"),
    ("nul", "a\u0000b", "[id=a\\x00b]: document ID contains control character U+0000 (not allowed in IDs)"),
    ("newline", "a\nb", "[id=a\\x0ab]: document ID contains control character U+000A (not allowed in IDs)"),
    ("tab", "a\tb", "[id=a\\x09b]: document ID contains control character U+0009 (not allowed in IDs)"),
    ("del", "a\u007fb", "[id=a\\x7fb]: document ID contains control character U+007F (not allowed in IDs)"),
    ("c1", "a\u0085b", "[id=a\\x85b]: document ID contains control character U+0085 (not allowed in IDs)"),
    (
        "line_separator",
        "a\u2028b",
        "[id=a\\u2028b]: document ID contains control character U+2028 (not allowed in IDs)",
    ),
    ("lone_surrogate", "a\ud800b", "[id=a\\ud800b]: document ID contains a lone surrogate U+D800 (not valid Unicode)"),
    (
        "bidi_rlo",
        "a\u202egpj.md",
        "[id=a\\u202egpj.md]: document ID contains bidirectional control character U+202E (not allowed in IDs: it reorders how the ID is displayed)",
    ),
    (
        "bidi_lre",
        "a\u202agpj.md",
        "[id=a\\u202agpj.md]: document ID contains bidirectional control character U+202A (not allowed in IDs: it reorders how the ID is displayed)",
    ),
    (
        "bidi_pdf",
        "a\u202cgpj.md",
        "[id=a\\u202cgpj.md]: document ID contains bidirectional control character U+202C (not allowed in IDs: it reorders how the ID is displayed)",
    ),
    (
        "bidi_lri",
        "a\u2066gpj.md",
        "[id=a\\u2066gpj.md]: document ID contains bidirectional control character U+2066 (not allowed in IDs: it reorders how the ID is displayed)",
    ),
    (
        "bidi_pdi",
        "a\u2069gpj.md",
        "[id=a\\u2069gpj.md]: document ID contains bidirectional control character U+2069 (not allowed in IDs: it reorders how the ID is displayed)",
    ),
    (
        "bidi_lrm",
        "a\u200egpj.md",
        "[id=a\\u200egpj.md]: document ID contains bidirectional control character U+200E (not allowed in IDs: it reorders how the ID is displayed)",
    ),
    (
        "bidi_rlm",
        "a\u200fgpj.md",
        "[id=a\\u200fgpj.md]: document ID contains bidirectional control character U+200F (not allowed in IDs: it reorders how the ID is displayed)",
    ),
    (
        "bidi_alm",
        "a\u061cgpj.md",
        "[id=a\\u061cgpj.md]: document ID contains bidirectional control character U+061C (not allowed in IDs: it reorders how the ID is displayed)",
    ),
    ("too_long", "x" * 513, f"[id={'x' * 80}… (513 bytes)]: document ID is 513 UTF-8 bytes long (limit 512)"),
    ("too_long_multibyte", "é" * 257, f"[id={'é' * 80}… (514 bytes)]: document ID is 514 UTF-8 bytes long (limit 512)"),
    ("ten_kb", "k" * 10_240, f"[id={'k' * 80}… (10240 bytes)]: document ID is 10240 UTF-8 bytes long (limit 512)"),
]


@pytest.mark.parametrize(("name", "doc_id", "rule"), BAD_IDS, ids=[c[0] for c in BAD_IDS])
def test_bad_ids_are_refused_at_validation_naming_line_and_id(tmp_path: Path, name: str, doc_id: str, rule: str):
    path = tmp_path / f"{name}.jsonl"
    # json.dumps escapes control characters and surrogates the way an exporter would
    path.write_text(json.dumps({"_id": "café", "text": "t"}) + "\n" + json.dumps({"_id": doc_id, "text": "t"}) + "\n")
    assert problems_of(read_beir, path) == [f"{path}:2 {rule}"]
    registry = tmp_path / "reg"
    with pytest.raises(CorpusError):
        register_revision(registry, "k1", path, "beir", "public")
    assert list_revisions(registry) == []


def test_ids_with_joiners_and_other_format_characters_are_allowed(tmp_path: Path):
    """ZWNJ spells Persian words, ZWJ emoji sequences: only bidirectional controls are refused."""
    ids = ["\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645", "\U0001f469\u200d\U0001f4bb", "soft\u00adhyphen"]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"_id": i, "text": "t"}) + "\n" for i in ids))
    assert [r.document_id for r in read_beir(path)] == ids


def test_messages_escape_what_a_reader_cannot_see():
    from ragpipe.corpus.rules import shown_id

    assert shown_id("a\u200db\u00a0c\u200bd e\u202e") == "a\\u200db\\xa0c\\u200bd e\\u202e"


def test_markdown_file_name_with_a_bidi_control_is_refused(tmp_path: Path):
    root = write_tree(tmp_path / "corpus", {"ok.md": OK_TEXT, "a\u202egpj.md": OK_TEXT, "d\u2067ir/x.md": OK_TEXT})
    rule = "(not allowed in IDs: it reorders how the ID is displayed)"
    assert problems_of(read_markdown_folder, root) == [
        f"{root}/a\\u202egpj.md [id=a\\u202egpj.md]: document ID contains bidirectional control character U+202E {rule}",
        f"{root}/d\\u2067ir/x.md [id=d\\u2067ir/x.md]: document ID contains bidirectional control character U+2067 {rule}",
    ]


def test_id_length_limit_is_in_utf8_bytes(tmp_path: Path):
    assert MAX_ID_BYTES == 512
    path = tmp_path / "c.jsonl"
    ids = ["x" * 512, "é" * 256]  # both exactly 512 bytes
    path.write_text("".join(json.dumps({"_id": i, "text": "t"}) + "\n" for i in ids))
    assert [r.document_id for r in read_beir(path)] == ids


def test_markdown_file_names_colliding_after_nfc_are_refused(tmp_path: Path):
    nfd = "cafe\u0301.md"  # sorts first ("e" < "é"), so the NFC name is the duplicate
    root = write_tree(tmp_path / "corpus", {"café.md": OK_TEXT, nfd: OK_TEXT})
    assert problems_of(read_markdown_folder, root) == [
        f"{root / 'café.md'} [id=café.md]: duplicate document ID after NFC normalization: "
        f"'caf\\xe9.md' and 'cafe\\u0301.md' (first seen at {root / nfd})"
    ]


def test_markdown_ids_are_nfc(tmp_path: Path):
    root = write_tree(tmp_path / "corpus", {"cafe\u0301/ne\u0301.md": OK_TEXT})
    (rec,) = read_markdown_folder(root)
    assert rec.document_id == "café/né.md"


def test_markdown_file_name_with_control_character_is_refused(tmp_path: Path):
    root = write_tree(tmp_path / "corpus", {"ok.md": OK_TEXT, "new\nline.md": OK_TEXT, "bell\x07.md": OK_TEXT})
    assert problems_of(read_markdown_folder, root) == [
        f"{root}/bell\\x07.md [id=bell\\x07.md]: document ID contains control character U+0007 (not allowed in IDs)",
        f"{root}/new\\x0aline.md [id=new\\x0aline.md]: document ID contains control character U+000A (not allowed in IDs)",
    ]


def test_markdown_path_longer_than_the_id_limit_is_refused(tmp_path: Path):
    rel = "/".join(["d" * 200, "e" * 200, "f" * 110 + ".md"])  # 200+1+200+1+113 = 515 bytes
    root = write_tree(tmp_path / "corpus", {rel: OK_TEXT})
    assert problems_of(read_markdown_folder, root) == [
        f"{root / rel} [id={rel[:80]}… (515 bytes)]: document ID is 515 UTF-8 bytes long (limit 512)"
    ]


def test_non_utf8_file_and_directory_names_name_the_escaped_path(tmp_path: Path):
    root = write_tree(tmp_path / "corpus", {"ok.md": OK_TEXT})
    raw_root = os.fsencode(root)
    with open(raw_root + b"/caf\xe9.md", "wb") as fh:
        fh.write(OK_TEXT.encode())
    os.mkdir(raw_root + b"/dir\xff")
    with open(raw_root + b"/dir\xff/inner.md", "wb") as fh:
        fh.write(OK_TEXT.encode())
    for name in (b"/.hidden\xfe", b"/img\xfd.png"):  # entries not read must be nameable too
        with open(raw_root + name, "wb") as fh:
            fh.write(b"x")
    assert problems_of(read_markdown_folder, root) == [
        f"{root}/.hidden\\xfe: file name is not valid UTF-8",
        f"{root}/caf\\xe9.md: file name is not valid UTF-8",
        f"{root}/dir\\xff: file name is not valid UTF-8",
        f"{root}/img\\xfd.png: file name is not valid UTF-8",
    ]


# --- registration: atomic with validation, digest of exactly the bytes parsed ---------------------


def test_failed_validation_does_not_burn_the_revision_key(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    path.write_text(GOOD + json.dumps({"_id": "bad\nid", "text": "t"}) + "\n")
    registry = tmp_path / "reg"
    with pytest.raises(CorpusError) as info:
        register_revision(registry, "rev-1", path, "beir", "public")
    assert info.value.problems == [
        f"{path}:2 [id=bad\\x0aid]: document ID contains control character U+000A (not allowed in IDs)"
    ]
    assert not (registry / "rev-1.json").exists()
    path.write_text(GOOD + json.dumps({"_id": "bad-id", "text": "t"}) + "\n")
    record, new = register_revision(registry, "rev-1", path, "beir", "public")
    assert new and record.source_digest == bytes_digest(path.read_bytes())
    assert [r.document_id for r in read_registered_corpus(record)] == ["d1", "bad-id"]


@pytest.mark.parametrize("fmt", ["beir", "markdown"])
def test_registration_digests_exactly_the_bytes_it_parses(tmp_path: Path, monkeypatch, fmt: str):
    """The source is swapped right after it was read: the registered digest and the parse both
    see the first bytes (one read), and the swapped source is then refused as changed."""
    if fmt == "beir":
        source = tmp_path / "c.jsonl"
        source.write_text(GOOD)
        target, swapped = source, '{"_id": "d1", "text": "swapped", "metadata": {"access_scopes": ["hr"]}}\n'
    else:
        source = write_tree(tmp_path / "md", {"a.md": OK_TEXT})
        target, swapped = source / "a.md", "---\naccess_scopes: [hr]\n---\nswapped\n"
    first_digest = source_digest(source, fmt)
    real_load = registry_module.load_source
    parsed: list = []
    real_parse = registry_module.parse_source

    def load_then_swap(path, f):
        loaded = real_load(path, f)
        target.write_text(swapped)
        return loaded

    monkeypatch.setattr(registry_module, "load_source", load_then_swap)
    monkeypatch.setattr(registry_module, "parse_source", lambda s: parsed.append(real_parse(s)) or parsed[-1])
    record, _ = register_revision(tmp_path / "reg", "r1", source, fmt, "public")
    assert record.source_digest == first_digest
    assert [(r.text, r.access_scopes) for r in parsed[-1]] == [
        ("Some text that is long enough." if fmt == "beir" else OK_TEXT, None)
    ]
    monkeypatch.setattr(registry_module, "load_source", real_load)
    with pytest.raises(RevisionError, match="changed since registration"):
        read_registered_corpus(record)


@pytest.mark.parametrize("fmt", ["beir", "markdown"])
def test_snapshot_read_parses_exactly_the_bytes_whose_digest_matched(tmp_path: Path, monkeypatch, fmt: str):
    """A swap after the snapshot stage read the source cannot be parsed: the stage parses the
    buffer it digested (before the fix it read the file a second time)."""
    if fmt == "beir":
        source = tmp_path / "c.jsonl"
        source.write_text(GOOD)
        target, swapped = source, '{"_id": "d1", "text": "swapped", "metadata": {"access_scopes": ["public"]}}\n'
    else:
        source = write_tree(tmp_path / "md", {"a.md": "---\naccess_scopes: [hr]\n---\nsecret words here\n"})
        target, swapped = source / "a.md", "swapped\n"
    record, _ = register_revision(tmp_path / "reg", "r1", source, fmt, "public")
    expected = [(r.document_id, r.text, r.access_scopes) for r in read_registered_corpus(record)]
    real_load = registry_module.load_source

    def load_then_swap(path, f):
        loaded = real_load(path, f)
        target.write_text(swapped)
        return loaded

    monkeypatch.setattr(registry_module, "load_source", load_then_swap)
    assert [(r.document_id, r.text, r.access_scopes) for r in read_registered_corpus(record)] == expected


# --- revision keys --------------------------------------------------------------------------------

BAD_KEYS = ["../other", "a/b", "/abs", "..", ".hidden", "a\x00b", "abc\n", "", "-x", "a b", "é", "k" * 129]


@pytest.mark.parametrize("key", BAD_KEYS, ids=[repr(k)[:20] for k in BAD_KEYS])
def test_bad_revision_keys_are_refused_everywhere(tmp_path: Path, key: str):
    message = f"invalid revision key {key!r}: {KEY_RULE}"
    for call in (
        lambda: check_revision_key(key),
        lambda: load_revision(tmp_path / "reg", key),
        lambda: register_revision(
            tmp_path / "reg", key, write_tree(tmp_path / "md", {"a.md": OK_TEXT}), "markdown", "public"
        ),
    ):
        with pytest.raises(RevisionError) as info:
            call()
        assert str(info.value) == message
    assert not (tmp_path / "reg").exists()


def test_good_revision_keys_and_hand_made_registry_files(tmp_path: Path):
    for key in ("v1", "2024-05-01.r_1", "a..b", "K" * 128):
        assert check_revision_key(key) == key
    registry = tmp_path / "reg"
    register_revision(registry, "v1", write_tree(tmp_path / "md", {"a.md": OK_TEXT}), "markdown", "public")
    for name in ("bad key.json", ".hidden.json", "-x.json"):
        (registry / name).write_text("{}")
    assert list_revisions(registry) == ["v1"]


# --- CLI: the same refusals as a user sees them (no build runs) -----------------------------------


def ragpipe(*args: str, home: Path) -> subprocess.CompletedProcess:
    return run_cli(*args, env=homes_under(home), timeout=300)


def one_line(stderr: str) -> str:
    return stderr.replace("\n", "")


@pytest.mark.parametrize("command", ["query", "answer", "build"])
def test_cli_refuses_a_revision_key_leaving_the_home(tmp_path: Path, command: str):
    args = (
        ["build", str(write_tree(tmp_path / "md", {"a.md": OK_TEXT}))] if command == "build" else [command, "root bash"]
    )
    out = ragpipe(*args, "--revision", "../other", home=tmp_path)
    assert (out.returncode, out.stdout) == (1, "")
    assert one_line(out.stderr) == f"error: invalid revision key '../other': {KEY_RULE}"
    assert not (tmp_path / "ragpipe" / "revisions").exists()


def test_cli_build_of_a_symlink_only_folder_names_the_exclusion_and_registers_nothing(tmp_path: Path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "passwd.md").symlink_to("/etc/passwd")
    out = ragpipe("build", str(root), "--revision", "links-1", "--default-scope", "public", home=tmp_path)
    assert (out.returncode, out.stdout) == (1, "")
    assert one_line(out.stderr) == (
        f"error: invalid corpus:  {root}: no Markdown or text files found (1 excluded: passwd.md: symbolic link: not followed)"
    )
    assert not (tmp_path / "ragpipe" / "revisions" / "links-1.json").exists()


def test_cli_build_with_a_non_utf8_file_name_is_a_clear_error(tmp_path: Path):
    root = write_tree(tmp_path / "corpus", {"ok.md": OK_TEXT})
    with open(os.fsencode(root) + b"/caf\xe9.md", "wb") as fh:
        fh.write(OK_TEXT.encode())
    out = ragpipe("build", str(root), "--revision", "names-1", "--default-scope", "public", home=tmp_path)
    assert (out.returncode, out.stdout) == (1, "")
    assert one_line(out.stderr) == f"error: invalid corpus:  {root}/caf\\xe9.md: file name is not valid UTF-8"
    assert "Traceback" not in out.stderr


# --- nesting and aliases: one line, never a recursion traceback ---------------------------------


def test_a_line_nested_past_the_bound_is_one_problem(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(GOOD + '{"_id": "d2", "text": "t", "metadata": {"x": ' + deep + "}}\n")
    assert problems_of(read_beir, path) == [f"{path}:2: nesting deeper than 64 levels (column 108)"]
