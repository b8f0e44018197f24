"""Authorization before disclosure.

The subject (principal and scopes) always comes from the caller — never from query text or model
output. Policy ``scope-intersection/v1``: a subject may see a document iff they share a scope.
Channels apply it inside the backends (prefilter); hydration re-checks it; and an
``AuthorizationCertificate`` binds subject, policy, bundle, every evidence item (label, chunk ID,
title, text, scopes) and the digest of exactly the payload ``render_payload`` makes of them. Every
adapter that sends text off the machine calls ``require_payload`` and sends only what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from ragpipe.corpus.models import SCOPE_PATTERN
from ragpipe.kernel.ids import bytes_digest, content_id
from ragpipe.retrieval.context import PAYLOAD_FORMAT, Context, Evidence, payload_digest, render_payload

DEFAULT_SCOPE = "public"


class AuthorizationError(PermissionError):
    pass


@dataclass(frozen=True)
class Subject:
    principal: str
    scopes: tuple[str, ...]

    def __post_init__(self) -> None:
        bad = [s for s in self.scopes if not SCOPE_PATTERN.match(s)]
        if bad:
            raise ValueError(f"invalid scope name {bad[0]!r}")
        object.__setattr__(self, "scopes", tuple(sorted(set(self.scopes))))

    @classmethod
    def default(cls) -> Subject:
        return cls(principal="anonymous", scopes=(DEFAULT_SCOPE,))

    def as_dict(self) -> dict[str, object]:
        return {"principal": self.principal, "scopes": list(self.scopes)}


@dataclass(frozen=True)
class ScopePolicy:
    kind: str = "scope-intersection"
    version: int = 1

    @property
    def policy_id(self) -> str:
        return content_id("access-policy", 1, {"kind": self.kind, "version": self.version})

    def allows(self, subject: Subject, document_scopes: tuple[str, ...]) -> bool:
        return bool(set(subject.scopes) & set(document_scopes))


# The policies an adapter can re-evaluate from a certificate's policy ID.
KNOWN_POLICIES = {p.policy_id: p for p in (ScopePolicy(),)}


def text_digest(text: str) -> str:
    return bytes_digest(text.encode("utf-8"))


@dataclass(frozen=True)
class CertifiedItem:
    """One certified evidence item: what it is, where it sits in the payload, who may see it."""

    label: str
    chunk_id: str
    title_digest: str
    text_digest: str
    access_scopes: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "label": self.label,
            "chunk_id": self.chunk_id,
            "title_digest": self.title_digest,
            "text_digest": self.text_digest,
            "access_scopes": list(self.access_scopes),
        }


@dataclass(frozen=True)
class AuthorizationCertificate:
    subject: Subject
    policy_id: str
    bundle_id: str
    evidence: tuple[CertifiedItem, ...]  # in context order
    payload_format: str
    payload_digest: str
    release_id: str | None = None  # the release served, when the bundle was reached through one

    @property
    def certificate_id(self) -> str:
        # v3: the release ID is bound (None when a bundle is queried directly).
        return content_id(
            "authorization-certificate",
            3,
            {
                "subject": self.subject.as_dict(),
                "policy_id": self.policy_id,
                "bundle_id": self.bundle_id,
                "release_id": self.release_id,
                "evidence": [e.as_dict() for e in self.evidence],
                "payload_format": self.payload_format,
                "payload_digest": self.payload_digest,
            },
        )

    def require_payload(self, bundle_id: str, context: Context) -> str:
        """Return the exact evidence text that may leave the machine for ``context``, recomputed
        from its evidence with ``render_payload``, or raise ``AuthorizationError`` — before the
        caller has sent anything — unless: the certificate is for ``bundle_id`` and covers a
        payload; every evidence item equals the certified one field by field (label, chunk, title,
        text, scopes), nothing more, nothing less, in order; the certificate's subject may see every
        item under its policy; ``context.rendered`` is that payload; and its digest is certified."""
        if bundle_id != self.bundle_id:
            _refuse(f"the certificate is for bundle {self.bundle_id}, the adapter serves bundle {bundle_id}")
        if self.payload_format != PAYLOAD_FORMAT:
            _refuse(
                f"the certificate covers payload format {self.payload_format}, the adapter renders {PAYLOAD_FORMAT}"
            )
        policy = KNOWN_POLICIES.get(self.policy_id)
        if policy is None:
            _refuse(f"the certificate's policy {self.policy_id} is unknown, so it cannot be re-checked")
        if len(context.evidence) != len(self.evidence):
            _refuse(
                f"the context has {len(context.evidence)} evidence item(s), the certificate covers {len(self.evidence)}"
            )
        for index, (ev, item) in enumerate(zip(context.evidence, self.evidence)):
            _require_item(index, ev, item)
            if not policy.allows(self.subject, ev.access_scopes):
                _refuse(
                    f"{_where(index, ev)}: scopes {list(ev.access_scopes)} are not visible to the certificate's "
                    f"subject {self.subject.principal} {list(self.subject.scopes)}"
                )
        payload = render_payload(context.evidence)
        if context.rendered != payload:
            _refuse(
                f"the context's rendered text ({payload_digest(context.rendered)}) differs from what its certified "
                f"evidence renders to ({payload_digest(payload)})"
            )
        if payload_digest(payload) != self.payload_digest:
            _refuse(
                f"payload digest {payload_digest(payload)} differs from the certified payload digest {self.payload_digest}"
            )
        return payload


def _refuse(reason: str) -> NoReturn:
    raise AuthorizationError(f"refusing to send: {reason}")


def _where(index: int, ev: Evidence) -> str:
    return f"evidence {ev.label or f'#{index + 1}'} (chunk {ev.chunk_id})"


def _require_item(index: int, ev: Evidence, item: CertifiedItem) -> None:
    """Field by field, so the refusal names the item and the field that differs."""
    where = _where(index, ev)
    if ev.label != item.label:
        _refuse(f"{where}: label {ev.label} differs from the certified label {item.label}")
    if ev.chunk_id != item.chunk_id:
        _refuse(f"{where}: chunk differs from the certified chunk {item.chunk_id}")
    if text_digest(ev.title) != item.title_digest:
        _refuse(f"{where}: title differs from the certified title")
    if text_digest(ev.text) != item.text_digest:
        _refuse(f"{where}: text differs from the certified text")
    if tuple(ev.access_scopes) != item.access_scopes:
        _refuse(f"{where}: access_scopes {list(ev.access_scopes)} differ from the certified {list(item.access_scopes)}")


def issue_certificate(
    subject: Subject,
    policy: ScopePolicy,
    bundle_id: str,
    evidence: Sequence[Evidence],
    release_id: str | None = None,
) -> AuthorizationCertificate:
    """Certify a built context's ``evidence`` for ``subject``, re-checking every item against
    ``policy``: the certificate covers each item's label, chunk, title, text and scopes, the
    digest of ``render_payload(evidence)`` — the exact evidence text an adapter may send — and
    the bundle and (when served through one) the release the evidence came from."""
    for item in evidence:
        if not policy.allows(subject, tuple(item.access_scopes)):
            raise AuthorizationError(f"chunk {item.chunk_id} is not visible to {subject.principal}")
    return _certify_evidence(subject, policy, bundle_id, list(evidence), release_id)


def _certify_evidence(
    subject: Subject, policy: ScopePolicy, bundle_id: str, evidence: list[Evidence], release_id: str | None
) -> AuthorizationCertificate:
    labels = [e.label for e in evidence]
    if unlabeled := [e.chunk_id for e in evidence if not e.label]:
        raise ValueError(f"evidence for chunk {unlabeled[0]} has no label: certify the evidence of a built context")
    if duplicates := sorted({label for label in labels if labels.count(label) > 1}):
        raise ValueError(f"evidence label {duplicates[0]} is used more than once")
    items = tuple(
        CertifiedItem(e.label, e.chunk_id, text_digest(e.title), text_digest(e.text), tuple(e.access_scopes))
        for e in evidence
    )
    return AuthorizationCertificate(
        subject=subject,
        policy_id=policy.policy_id,
        bundle_id=bundle_id,
        evidence=items,
        payload_format=PAYLOAD_FORMAT,
        payload_digest=payload_digest(render_payload(evidence)),
        release_id=release_id,
    )
