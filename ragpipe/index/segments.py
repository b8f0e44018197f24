"""Scope-grouped tantivy indexes on disk, and views of some of their groups (no tantivy import).

A lexical index folder written by ``build_lexical_index`` holds:

* ``<segment>.{fast,fieldnorm,idx,pos,store,term}``: tantivy segment files. Every document of a
  segment shares one access-scope set (its *scope group*); a group has one segment (more only
  when it outgrows the writer heap);
* ``meta.json``: tantivy's index meta listing every segment, groups in scope order;
* ``scope_groups.json``: canonical JSON ``{"format", "groups": [{"rows", "scopes",
  "segment_ids"}]}``, groups sorted by scopes: which segments hold which group;
* ``.tantivy-meta.lock``: empty. tantivy creates this lock file whenever it opens a reader; shipping
  it keeps opening a published bundle from adding a file its manifest does not list.

Segment IDs are content addresses (a digest of the group's scopes and the segment's file digests),
and tantivy's segment files depend only on their documents, so identical inputs give a
byte-identical folder.

BM25 in tantivy sums its statistics (document count, token count, document frequencies) over
the segments an index lists. A *view* — a private folder linking the segment files of some groups
and a ``meta.json`` listing only those — is therefore an index whose statistics are those of an
index built from exactly those groups' rows. Opening it costs milliseconds and no copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import domain_digest
from ragpipe.kernel.publish import pid_alive

META_NAME = "meta.json"
SIDECAR_NAME = "scope_groups.json"
META_LOCK_NAME = ".tantivy-meta.lock"
FORMAT = "ragpipe/lexical-scope-groups/v1"
VIEW_PREFIX = "ragpipe-audience-"
_SEGMENT_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

Scopes = tuple[str, ...]


class ScopeGroupError(ValueError):
    """A lexical folder's scope-group layout is unreadable; the message names the file."""


@dataclass(frozen=True)
class ScopeGroup:
    scopes: Scopes
    segment_ids: tuple[str, ...]
    rows: int


class _GroupRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    rows: int = Field(ge=1)
    scopes: tuple[str, ...]
    segment_ids: tuple[str, ...] = Field(min_length=1)


