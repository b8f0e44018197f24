"""The bundle manifest and bundle ID.

The bundle ID is the domain-separated hash of the manifest's *semantic* section: corpus digest,
every stage spec, the digests of the deterministic logical content (chunk set, representation
set, exact vectors) and the counts. Index files (tantivy segments, lance fragments) carry random
names and are not byte-reproducible, so they are bound by the file list and its seal instead: the
seal hashes the bundle ID together with every file's path, size and digest.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragpipe.kernel.ids import BundleId, content_id

BUNDLE_FORMAT = "ragpipe.bundle/v1"
MANIFEST_NAME = "manifest.json"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StageSpecRecord(_Model):
    spec_id: str
    spec: dict[str, Any] | None


class BundleCounts(_Model):
    documents: int = Field(ge=0)
    chunks: int = Field(ge=0)
    representations: int = Field(ge=0)
    lexical_documents: int = Field(ge=0)
    vectors: int = Field(ge=0)


class BundleSemantic(_Model):
    schema_version: Literal[1] = 1
    corpus_digest: str
    default_scope: str
    specs: dict[str, StageSpecRecord]
    chunk_set_digest: str
    representation_set_digest: str
    embeddings_digest: str | None
    has_vector_index: bool
    counts: BundleCounts


class FileEntry(_Model):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")


class BundleManifest(_Model):
    format: Literal["ragpipe.bundle/v1"] = BUNDLE_FORMAT
    bundle_id: BundleId
    semantic: BundleSemantic
    files: list[FileEntry]
    seal: str


def bundle_id_of(semantic: BundleSemantic) -> BundleId:
    return BundleId(content_id("bundle", 1, semantic.model_dump(mode="json")))


def seal_of(bundle_id: str, files: list[FileEntry]) -> str:
    return content_id("bundle-seal", 1, {"bundle_id": bundle_id, "files": [f.model_dump(mode="json") for f in files]})


def make_manifest(semantic: BundleSemantic, files: list[FileEntry]) -> BundleManifest:
    bundle_id = bundle_id_of(semantic)
    files = sorted(files, key=lambda f: f.path)
    return BundleManifest(bundle_id=bundle_id, semantic=semantic, files=files, seal=seal_of(bundle_id, files))


def manifest_bytes(manifest: BundleManifest) -> bytes:
    return (json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
