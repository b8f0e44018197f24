"""``serve.yaml``: who may call the server, with which subject, and the bounds of every request.

```yaml
schema: ragpipe.serve/v1
target: staging            # optional: the target whose active release is served (--target wins)
anonymous: false           # requests without a key are served as the public subject
keys:                      # made by `ragpipe serve-key`; the key itself is never stored
  - id: alice              # the key's ID, the part of the key between "rpk_" and the next "_"
    hash: sha256:<salt hex>:<digest hex>
    subject: alice
    scopes: [public, staff]
limits:                    # every field optional; defaults below
  max_body_bytes: 65536
  max_query_chars: 2000
  max_k: 100
  max_concurrent: 8        # requests computing at once; more wait up to queue_timeout_s, then 503
  queue_timeout_s: 2.0
  requests_per_minute: 600 # per key (anonymous callers: per client address); 0 = unlimited
  llm_timeout_s: 30.0
  body_timeout_s: 10.0     # a request body must arrive whole within this (408)
  header_timeout_s: 10.0   # a request head (request line + headers) must arrive whole within this
  idle_timeout_s: 5.0      # a kept-alive connection with no new request is closed after this
  max_connections: 256     # open connections; see ragpipe.server.connections for what happens beyond
  mcp_sessions: 10000      # open MCP sessions in all (503 overloaded beyond)
  mcp_sessions_per_key: 32 # open MCP sessions one key (an anonymous caller: one address) may hold (429)
  mcp_session_idle_s: 1800 # an MCP session without a request in flight for this long ends
trusted_proxies: []        # addresses/networks whose forwarded header names the client; default: none
forwarded_header: x-forwarded-for  # the one header those proxies set: x-forwarded-for or forwarded
poll_interval_s: 0.5       # how often the target's pointer is read
log_query_text: false      # access log lines carry no query text unless set (privacy)
```

Configuration is operational: nothing here enters an ID. A bad file is one line naming the file
and the field (``ServeConfigError``), like every other ragpipe configuration file.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ragpipe.corpus.models import SCOPE_PATTERN
from ragpipe.server.keys import KEY_ID, parse_key_hash
from ragpipe.spec import read_yaml_file, validation_error_text


class ServeConfigError(ValueError):
    pass


Role = Literal["reviewer"]


class KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=KEY_ID.pattern)
    hash: str
    subject: str = Field(min_length=1, max_length=200)
    scopes: tuple[str, ...] = Field(min_length=1)
    # What the key may do beyond reading (kept apart from the data scopes, which say what it may
    # read): ``reviewer`` opens the laboratory's views and sends verdicts on others' answers.
    roles: tuple[Role, ...] = ()

    @field_validator("hash")
    @classmethod
    def _hash(cls, value: str) -> str:
        parse_key_hash(value)  # ValueError with the rule
        return value

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for scope in value:
            if not SCOPE_PATTERN.match(scope):
                raise ValueError(f"invalid scope name {scope!r}")
        return value


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(65536, ge=256, le=16 * 1024 * 1024)
    max_query_chars: int = Field(2000, ge=1, le=100_000)
    max_k: int = Field(100, ge=1, le=10_000)
    max_concurrent: int = Field(8, ge=1, le=1024)
    queue_timeout_s: float = Field(2.0, ge=0, le=60)
    requests_per_minute: int = Field(600, ge=0)
    llm_timeout_s: float = Field(30.0, gt=0, le=600)
    body_timeout_s: float = Field(10.0, gt=0, le=300)
    # Deadlines of the connection itself (ragpipe.server.connections): a socket that sends nothing, a
    # head that trickles in, or a kept-alive connection left idle is closed, so silent sockets cannot
    # hold max_connections.
    header_timeout_s: float = Field(10.0, gt=0, le=300)
    idle_timeout_s: float = Field(5.0, gt=0, le=600)
    max_connections: int = Field(256, ge=1, le=65536)
    # MCP sessions: bounded in all and per key, so one key cannot take every slot.
    mcp_sessions: int = Field(10_000, ge=1, le=1_000_000)
    mcp_sessions_per_key: int = Field(32, ge=1, le=1_000_000)
    mcp_session_idle_s: float = Field(1800.0, gt=0, le=86_400)


# What a trace may keep beyond its fixed fields (trace_id, at, target, release_id); the question
# is not among them: only ``keep_query_text`` keeps it.
TraceField = Literal["subject", "key_id", "certificate_id", "context_digest", "answer", "abstained", "citations"]
TRACE_FIELDS: tuple[TraceField, ...] = get_args(TraceField)


class Tracing(BaseModel):
    """``tracing``: off by default; when on, every answer is appended to its release's trace log
    with exactly the ``keep`` fields (``ragpipe.server.tracing``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    keep: tuple[TraceField, ...] = TRACE_FIELDS
    keep_query_text: bool = False

    @field_validator("keep")
    @classmethod
    def _once(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if value.count(name) > 1:
                raise ValueError(f"{name!r} is listed twice")
        return value


def _proxy(value: str) -> str:
    """A trusted proxy: one IP address or one network in CIDR form (host bits allowed)."""
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address or network (e.g. 10.0.0.5 or 10.0.0.0/24)") from None
    return value


TrustedProxy = Annotated[str, AfterValidator(_proxy)]


class ServeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: str = Field("ragpipe.serve/v1", alias="schema", pattern=r"^ragpipe\.serve/v1$")
    target: str | None = None
    anonymous: bool = False
    keys: tuple[KeyEntry, ...] = ()
    limits: Limits = Limits()
    # Whose forwarded header is believed (ragpipe.server.proxies): none by default, so a client's own
    # X-Forwarded-For or Forwarded header never changes the address its rate limit counts against.
    trusted_proxies: tuple[TrustedProxy, ...] = ()
    forwarded_header: Literal["x-forwarded-for", "forwarded"] = "x-forwarded-for"
    poll_interval_s: float = Field(0.5, gt=0, le=60)
    log_query_text: bool = False  # access logs leave the query text out unless this is set
    tracing: Tracing = Tracing()

    @model_validator(mode="after")
    def _unique_ids(self) -> ServeConfig:
        seen: set[str] = set()
        for i, entry in enumerate(self.keys):
            if entry.id in seen:
                raise ValueError(f"keys.{i}.id: key ID {entry.id!r} is declared twice")
            seen.add(entry.id)
        return self


def load_serve_config(path: Path | None) -> ServeConfig:
    """The config at ``path``; None gives the defaults: no keys and no anonymous access, so only
    ``/healthz``, ``/readyz``, ``/metrics`` and the OpenAPI document answer without a 401."""
    if path is None:
        return ServeConfig()
    raw = read_yaml_file(path, "serve config", ServeConfigError)
    try:
        return ServeConfig.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        raise ServeConfigError(f"{path}: invalid serve config: {validation_error_text(exc)}") from None
