"""The disclosure policy: which scopes' chunk text may go to which endpoint."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ragpipe.work.disclosure import DisclosurePolicy, endpoint_identity, is_local


@pytest.mark.parametrize(
    ("model", "api_base", "identity", "local"),
    [
        ("openai/text-embedding-3-small", None, "openai:default", False),
        ("gpt-4o-mini", None, "openai:default", False),
        ("ollama/nomic-embed-text", "http://LOCALHOST:11434/", "http://localhost:11434", True),
        ("x", "http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1", True),
        ("x", "http://[::1]:8000", "http://[::1]:8000", True),
        ("x", "http://127.0.0.1.evil.example/v1", "http://127.0.0.1.evil.example/v1", False),
        ("x", "https://api.example.com/v1", "https://api.example.com/v1", False),
    ],
)
def test_endpoint_identity_and_locality(model, api_base, identity, local):
    assert endpoint_identity(model, api_base) == identity
    assert is_local(identity) is local


def test_what_may_be_sent_where():
    policy = DisclosurePolicy(endpoints={"HTTP://GPU.lan:8000/": ("staff",), "openai:default": ("*",)})
    assert policy.endpoints == {"http://gpu.lan:8000": ("staff",), "openai:default": ("*",)}
    assert policy.may_send(("staff",), "http://gpu.lan:8000") and not policy.may_send(("hr",), "http://gpu.lan:8000")
    assert policy.may_send(("hr",), "openai:default")  # every scope, as the entry says
    assert policy.may_send(("hr",), "http://127.0.0.1:9")  # this machine
    assert not policy.may_send(("hr",), "https://api.example.com") and policy.may_send(("public", "hr"), "x:default")
    assert policy.identity_part("https://api.example.com") == ["public"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"send_scopes": ["*"]}, "'*' is not a scope name"),  # "*" for every endpoint is never a default
        ({"endpoints": {"gpu": ["x"]}}, "'gpu': an endpoint is a base URL or '<provider>:default'"),
        ({"endpoints": {"openai:default": ["*", "x"]}}, 'scope names, or ["*"] alone for every scope'),
    ],
)
def test_a_policy_that_says_more_than_it_means_is_refused(data, message):
    """Found by an adversarial review: ``send_scopes: ["*"]`` meant nothing to the embedder and
    everything to generation."""
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("*", r"\*")):
        DisclosurePolicy.model_validate(data)