class _Sidecar(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    format: Literal["ragpipe/lexical-scope-groups/v1"]
    groups: tuple[_GroupRecord, ...]


def scope_set(scopes: Sequence[str]) -> Scopes:
    """The group key of a document: its access scopes, sorted and distinct."""
    return tuple(sorted(set(scopes)))


def file_stem(segment_id: str) -> str:
    """tantivy names a segment's files by its UUID without hyphens."""
    return segment_id.replace("-", "")


def segment_files(folder: Path, segment_id: str) -> list[Path]:
    stem = file_stem(segment_id) + "."
    return sorted(p for p in folder.iterdir() if p.name.startswith(stem))


def read_meta(folder: Path) -> dict:
    return json.loads((folder / META_NAME).read_text(encoding="utf-8"))


def _write_meta(folder: Path, meta: dict) -> None:
    (folder / META_NAME).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def _content_segment_id(scopes: Scopes, files: list[Path]) -> str:
    digests = []
    for f in files:
        with f.open("rb") as fh:
            digests.append([f.suffix, hashlib.file_digest(fh, "sha256").hexdigest()])
    hexdigest = domain_digest("lexical-segment", 1, canonical_bytes({"files": digests, "scopes": list(scopes)}))[7:]
    return f"{hexdigest[:8]}-{hexdigest[8:12]}-{hexdigest[12:16]}-{hexdigest[16:20]}-{hexdigest[20:32]}"


def compose_groups(directory: Path, parts: Sequence[tuple[Scopes, Path]], empty_meta: Path | None) -> list[ScopeGroup]:
    """Move the segments of each part (a one-group tantivy index folder, parts in scope order) into
    ``directory`` under content-addressed IDs, then write the combined ``meta.json``, the sidecar
    and the empty meta lock; removes the part folders. ``empty_meta``: folder of an empty index
    whose meta supplies schema and settings when there is no part (an empty corpus)."""
    base = read_meta(parts[0][1] if parts else empty_meta)
    segments, groups = [], []
    for scopes, part in parts:
        ids = []
        for entry in read_meta(part)["segments"]:
            files = segment_files(part, entry["segment_id"])
            new_id = _content_segment_id(scopes, files)
            for f in files:
                f.rename(directory / (file_stem(new_id) + f.suffix))
            segments.append({**entry, "segment_id": new_id})
            ids.append((new_id, entry["max_doc"]))
        ids.sort()  # tantivy's segment order within a commit is not ours to rely on
        groups.append(ScopeGroup(scopes, tuple(i for i, _ in ids), sum(n for _, n in ids)))
    order = {sid: n for n, sid in enumerate(s for g in groups for s in g.segment_ids)}
    _write_meta(directory, {**base, "segments": sorted(segments, key=lambda s: order[s["segment_id"]])})
    (directory / SIDECAR_NAME).write_bytes(encode_scope_groups(groups))
    (directory / META_LOCK_NAME).write_bytes(b"")
    for _, part in parts:
        shutil.rmtree(part)
    if empty_meta is not None:
        shutil.rmtree(empty_meta)
    return groups


def encode_scope_groups(groups: Sequence[ScopeGroup]) -> bytes:
    records = [{"rows": g.rows, "scopes": list(g.scopes), "segment_ids": list(g.segment_ids)} for g in groups]
    return canonical_bytes({"format": FORMAT, "groups": sorted(records, key=lambda r: r["scopes"])})


def read_scope_groups(directory: Path) -> list[ScopeGroup]:
    """The sidecar of ``directory``, checked for shape, canonical form and order; raises
    ``ScopeGroupError`` naming the file and the rule otherwise."""
    where = f"{directory.name}/{SIDECAR_NAME}"
    path = directory / SIDECAR_NAME
    if not path.is_file():
        raise ScopeGroupError(f"{where}: missing (a lexical index without scope groups; rebuild the bundle)")
    data = path.read_bytes()
    try:
        parsed = _Sidecar.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ScopeGroupError(f"{where}: {'.'.join(map(str, first['loc'])) or 'document'}: {first['msg']}") from None
    groups = [ScopeGroup(g.scopes, g.segment_ids, g.rows) for g in parsed.groups]
    for g in groups:
        if g.scopes != scope_set(g.scopes) or not g.scopes:
            raise ScopeGroupError(
                f"{where}: group {show_scopes(g.scopes)}: scopes must be non-empty, sorted and distinct"
            )
        bad = [s for s in g.segment_ids if not _SEGMENT_ID.match(s)]
        if bad:
            raise ScopeGroupError(f"{where}: group {show_scopes(g.scopes)}: {bad[0]!r} is not a segment ID")
    keys = [g.scopes for g in groups]
    if keys != sorted(set(keys)):
        raise ScopeGroupError(f"{where}: groups must be sorted by scopes, each scope set once")
    if data != encode_scope_groups(groups):
        raise ScopeGroupError(f"{where}: not in canonical form (RFC 8785)")
    return groups


def show_scopes(scopes: Sequence[str]) -> str:
    """A scope set in messages: its JSON list."""
    return json.dumps(list(scopes), ensure_ascii=False)


def layout_problems(directory: Path, groups: Sequence[ScopeGroup], meta: dict) -> list[str]:
    """File-level rules between the sidecar and ``meta.json``: every segment of ``meta.json`` in
    exactly one group once, every group's segments in ``meta.json``, row counts equal, no
    deletions. The stored documents are checked by ``lexical.verify_scope_groups``."""
    side, meta_name = f"{directory.name}/{SIDECAR_NAME}", f"{directory.name}/{META_NAME}"
    max_doc = {s["segment_id"]: s.get("max_doc") for s in meta["segments"]}
    problems = []
    if len(max_doc) != len(meta["segments"]):
        problems.append(f"{meta_name}: a segment is listed more than once")
    owner: dict[str, Scopes] = {}
    for g in groups:
        for sid in g.segment_ids:
            if sid in owner:
                problems.append(
                    f"{side}: segment {sid} is listed in groups {show_scopes(owner[sid])} and {show_scopes(g.scopes)}"
                )
            owner[sid] = g.scopes
            if sid not in max_doc:
                problems.append(f"{side}: segment {sid} of group {show_scopes(g.scopes)} is not in {META_NAME}")
        held = sum(max_doc.get(sid) or 0 for sid in g.segment_ids)
        if held != g.rows:
            problems.append(f"{side}: group {show_scopes(g.scopes)} declares {g.rows} rows, its segments hold {held}")
    for entry in meta["segments"]:
        if entry["segment_id"] not in owner:
            problems.append(f"{meta_name}: segment {entry['segment_id']} belongs to no scope group")
        if entry.get("deletes") is not None:
            problems.append(f"{meta_name}: segment {entry['segment_id']} has deletions")
    return problems


class SegmentView:
    """A private folder under the system temp dir presenting some segments of a scope-grouped
    index as an index of their own: hard links to their files (symlinks across file systems) and
    a ``meta.json`` listing only them. Removed by ``close()``, when garbage-collected, and at
    interpreter exit; a crashed process's views are removed by the next ``SegmentView``."""

    _swept = False

    def __init__(self, directory: Path, meta: dict, segment_ids: Sequence[str]):
        self._sweep_once()
        wanted = set(segment_ids)
        self.path = Path(tempfile.mkdtemp(prefix=f"{VIEW_PREFIX}{os.getpid()}-"))
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, True)
        try:
            link = os.link
            for sid in segment_ids:
                for f in segment_files(directory, sid):
                    try:
                        link(f, self.path / f.name)
                    except OSError:  # another file system (or no hard links): link by path
                        link = _symlink
                        link(f, self.path / f.name)
            _write_meta(self.path, {**meta, "segments": [s for s in meta["segments"] if s["segment_id"] in wanted]})
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @classmethod
    def _sweep_once(cls) -> None:
        if cls._swept:
            return
        cls._swept = True
        for entry in Path(tempfile.gettempdir()).glob(f"{VIEW_PREFIX}*-*"):
            pid = entry.name[len(VIEW_PREFIX) :].split("-", 1)[0]
            if (
                pid.isdigit()
                and int(pid) != os.getpid()
                and not pid_alive(int(pid))
                and entry.is_dir()
                and not entry.is_symlink()
            ):
                shutil.rmtree(entry, ignore_errors=True)


def _symlink(source: Path, target: Path) -> None:
    os.symlink(source.resolve(), target)
