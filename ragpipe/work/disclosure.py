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
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from pydantic import Field

from ragpipe.kernel.models import FrozenModel

EVERY_SCOPE = "*"


class DisclosurePolicy(FrozenModel):
    """``send_scopes``: what any remote endpoint may receive; ``endpoints``: per endpoint identity,
    the scopes it may receive (``["*"]``: every scope), replacing ``send_scopes`` for it."""

    send_scopes: tuple[str, ...] = ("public",)
    endpoints: Mapping[str, tuple[str, ...]] = Field(default_factory=dict)

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
