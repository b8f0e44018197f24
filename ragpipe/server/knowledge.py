"""``knowledge_search``: the evidence tool an LLM application calls, and its per-session label ledger.

A call retrieves ``limit`` chunks for the caller's subject from the release being served and
returns them as evidence items labelled ``E1…En``. Labels come from a **label ledger** scoped
to the caller's session: the MCP session (``Mcp-Session-Id``), else a run ID the caller passes,
else the call alone. Within a ledger a chunk keeps the label it got first (items are deduplicated
by chunk), so a model can cite ``[E3]`` across several calls; ledgers are keyed by the caller's
credential and scopes too, so no label, and no chunk behind one, ever crosses from one caller or
session to another.

Bounds: at most ``MAX_LIMIT`` items a call, ``MAX_CHARS`` characters of evidence text and metadata a response
(items past the budget are left out, ``truncated`` says so), ``MAX_LEDGER_ITEMS`` labels a ledger
and ``MAX_LEDGERS`` ledgers kept, ``MAX_LEDGERS_PER_CALLER`` of them per caller (least recently
used dropped).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from ragpipe.retrieval.authz import Subject
from ragpipe.server.auth import Caller
from ragpipe.server.follower import InService

MAX_LIMIT = 20
MAX_CHARS = 20_000
MAX_LEDGER_ITEMS = 500
MAX_LEDGERS = 10_000
MAX_LEDGERS_PER_CALLER = 64
TOOL_NAME = "knowledge_search"
TOOL_DESCRIPTION = (
    "Search the knowledge base (the active, verified release). Returns evidence items labelled E1..En; "
    "a label is stable for the whole session, so cite evidence as [E1], [E2]. Only items the caller may see "
    "are returned."
)
PARAMETERS = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "What to search for, in natural language."},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 5},
        "source_roles": {
            "type": ["array", "null"],
            "items": {"type": "string"},
            "description": "Only evidence from documents with one of these source roles.",
        },
        "filter": {
            "type": ["object", "null"],
            "description": (
                "Only evidence from documents whose metadata matches, e.g. "
                '{"and": [{"field": "category", "eq": "faq"}, {"field": "year", "gte": 2020}]}.'
            ),
        },
        "run_id": {
            "type": ["string", "null"],
            "description": "Scope the evidence labels to this run when the transport has no session.",
        },
    },
    "required": ["query"],
    "additionalProperties": False,
}


class ToolError(ValueError):
    """A call the tool refuses; the message names the argument and the rule."""


@dataclass
class EvidenceLedger:
    scope: str
    labels: dict[str, str] = field(default_factory=dict)  # chunk ID -> label

    def label(self, chunk_id: str) -> str:
        found = self.labels.get(chunk_id)
        if found is None:
            if len(self.labels) >= MAX_LEDGER_ITEMS:
                raise ToolError(
                    f"the label ledger of {self.scope} is full ({MAX_LEDGER_ITEMS} items): start a new session"
                )
            found = self.labels[chunk_id] = f"E{len(self.labels) + 1}"
        return found


class LabelLedgers:
    """Ledgers by (caller, scope); least recently used dropped past ``MAX_LEDGERS`` in all and past
    ``MAX_LEDGERS_PER_CALLER`` for one caller, so one key cannot push out everyone else's; thread-safe."""

    def __init__(self, max_ledgers: int = MAX_LEDGERS, per_caller: int = MAX_LEDGERS_PER_CALLER):
        self.max_ledgers = max_ledgers
        self.per_caller = per_caller
        self._ledgers: OrderedDict[tuple[str, tuple[str, ...], str], EvidenceLedger] = OrderedDict()
        self._lock = threading.Lock()

    def ledger(self, caller: Caller, session_id: str | None, run_id: str | None) -> EvidenceLedger:
        """The ledger of a call: its MCP session, else its run, else the call alone. The key is the
        caller's credential (its key ID, or an anonymous caller's address) and scopes, never only a
        name: two keys of one principal, or two anonymous callers, never share labels."""
        if session_id:
            scope = f"session:{session_id}"
        elif run_id:
            scope = f"run:{run_id}"
        else:
            return EvidenceLedger("call")
        key = (caller.rate_key, caller.subject.scopes, scope)
        with self._lock:
            found = self._ledgers.get(key)
            if found is not None:
                self._ledgers.move_to_end(key)
                return found
            found = self._ledgers[key] = EvidenceLedger(scope)
            own = [k for k in self._ledgers if k[0] == caller.rate_key]
            for old in own[: max(0, len(own) - self.per_caller)]:
                del self._ledgers[old]
            while len(self._ledgers) > self.max_ledgers:
                self._ledgers.popitem(last=False)
            return found


def check_arguments(
    query: object, limit: object, source_roles: object, run_id: object, max_chars: int, filter: object = None
) -> None:
    if not isinstance(query, str) or not query.strip():
        raise ToolError("query: must be a non-empty string")
    if len(query) > max_chars:
        raise ToolError(f"query: {len(query)} characters, at most {max_chars} allowed")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ToolError(f"limit: must be an integer from 1 to {MAX_LIMIT}")
    if source_roles is not None and (
        not isinstance(source_roles, list) or not source_roles or not all(isinstance(r, str) for r in source_roles)
    ):
        raise ToolError("source_roles: must be a non-empty list of strings, or null")
    if filter is not None and not isinstance(filter, dict):
        raise ToolError("filter: must be a JSON object, or null")
    if run_id is not None and (not isinstance(run_id, str) or not 1 <= len(run_id) <= 200):
        raise ToolError("run_id: must be a string of 1 to 200 characters, or null")


def search(
    in_service: InService,
    ledger: EvidenceLedger,
    subject: Subject,
    query: str,
    limit: int,
    source_roles: list[str] | None,
    filter: dict[str, object] | None = None,
) -> dict[str, object]:
    """One ``knowledge_search`` call on ``in_service`` (captured once by the caller)."""
    result = in_service.retriever.query(
        query, subject, k=limit, source_roles=tuple(source_roles) if source_roles else None, filter=filter
    )
    items, used, truncated = [], 0, False
    for hit, evidence in zip(result.hits, result.evidence):
        # metadata counts against the budget like text: a document's metadata can be large too
        size = len(evidence.text) + len(json.dumps(hit["metadata"], ensure_ascii=False))
        if used + size > MAX_CHARS:
            truncated = True
            break
        used += size
        items.append(
            {
                "label": ledger.label(evidence.chunk_id),
                "chunk_id": evidence.chunk_id,
                "document_id": evidence.document_id,
                "title": evidence.title,
                "byte_start": evidence.byte_start,
                "byte_end": evidence.byte_end,
                "score": hit["score"],
                "text": evidence.text,
                "metadata": hit["metadata"],
                "pages": hit["pages"],
            }
        )
    return {
        "items": items,
        "truncated": truncated,
        "release_id": in_service.release_id,
        "bundle_id": in_service.served.bundle.bundle_id,
        "ledger_scope": ledger.scope,
        **({"approximate": True} if result.approximate else {}),
    }


def openai_tools() -> list[dict[str, object]]:
    """``/v1/tools``: the tool as an OpenAI-style function schema."""
    return [
        {
            "type": "function",
            "function": {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "parameters": PARAMETERS},
        }
    ]
