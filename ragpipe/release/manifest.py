"""The release manifest: what exactly goes live, named by its content ID (docs/releases.md).

A manifest binds the corpus revision, the bundle ID *and* material digest, the query plan, answer
plan, authorization policy and gate policy IDs, the evaluation spec ID, run ID and ledger head, the
comparison ID (None for a bootstrap decision, which has no incumbent) and the gate decision (ID,
eligible, decisive phase). Its ID is ``content_id("release", 1, body)``: never a directory name or a
time, so nothing operational is in it. Fields are plain values (the producers' models live in
other packages; this one imports none of them).

Publication writes ``releases/manifests/<hex>.json`` (canonical JSON ``{"manifest": body,
"release_id": id}``, plus a ``seal`` member with a key configured, ``ragpipe.kernel.seals``)
atomically without replacing; publishing the same manifest twice is a no-op. Reading recomputes
the ID from the body and refuses a file whose ID, name or bytes disagree, or whose seal does not
hold.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.seals import SEAL, SealKey, configured_key, sealed, unsealed
from ragpipe.release.replica import fetch_file, fetch_folder_files, push_file, run_dir
from ragpipe.release.store import ReleaseError, ReleaseStore, check_release_id

if TYPE_CHECKING:
    from ragpipe.kernel.workspace import Workspace

SHA = r"^sha256:[0-9a-f]{64}$"
RELEASE_SCHEMA = "ragpipe.release/v1"
# A manifest is a few KiB of IDs; anything this large is not one (and is not read whole).
MAX_MANIFEST_BYTES = 4 * 2**20
SEAL_DOMAIN = "release-manifest/v1"  # the file's seal, with a key configured (ragpipe.kernel.seals)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class EvaluationRef(_Model):
    spec_id: str = Field(pattern=SHA)
    run_id: str = Field(min_length=1, max_length=200)
    ledger_head: str = Field(pattern=SHA)


class GateRef(_Model):
    """The gate decision a release binds, with its change kind and the incumbent release it was
    made against (``change`` None: a decision made before kinds were recorded; those two members
    are then left out of the body, so such a manifest keeps its release ID)."""

    decision_id: str = Field(pattern=SHA)
    eligible: bool
    decisive_phase: str | None = Field(default=None, min_length=1, max_length=100)
    change: Literal["bootstrap", "refresh", "experiment"] | None = None
    incumbent: str | None = Field(default=None, pattern=SHA)

    @model_validator(mode="after")
    def _incumbent_fits_change(self) -> GateRef:
        if (self.incumbent is not None) != (self.change in ("refresh", "experiment")):
            raise ValueError(
                "a refresh or experiment names its incumbent release; a bootstrap or unrecorded change none"
            )
        return self

    @model_serializer(mode="wrap")
    def _without_unrecorded_change(self, handler):
        data = handler(self)
        if isinstance(data, dict):
            for key in ("change", "incumbent"):
                if data.get(key, 0) is None:
                    del data[key]
        return data


class ReleaseManifest(_Model):
    """The body whose content ID is the release ID (see module docstring)."""

    schema_: Literal["ragpipe.release/v1"] = Field(default=RELEASE_SCHEMA, alias="schema")
    revision: str = Field(min_length=1, max_length=200)
    bundle_id: str = Field(pattern=SHA)
    material_digest: str = Field(pattern=SHA)
    query_plan_id: str = Field(pattern=SHA)
    answer_plan_id: str = Field(pattern=SHA)
    authorization_policy_id: str = Field(pattern=SHA)
    gate_policy_id: str = Field(pattern=SHA)
    evaluation: EvaluationRef
    comparison_id: str | None = Field(default=None, pattern=SHA)
    gate: GateRef

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    def body(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)

    @property
    def release_id(self) -> str:
        return release_id_of(self)

    @property
    def bundle_hex(self) -> str:
        return self.bundle_id.split(":", 1)[1]


def release_id_of(manifest: ReleaseManifest) -> str:
    return content_id("release", 1, manifest.body())


def manifest_file_bytes(manifest: ReleaseManifest, key: SealKey | None) -> bytes:
    """The file: canonical JSON ``{manifest, release_id}``, sealed with ``key`` when one is given."""
    content = {"manifest": manifest.body(), "release_id": release_id_of(manifest)}
    return canonical_bytes(sealed(content, SEAL_DOMAIN, key)) + b"\n"


def publish_manifest(store: ReleaseStore, manifest: ReleaseManifest) -> tuple[str, bool]:
    """Publish ``manifest`` atomically; ``(release_id, published)`` — False when it was already there
    (after checking that the existing file holds exactly this manifest)."""
    release_id = release_id_of(manifest)
    path = store.manifest_path(release_id)
    published = write_file_atomic(path, manifest_file_bytes(manifest, configured_key()), replace=False)
    if not published:
        load_manifest(store, release_id)  # the name is the content ID: what is there must verify
    push_file(store.ws, path)
    return release_id, published


def parse_manifest_file(path: Path, data: bytes) -> tuple[str, ReleaseManifest]:
    """``(release_id, manifest)`` of a manifest file's bytes; refuses anything that does not verify."""
    try:
        obj = json.loads(data.decode("utf-8"))
        if not isinstance(obj, dict) or sorted(k for k in obj if k != SEAL) != ["manifest", "release_id"]:
            raise ValueError("expected exactly the keys manifest, release_id")
        manifest = ReleaseManifest.model_validate(obj["manifest"])
    except RecursionError:
        raise ReleaseError(f"{path}: not a valid release manifest: nested too deeply") from None
    except (UnicodeDecodeError, ValueError, ValidationError) as exc:
        raise ReleaseError(f"{path}: not a valid release manifest: {exc}") from None
    key = configured_key()
    _, problem = unsealed(obj, SEAL_DOMAIN, key)
    if problem is not None:
        raise ReleaseError(f"{path}: {problem}")
    release_id = release_id_of(manifest)
    if obj["release_id"] != release_id:
        raise ReleaseError(
            f"{path}: release_id {obj['release_id']} does not match the manifest's content ID {release_id} (manifest edited)"
        )
    if path.stem != release_id.split(":", 1)[1]:
        raise ReleaseError(f"{path}: file name is not the release ID hex {release_id.split(':', 1)[1]}")
    if data != manifest_file_bytes(manifest, key):
        raise ReleaseError(f"{path}: bytes are not the canonical rendering of its content (manifest edited)")
    return release_id, manifest


