"""Build-time disclosure: which chunks' text may be sent to which model endpoint.

Anything that sends chunk text off the machine while building — generated representations, a
remote embedder — asks ``may_send(scopes, endpoint)`` first. A chunk may go to an endpoint when
one of its document's access scopes is among the scopes that endpoint may receive: a document
visible to ``public`` may be read by anyone anyway, one visible to ``staff`` only by staff, so
an endpoint trusted with ``staff`` text may receive it. Which scopes an endpoint may receive:

- the endpoint's own entry in ``endpoints`` (keyed by its identity, ``endpoint_identity``), else
- every scope, when the endpoint is on this machine (a loopback host: ``localhost``,
  ``127.0.0.0/8``, ``::1`` — a local Ollama never lets text leave), else
- ``send_scopes`` (default ``[public]``).

An endpoint's identity is its normalised base URL (scheme, host, port, path without a trailing
``/``), or ``<provider>:default`` when litellm picks the provider's public endpoint — so the same
model reached through another endpoint is another identity, in cache keys and spec IDs alike.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from ragpipe.kernel.models import FrozenModel

EVERY_SCOPE = "*"
# the scope rule of ragpipe.corpus.models (a floor above this one)
_SCOPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
_DEFAULT_ENDPOINT = re.compile(r"^[a-z0-9_.-]+:default\Z")


class DisclosurePolicy(FrozenModel):
    """``send_scopes``: what any remote endpoint may receive; ``endpoints``: per endpoint identity,
    the scopes it may receive (``["*"]``: every scope), replacing ``send_scopes`` for it."""

    send_scopes: tuple[str, ...] = ("public",)
    endpoints: Mapping[str, tuple[str, ...]] = Field(default_factory=dict)

    @field_validator("send_scopes")
    @classmethod
    def _scopes(cls, scopes: tuple[str, ...]) -> tuple[str, ...]:
        bad = next((s for s in scopes if not _SCOPE.match(s)), None)
        if bad is not None:  # "*" included: every scope is said per endpoint, never for all of them
            raise ValueError(f"{bad!r} is not a scope name (every scope may go only to a listed endpoint: endpoints)")
        return scopes

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, endpoints: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        """Keys normalised as identities are (``HTTP://GPU.lan:8000/`` is ``http://gpu.lan:8000``);
        values scope names, or ``["*"]`` alone."""
        out: dict[str, tuple[str, ...]] = {}
        for key, scopes in endpoints.items():
            if "://" in key:
                identity = endpoint_identity("", key)
            elif _DEFAULT_ENDPOINT.match(key):
                identity = key
            else:
                raise ValueError(f"{key!r}: an endpoint is a base URL or '<provider>:default'")
            if scopes != (EVERY_SCOPE,) and not all(_SCOPE.match(s) for s in scopes):
                raise ValueError(f'{key!r}: scope names, or ["*"] alone for every scope')
            out[identity] = scopes
        return out

    def __hash__(self) -> int:  # endpoints is a mapping: specs holding a policy are hashed
        return hash((self.send_scopes, tuple(sorted(self.endpoints.items()))))

    def allowed(self, endpoint: str) -> frozenset[str] | None:
        """The scopes ``endpoint`` may receive; None means every scope."""
        scopes = self.endpoints.get(endpoint)
        if scopes is None:
            return None if is_local(endpoint) else frozenset(self.send_scopes)
        return None if EVERY_SCOPE in scopes else frozenset(scopes)

    def may_send(self, scopes: Iterable[str], endpoint: str) -> bool:
        allowed = self.allowed(endpoint)
        return allowed is None or any(s in allowed for s in scopes)

    def identity_part(self, endpoint: str) -> list[str]:
        """What enters a spec ID for ``endpoint``: the sorted scopes it may receive (``["*"]``)."""
        allowed = self.allowed(endpoint)
        return [EVERY_SCOPE] if allowed is None else sorted(allowed)


def endpoint_identity(model: str, api_base: str | None) -> str:
    """``api_base`` normalised (module docstring), or ``<provider>:default`` for litellm's default
    endpoint of ``model``'s provider (``openai`` for a model named without a provider)."""
    if api_base is None:
        provider = model.split("/", 1)[0] if "/" in model else "openai"
        return f"{provider}:default"
    parts = urlsplit(api_base.strip())
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    port = f":{parts.port}" if parts.port is not None else ""
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}{port}{parts.path.rstrip('/')}"


def is_local(endpoint: str) -> bool:
    """Whether an endpoint identity names a loopback host (this machine)."""
    if "://" not in endpoint:
        return False
    host = (urlsplit(endpoint).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
