"""serve.yaml and API keys: one-line errors naming the file and field; keys checked by their hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.server.config import ServeConfigError, load_serve_config
from ragpipe.server.keys import key_matches, new_key, split_key


def test_a_new_key_matches_only_its_own_hash():
    key, stored = new_key("alice")
    key_id, secret = split_key(key)
    assert key_id == "alice" and key.startswith("rpk_alice_") and len(secret) == 43
    assert key_matches(secret, stored)
    assert not key_matches(secret[:-1] + ("A" if secret[-1] != "A" else "B"), stored)
    _, other = new_key("alice")
    assert other != stored and not key_matches(secret, other)  # salted: one key, two hashes
    assert split_key("rpk_alice") is None and split_key("sk_alice_x") is None and split_key("rpk_Al_x") is None


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "schema: ragpipe.serve/v2\n",
            "invalid serve config: schema: String should match pattern '^ragpipe\\.serve/v1$'",
        ),
        (
            "anonymous: maybe\n",
            "invalid serve config: anonymous: Input should be a valid boolean, unable to interpret input",
        ),
        ("limits: {max_k: 0}\n", "invalid serve config: limits.max_k: Input should be greater than or equal to 1"),
        ("limitz: {}\n", "invalid serve config: limitz: Extra inputs are not permitted"),
        (
            "limits: {header_timeout_s: 0}\n",
            "invalid serve config: limits.header_timeout_s: Input should be greater than 0",
        ),
        (
            "limits: {idle_timeout_s: -1}\n",
            "invalid serve config: limits.idle_timeout_s: Input should be greater than 0",
        ),
        (
            "limits: {mcp_sessions_per_key: 0}\n",
            "invalid serve config: limits.mcp_sessions_per_key: Input should be greater than or equal to 1",
        ),
        (
            "trusted_proxies: [10.0.0.0/8, proxy.internal]\n",
            "invalid serve config: trusted_proxies.1: 'proxy.internal' is not an IP address or network "
            "(e.g. 10.0.0.5 or 10.0.0.0/24)",
        ),
        (
            "forwarded_header: x-real-ip\n",
            "invalid serve config: forwarded_header: Input should be 'x-forwarded-for' or 'forwarded'",
        ),
        (
            "keys: [{id: a, hash: nope, subject: s, scopes: [public]}]\n",
            "invalid serve config: keys.0.hash: must be sha256:<32 hex salt>:<64 hex digest> (made by ragpipe serve-key)",
        ),
        (
            f"keys: [{{id: a, hash: 'sha256:{'0' * 32}:{'0' * 64}', subject: s, scopes: ['bad scope']}}]\n",
            "invalid serve config: keys.0.scopes: invalid scope name 'bad scope'",
        ),
        (
            f"keys: [{{id: a, hash: 'sha256:{'0' * 32}:{'0' * 64}', subject: s, scopes: [public], roles: [admin]}}]\n",
            "invalid serve config: keys.0.roles.0: Input should be 'reviewer'",
        ),
        (  # the question is not a keepable field: only tracing.keep_query_text keeps it
            "tracing: {keep: [query]}\n",
            "invalid serve config: tracing.keep.0: Input should be 'subject', 'key_id', 'certificate_id', "
            "'context_digest', 'answer', 'abstained' or 'citations'",
        ),
        ("tracing: {keep: [answer, answer]}\n", "invalid serve config: tracing.keep: 'answer' is listed twice"),
        (
            "tracing: {enabled: maybe}\n",
            "invalid serve config: tracing.enabled: Input should be a valid boolean, unable to interpret input",
        ),
        ("tracing: {keep_query: true}\n", "invalid serve config: tracing.keep_query: Extra inputs are not permitted"),
        (
            "keys: [\n",
            "cannot read serve config: invalid YAML at line 2, column 1: expected the node content, but found '<stream end>' (while parsing a flow node)",
        ),
    ],
)
def test_a_bad_config_is_one_line_naming_the_field(tmp_path: Path, text: str, problem: str):
    path = write(tmp_path, text)
    with pytest.raises(ServeConfigError) as err:
        load_serve_config(path)
    assert str(err.value) == f"{path}: {problem}"


def test_a_key_id_declared_twice_is_refused(tmp_path: Path):
    entry = f"{{id: a, hash: 'sha256:{'0' * 32}:{'0' * 64}', subject: s, scopes: [public]}}"
    path = write(tmp_path, f"keys: [{entry}, {entry}]\n")
    with pytest.raises(ServeConfigError) as err:
        load_serve_config(path)
    assert str(err.value) == f"{path}: invalid serve config: (top): keys.1.id: key ID 'a' is declared twice"


def test_a_missing_file(tmp_path: Path):
    with pytest.raises(ServeConfigError) as err:
        load_serve_config(tmp_path / "nope.yaml")
    assert str(err.value) == f"{tmp_path / 'nope.yaml'}: cannot read serve config: No such file or directory"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "anonymous: false\nlimits:\n  max_k: 50\n  max_k: 5000\n",
            "4: limits.max_k: duplicate key (first at line 3)",
        ),
        (  # 100,000 levels: one line, never a RecursionError; the document and limits are levels 1-2
            "limits:\n  max_k: " + "[" * 100_000 + "]" * 100_000 + "\n",
            f"2: nesting deeper than 64 levels (column {len('  max_k: ') + 63})",
        ),
    ],
    ids=["duplicate key", "deep nesting"],
)
def test_strict_reading_refuses_duplicates_and_deep_nesting_with_file_and_line(tmp_path: Path, text: str, problem: str):
    path = write(tmp_path, text)
    with pytest.raises(ServeConfigError) as err:
        load_serve_config(path)
    assert str(err.value) == f"{path}:{problem}"


def test_a_key_carries_its_roles_to_the_caller(tmp_path: Path):
    """Roles (what a key may do) stay apart from scopes (what it may read); none by default."""
    from ragpipe.server.auth import KeyRing
    from ragpipe.server.keys import new_key

    (rev_key, rev_hash), (key, hash_) = new_key("rev"), new_key("app")
    path = write(
        tmp_path,
        f"keys:\n  - {{id: rev, hash: '{rev_hash}', subject: rita, scopes: [public], roles: [reviewer]}}\n"
        f"  - {{id: app, hash: '{hash_}', subject: app, scopes: [public, staff]}}\n",
    )
    ring = KeyRing(load_serve_config(path))
    reviewer, caller = ring.authenticate(f"Bearer {rev_key}", "c"), ring.authenticate(f"Bearer {key}", "c")
    assert (reviewer.roles, reviewer.subject.scopes) == (("reviewer",), ("public",))
    assert (caller.roles, caller.subject.scopes) == ((), ("public", "staff"))


def test_tracing_is_off_by_default_and_keeps_no_question_text(tmp_path: Path):
    """Off unless enabled; once enabled, every keepable field but never the question by default."""
    assert load_serve_config(write(tmp_path, "anonymous: false\n")).tracing.model_dump() == {
        "enabled": False,
        "keep": ("subject", "key_id", "certificate_id", "context_digest", "answer", "abstained", "citations"),
        "keep_query_text": False,
    }
    on = load_serve_config(write(tmp_path, "tracing: {enabled: true, keep: [answer]}\n")).tracing
    assert (on.enabled, on.keep, on.keep_query_text) == (True, ("answer",), False)