def load_manifest(store: ReleaseStore, release_id: str) -> ReleaseManifest:
    """The published manifest of exactly ``release_id``, verified; a missing one is a clear error."""
    path = store.manifest_path(check_release_id(release_id))
    fetch_file(store.ws, path)
    try:
        data = read_regular(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise ReleaseError(f"release {release_id} not found in {store.manifests}") from None
    except OSError as exc:
        raise ReleaseError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_manifest_file(path, data)[1]


@dataclass(frozen=True)
class ManifestListing:
    """The manifest folder read: ``valid`` as ``(release_id, manifest)``, oldest publication first
    (ties by ID; order is operational, from file times), and ``invalid`` as ``(path, reason)`` for
    every other ``*.json`` entry there — a damaged manifest, a stray file, a link (never followed),
    a FIFO or device (never waited on) is reported, never a reason to stop reading the others."""

    valid: list[tuple[str, ReleaseManifest]]
    invalid: list[tuple[Path, str]]
    published: dict[str, int] = field(default_factory=dict)  # release ID or file name -> mtime (ns)


def list_manifests(store: ReleaseStore) -> ManifestListing:
    """Every published manifest, each verified on its own (``ManifestListing``)."""
    fetch_folder_files(store.ws, store.manifests)
    if not store.manifests.is_dir():
        return ManifestListing([], [])
    found, invalid, published = [], [], {}
    for path in sorted(p for p in store.manifests.iterdir() if p.suffix == ".json" and not p.name.startswith(".")):
        # read through one descriptor: a link is not followed, a FIFO or device not waited on
        try:
            mtime = path.lstat().st_mtime_ns
            found.append((mtime, *parse_manifest_file(path, read_regular(path, MAX_MANIFEST_BYTES))))
            published[found[-1][1]] = mtime
        except ReleaseError as exc:
            invalid.append((path, str(exc)))
            published[path.name] = mtime
        except OSError as exc:
            invalid.append((path, f"{path}: cannot read: {exc.strerror or exc}"))
    return ManifestListing([(rid, m) for _, rid, m in sorted(found, key=lambda t: (t[0], t[1]))], invalid, published)


_MANIFEST_NAME = re.compile(r"^[0-9a-f]{64}\.json\Z")
MIN_PREFIX_HEX = 12  # 48 bits: unique among any store's releases, short enough to type
_HEX_ID = re.compile(r"^(?:sha256:)?([0-9a-fA-F]+)\Z")


def resolve_release_id(store: ReleaseStore, text: str) -> str:
    """The full release ID ``text`` names: the ID itself, or a unique prefix of at least
    ``MIN_PREFIX_HEX`` hex digits with or without ``sha256:`` (case-insensitive), matched against
    the manifests published here (and on the object store, if one is configured). ``ReleaseError``
    in one line when it is malformed, too short, matches nothing, or matches several (listed)."""
    match = _HEX_ID.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ReleaseError(
            f"release ID {text!r} is not sha256:<64 hex digits> or a prefix of at least {MIN_PREFIX_HEX} of them"
        )
    digits = match.group(1).lower()
    if len(digits) > 64:
        raise ReleaseError(f"release ID {text!r} has more than 64 hex digits")
    if len(digits) == 64:
        return f"sha256:{digits}"
    if len(digits) < MIN_PREFIX_HEX:
        raise ReleaseError(
            f"release ID prefix {text!r} is too short: give at least {MIN_PREFIX_HEX} hex digits (ragpipe release list)"
        )
    fetch_folder_files(store.ws, store.manifests)
    names = (
        sorted(p.stem for p in store.manifests.iterdir() if _MANIFEST_NAME.match(p.name))
        if store.manifests.is_dir()
        else []
    )
    found = [f"sha256:{n}" for n in names if n.startswith(digits)]
    if not found:
        raise ReleaseError(f"no release ID starts with {digits} in {store.manifests} (ragpipe release list)")
    if len(found) > 1:
        raise ReleaseError(f"release ID prefix {digits} is ambiguous: {', '.join(found)} (give more digits)")
    return found[0]


def evaluation_run_dir(ws: Workspace, manifest: ReleaseManifest) -> Path:
    """The folder of the run ``manifest`` binds (``run_dir``)."""
    try:
        return run_dir(ws, manifest.evaluation.run_id)
    except ReleaseError as exc:
        raise ReleaseError(f"release {manifest.release_id}: {exc}") from None
