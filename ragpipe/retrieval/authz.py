"""Authorization before disclosure.

The subject (principal and scopes) always comes from the caller — never from query text or model
output. Policy ``scope-intersection/v1``: a subject may see a document iff they share a scope.
Channels apply it inside the backends (prefilter); hydration re-checks it; and an
``AuthorizationCertificate`` binds subject, policy, bundle and the exact evidence (chunk ID +
digest), which every adapter that sends text off the machine must check before sending.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragpipe.corpus.models import SCOPE_PATTERN
from ragpipe.kernel.ids import bytes_digest, content_id

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


@dataclass(frozen=True)
class AuthorizationCertificate:
    subject: Subject
    policy_id: str
    bundle_id: str
    evidence: tuple[tuple[str, str], ...]  # (chunk_id, sha256 of the exact text), in context order

    @property
    def certificate_id(self) -> str:
        return content_id(
            "authorization-certificate",
            1,
            {
                "subject": self.subject.as_dict(),
                "policy_id": self.policy_id,
                "bundle_id": self.bundle_id,
                "evidence": [list(e) for e in self.evidence],
            },
        )

    def require_exact_cover(self, bundle_id: str, payload: list[tuple[str, str]]) -> None:
        """Refuse unless ``payload`` — (chunk_id, text) about to leave the machine — is exactly the
        certified evidence of this bundle: same chunks, same bytes, nothing more, nothing less."""
        if bundle_id != self.bundle_id:
            raise AuthorizationError(f"certificate is for bundle {self.bundle_id}, payload for {bundle_id}")
        sent = sorted((cid, bytes_digest(text.encode("utf-8"))) for cid, text in payload)
        if sent != sorted(self.evidence):
            extra = sorted(set(sent) - set(self.evidence))
            missing = sorted(set(self.evidence) - set(sent))
            raise AuthorizationError(
                f"payload is not exactly the certified evidence: {len(extra)} uncertified item(s)"
                + (f" (first: {extra[0][0]})" if extra else "")
                + f", {len(missing)} certified item(s) missing"
            )


def issue_certificate(
    subject: Subject, policy: ScopePolicy, bundle_id: str, evidence: list[tuple[str, str, tuple[str, ...]]]
) -> AuthorizationCertificate:
    """Certify ``evidence`` = [(chunk_id, text, document_scopes)], re-checking every item."""
    for chunk_id, _, scopes in evidence:
        if not policy.allows(subject, scopes):
            raise AuthorizationError(f"chunk {chunk_id} is not visible to {subject.principal}")
    return AuthorizationCertificate(
        subject=subject,
        policy_id=policy.policy_id,
        bundle_id=bundle_id,
        evidence=tuple((cid, bytes_digest(text.encode("utf-8"))) for cid, text, _ in evidence),
    )
