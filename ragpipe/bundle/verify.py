"""Open a bundle only after verifying everything; fail closed with messages naming each problem.

Checks, in order: the path is a real directory; ``manifest.json`` parses and validates; the
bundle ID recomputes from the semantic section and matches the directory name; the seal matches
the file list; every file on disk is a regular file listed in the manifest with the listed size
and digest (symlinks, extra, missing, truncated and altered files are refused); the chunk and
representation tables match their counts and set digests; every chunk re-verifies against its
document; both indexes hold exactly one entry per representation.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ragpipe.bundle.manifest import MANIFEST_NAME, BundleManifest, bundle_id_of, manifest_bytes, seal_of
from ragpipe.chunking.chunkers import verify_chunks
from ragpipe.chunking.models import chunk_set_digest, read_chunks
from ragpipe.corpus.snapshot import read_snapshot_documents
from ragpipe.representations.derive import read_representations, representation_set_digest


class BundleVerificationError(ValueError):
    def __init__(self, path: Path, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__(f"bundle {path} failed verification:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class VerifiedBundle:
    path: Path
    manifest: BundleManifest

    @property
    def bundle_id(self) -> str:
        return self.manifest.bundle_id


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _load_manifest(root: Path, check_name: bool) -> BundleManifest:
    mpath = root / MANIFEST_NAME
    if mpath.is_symlink():
        raise BundleVerificationError(root, [f"{MANIFEST_NAME}: is a symlink"])
    if not mpath.is_file():
        raise BundleVerificationError(root, [f"{MANIFEST_NAME}: missing"])
    raw = mpath.read_bytes()
    try:
        manifest = BundleManifest.model_validate(json.loads(raw.decode("utf-8")))
    except (ValueError, ValidationError) as exc:
        raise BundleVerificationError(root, [f"{MANIFEST_NAME}: not a valid manifest: {exc}"]) from None
    problems = []
    if manifest_bytes(manifest) != raw:
        # Byte-exact: any edit, even whitespace, means someone changed the file after publication.
        problems.append(f"{MANIFEST_NAME}: bytes are not the canonical rendering of its content (manifest edited)")
    if bundle_id_of(manifest.semantic) != manifest.bundle_id:
        problems.append(f"{MANIFEST_NAME}: bundle_id does not match the manifest's semantic fields (manifest edited)")
    if seal_of(manifest.bundle_id, manifest.files) != manifest.seal:
        problems.append(f"{MANIFEST_NAME}: seal does not match the file list (manifest edited)")
    if check_name and root.name != manifest.bundle_id.hex:
        problems.append(f"directory name {root.name!r} is not the bundle ID hex {manifest.bundle_id.hex}")
    if problems:
        raise BundleVerificationError(root, problems)
    return manifest


def _check_files(root: Path, manifest: BundleManifest) -> list[str]:
    problems: list[str] = []
    listed = {f.path: f for f in manifest.files}
    on_disk: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                problems.append(f"{rel}: symlink not allowed in a bundle")
            elif stat.S_ISDIR(mode):
                continue
            elif not stat.S_ISREG(mode):
                problems.append(f"{rel}: not a regular file")
            elif rel != MANIFEST_NAME:
                on_disk.add(rel)
                entry = listed.get(rel)
                if entry is None:
                    problems.append(f"{rel}: extra file not listed in the manifest")
                elif (size := os.lstat(full).st_size) != entry.size:
                    problems.append(f"{rel}: size {size} differs from manifest size {entry.size} (truncated or extended)")
                elif file_digest(full) != entry.sha256:
                    problems.append(f"{rel}: content digest differs from the manifest")
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    for rel in sorted(set(listed) - on_disk):
        if not any(p.startswith(f"{rel}:") for p in problems):
            problems.append(f"{rel}: listed in the manifest but missing")
    return problems


def _check_content(root: Path, manifest: BundleManifest) -> list[str]:
    from ragpipe.index.lexical import lexical_doc_count  # heavy backends only after the cheap checks
    from ragpipe.index.vector import vector_row_count

    sem = manifest.semantic
    counts = sem.counts
    problems: list[str] = []
    documents = read_snapshot_documents(root / "documents.parquet")
    chunks = read_chunks(root / "chunks.parquet")
    reps = read_representations(root / "representations.parquet")
    for label, actual, expected in (
        ("documents.parquet: document count", len(documents), counts.documents),
        ("chunks.parquet: chunk count", len(chunks), counts.chunks),
        ("representations.parquet: representation count", len(reps), counts.representations),
    ):
        if actual != expected:
            problems.append(f"{label} {actual} differs from manifest count {expected}")
    if chunk_set_digest(chunks) != sem.chunk_set_digest:
        problems.append("chunks.parquet: chunk-set digest differs from the manifest")
    if representation_set_digest(reps) != sem.representation_set_digest:
        problems.append("representations.parquet: representation-set digest differs from the manifest")
    problems += [f"chunks.parquet: {p}" for p in verify_chunks(documents, chunks)[:20]]
    chunk_ids = {c.chunk_id for c in chunks}
    orphans = [r.representation_id for r in reps if r.chunk_id not in chunk_ids]
    if orphans:
        problems.append(f"representations.parquet: representation {orphans[0]} points to no chunk in the bundle")
    lex = lexical_doc_count(root / "lexical")
    if lex != counts.lexical_documents or lex != len(reps):
        problems.append(f"lexical: index holds {lex} documents, manifest says {counts.lexical_documents}")
    if sem.has_vector_index:
        vec = vector_row_count(root / "vector")
        if vec != counts.vectors or vec != len(reps):
            problems.append(f"vector: table holds {vec} rows, manifest says {counts.vectors}")
    elif (root / "vector").exists():
        problems.append("vector: present in a bundle whose manifest declares no vector index")
    return problems


def open_bundle(path: Path, check_name: bool = True) -> VerifiedBundle:
    """Verify the bundle at ``path`` completely; raise ``BundleVerificationError`` otherwise.

    ``check_name=False`` skips only the directory-name check (for a temp dir before publication).
    """
    path = Path(path)
    if path.is_symlink():
        raise BundleVerificationError(path, ["bundle path is a symlink"])
    if not path.is_dir():
        raise BundleVerificationError(path, ["not a bundle directory"])
    manifest = _load_manifest(path, check_name)
    problems = _check_files(path, manifest)
    if problems:
        raise BundleVerificationError(path, problems)
    try:
        problems = _check_content(path, manifest)
    except Exception as exc:  # a corrupt-but-digest-matching file is impossible; anything else is still a refusal
        problems = [f"content check failed: {type(exc).__name__}: {exc}"]
    if problems:
        raise BundleVerificationError(path, problems)
    return VerifiedBundle(path=path, manifest=manifest)
