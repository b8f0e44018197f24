"""Assemble and atomically publish a bundle from a revision's stage outputs."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ragpipe.bundle.manifest import (
    MANIFEST_NAME,
    BundleCounts,
    BundleSemantic,
    FileEntry,
    StageSpecRecord,
    bundle_id_of,
    make_manifest,
    manifest_bytes,
)
from ragpipe.bundle.payload_checks import stored_vectors
from ragpipe.bundle.tables import release_free_memory
from ragpipe.bundle.verify import BundleVerificationError, VerifiedBundle, file_digest, open_bundle
from ragpipe.embedding.compute import embeddings_digest
from ragpipe.index.vector_file import VECTORS_FILE, write_vectors_file
from ragpipe.kernel.publish import PUBLISH_STEPS, PublishOutcome, StepHook, publish_directory
from ragpipe.kernel.seals import SealKey, configured_key
from ragpipe.representations.generations import GENERATIONS_FILE
from ragpipe.spec import SEMANTIC, PipelineSpec

# Every point where a crash leaves a distinct state on disk, in order (failure-injection tests).
BUNDLE_PUBLISH_STEPS = ("temp_created", "tables_copied", "lexical_copied", "vector_copied") + PUBLISH_STEPS[1:]

BUNDLE_STAGES = ("source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index")


@dataclass(frozen=True)
class BundleInputs:
    """Paths of one revision's stage outputs. ``vector_dir`` None makes a lexical-only bundle."""

    documents_parquet: Path
    chunks_parquet: Path
    representations_parquet: Path
    lexical_dir: Path
    vector_dir: Path | None
    generations_parquet: Path | None = None  # the evidence of generated kinds, when there are any


def bundle_semantic(
    spec: PipelineSpec,
    corpus_digest: str,
    default_scope: str | None,
    chunk_set_digest: str,
    representation_set_digest: str,
    embeddings_digest: str | None,
    counts: BundleCounts,
) -> BundleSemantic:
    """The semantic section. ``embeddings_digest`` only says whether there is a vector index (None:
    lexical-only); the vectors' digest is material, recomputed from the lance table at publication."""
    stages = (
        BUNDLE_STAGES
        if embeddings_digest is not None
        else tuple(s for s in BUNDLE_STAGES if s not in ("embeddings", "vector_index"))
    )
    specs = {}
    for stage in stages:
        own = spec.stage_spec(stage)
        specs[stage] = StageSpecRecord(
            spec_id=spec.own_spec_ids[stage],
            spec=own.model_dump(mode="json", context=SEMANTIC) if own is not None else None,
        )
    return BundleSemantic(
        corpus_digest=corpus_digest,
        default_scope=default_scope,
        specs=specs,
        chunk_set_digest=chunk_set_digest,
        representation_set_digest=representation_set_digest,
        has_vector_index=embeddings_digest is not None,
        counts=counts,
    )


def _copy_payload(inputs: BundleInputs, target: Path, step: StepHook) -> str | None:
    """Copy the stage outputs into ``target``; returns the embeddings digest of the vectors as the
    lance table stores them (None: no vector index), computed from the same read that writes
    ``vectors.arrow``."""
    shutil.copyfile(inputs.documents_parquet, target / "documents.parquet")
    shutil.copyfile(inputs.chunks_parquet, target / "chunks.parquet")
    shutil.copyfile(inputs.representations_parquet, target / "representations.parquet")
    if inputs.generations_parquet is not None:
        shutil.copyfile(inputs.generations_parquet, target / GENERATIONS_FILE)
    step("tables_copied")
    shutil.copytree(inputs.lexical_dir, target / "lexical", symlinks=False)
    step("lexical_copied")
    if inputs.vector_dir is not None:
        shutil.copytree(inputs.vector_dir, target / "vector", symlinks=False)
        # the same vectors, readable without lancedb (ragpipe.index.vector_file)
        ids, matrix = stored_vectors(target / "vector")
        write_vectors_file(target / VECTORS_FILE, ids, matrix)
        digest = embeddings_digest(ids, matrix)
        del ids, matrix
        release_free_memory()  # lance's read of every vector, before the bundle is verified
        step("vector_copied")
        return digest
    return None


def _file_entries(root: Path) -> list[FileEntry]:
    entries = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if rel != MANIFEST_NAME:
                entries.append(FileEntry(path=rel, size=full.stat().st_size, sha256=file_digest(full)))
    return entries


def publish_bundle(
    semantic: BundleSemantic,
    inputs: BundleInputs,
    bundles_root: Path,
    on_step: StepHook | None = None,
    key: SealKey | None | Literal["configured"] = "configured",
) -> tuple[VerifiedBundle, PublishOutcome]:
    """Publish the bundle for ``semantic`` under ``bundles_root/<id hex>`` unless it exists.

    The material section is computed from what was copied: every file's size and digest, and the
    digest of the vectors as stored in the lance table (from the one read that also writes
    ``vectors.arrow``). The seal uses ``key`` (default: the
    configured bundle key, if any). The new bundle is verified completely in its temp directory
    before the rename. An existing directory for the same ID is verified and reused untouched
    (its material may differ in the last bits of floats: same semantic identity); if it fails
    verification the build fails (it is never replaced silently).
    """
    key = configured_key() if key == "configured" else key
    final = bundles_root / bundle_id_of(semantic).hex

    stored: list[str | None] = []  # the lance table's embeddings digest, read while copying

    def copy(tmp: Path) -> None:
        stored.append(_copy_payload(inputs, tmp, on_step or (lambda _: None)))

    def write_manifest(tmp: Path) -> None:
        vectors = stored[-1] if semantic.has_vector_index else None
        manifest = make_manifest(semantic, vectors, _file_entries(tmp), key)
        (tmp / MANIFEST_NAME).write_bytes(manifest_bytes(manifest))

    verified: list[VerifiedBundle] = []
    outcome = publish_directory(
        final,
        copy,
        write_manifest,
        on_step,
        # never publish what would not open; the renamed directory holds exactly these files
        validate=lambda tmp: verified.append(open_bundle(tmp, check_name=False, key=key)),
    )
    if outcome is PublishOutcome.published:
        return VerifiedBundle(path=final, manifest=verified[0].manifest, tables=verified[0].tables), outcome
    try:
        return open_bundle(final, key=key), outcome
    except BundleVerificationError as exc:
        if outcome is PublishOutcome.existing:
            raise BundleVerificationError(
                final, exc.problems + ["an existing bundle with this ID is corrupt: move it away and rebuild"]
            ) from None
        raise
