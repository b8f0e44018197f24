"""A live release's full verification, made once per target generation and remembered.

Every reader of the live release (``ragpipe.release.live``) checks the pointer against the
target's history, the gate policy and approvals — all cheap — and *verifies* the release: its
bundle (every file's digest, then its payload: IDs recomputed, indexes cross-checked), its
evaluation run (ledger, inputs and every trace, metrics recomputed) and its gate decision, made
again from its runs. All but the file digests cost seconds and cannot change while the release
stays live at one generation: the run and the decision are content-addressed by the manifest, and
the payload checks are a pure function of the bundle files' bytes, which the manifest binds. So a
reader that only serves (``ragpipe query``, the Python API, the server) remembers that
verification in a record and, while the record holds, checks only what it serves: every bundle
file against its digest, the bundle's IDs against the release, and the gated plan.

**The record** (``$RAGPIPE_HOME/verified/<target>.json``, one per target, replaced atomically)::

    {"key": {"version", "target", "generation", "history_head", "release_id",
             "material_digest", "evaluation_ledger_head", "decision_id"},
     "bundle_manifest": "<SHA-256 of the bundle's manifest.json>",
     "verified_at": "<ISO 8601, UTC>", "seal": {"key_id", "mac"}}

The key binds everything the remembered checks judged: the target's generation and the hash of
the newest record of its history (another activation, rollback or any appended record changes
it), the release (its ID is the digest of its manifest), the bundle's material digest, the run's
final ledger head and the decision's ID; ``version`` is ``RECORD_VERSION``, raised whenever what
verification checks changes, so an older verification is never taken for a newer one.
``bundle_manifest`` names the bundle manifest whose payload was checked: an open skips the payload
checks only for a manifest with exactly that digest (``ragpipe.bundle.verify.trust_payload``).

**Sealed.** The record is sealed (HMAC-SHA256, ``ragpipe.kernel.seals``) with the configured key
when there is one, else with this home's own verification key (``verified/home.key``, 32 random
bytes created once with mode 0600, never copied to an object store; ``home_sealing_key``, which
seals the query-graph cache's manifests too): a record whose seal, key or bytes do not check is
refused — logged as a warning naming the file and the rule — and the full
verification runs again and writes a new one. A record is only ever written after a full
verification passed, inside the process that made it. Records are read through one descriptor
that never follows a link or blocks (``read_regular``, at most ``MAX_RECORD_BYTES``).

Operational: a record changes how much is re-checked, never what is served; removing the folder
costs one full verification per target on the next open.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.seals import home_sealing_key, sealed, unsealed
from ragpipe.kernel.strict_load import StrictLoadError, load_json
from ragpipe.kernel.workspace import Workspace

log = logging.getLogger(__name__)

RECORD_VERSION = 1
DOMAIN = "release-verified"
MAX_RECORD_BYTES = 16 * 1024


class VerifiedKey(BaseModel):
    """What one full verification of a live release judged (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = RECORD_VERSION
    target: str
    generation: int
    history_head: str
    release_id: str
    material_digest: str
    evaluation_ledger_head: str
    decision_id: str


def record_path(ws: Workspace, target: str) -> Path:
    """``verified/<target>.json`` (target names are validated by the targets config: no path parts)."""
    return ws.verified / f"{target}.json"


def remembered(ws: Workspace, key: VerifiedKey) -> str | None:
    """The bundle manifest digest of a sealed record saying the release of ``key`` was fully
    verified as ``key`` says; None (with a warning for anything but a missing or stale record)
    when there is none."""
    path = record_path(ws, key.target)
    try:
        data = read_regular(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("%s: verification record refused: %s", path, exc)
        return None
    try:
        document = load_json(data.decode("utf-8"), str(path))
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        content, problem = unsealed(document, DOMAIN, home_sealing_key(ws, create=False))
        if problem is None and home_sealing_key(ws, create=False) is None:
            problem = "no verification key exists in this home: the record cannot have been sealed here"
        if problem is not None:
            raise ValueError(problem)
        if sorted(content) != ["bundle_manifest", "key", "verified_at"]:
            raise ValueError(f"members {sorted(content)}, expected bundle_manifest, key and verified_at")
        recorded = VerifiedKey.model_validate(content["key"])
        bundle_manifest = content["bundle_manifest"]
        if not isinstance(bundle_manifest, str) or len(bundle_manifest) != 64:
            raise ValueError("bundle_manifest is not a SHA-256 hex digest")
    except (UnicodeDecodeError, StrictLoadError, ValueError, ValidationError, OSError) as exc:
        log.warning("%s: verification record refused: %s", path, str(exc).splitlines()[0])
        return None
    return bundle_manifest if recorded == key else None


def remember(ws: Workspace, key: VerifiedKey, bundle_manifest: str) -> None:
    """Record that the release of ``key``, with the bundle manifest of digest ``bundle_manifest``,
    passed full verification just now (call only then). A home that cannot be written costs the
    record only: a warning, and the next open verifies in full again."""
    content = {
        "key": key.model_dump(),
        "bundle_manifest": bundle_manifest,
        "verified_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    try:
        document = sealed(content, DOMAIN, home_sealing_key(ws, create=True))
        write_file_atomic(record_path(ws, key.target), canonical_bytes(document), sync=False)
    except OSError as exc:
        log.warning("%s: verification record not written: %s", record_path(ws, key.target), exc)
