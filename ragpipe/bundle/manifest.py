"""The bundle manifest and a bundle's two identities.

* The **bundle ID** is the domain-separated hash of the manifest's *semantic* section: corpus
  digest, default scope, every stage spec, the chunk-set and representation-set digests and the
  counts — all pure functions of (corpus, semantic specs), so identical inputs give the identical
  bundle ID whatever the batch size, thread count, process or embedding-cache state.
* The **material digest** binds the bytes actually written: every file's path, size and SHA-256
  (tantivy segments and lance fragments carry random names and are not byte-reproducible) and the
  digest of the exact vectors stored (float results vary in their last bits with batch size).

The seal (``ragpipe.bundle.seal``) binds the two together, unkeyed or with HMAC.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragpipe.bundle.seal import Seal, make_seal
from ragpipe.kernel.ids import BundleId, content_id
from ragpipe.kernel.seals import SealKey

BUNDLE_FORMAT = "ragpipe.bundle/v2"
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
    schema_version: Literal[2] = 2
    corpus_digest: str
    default_scope: str | None
    specs: dict[str, StageSpecRecord]
    chunk_set_digest: str
    representation_set_digest: str
    has_vector_index: bool
    counts: BundleCounts


class FileEntry(_Model):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")


class BundleMaterial(_Model):
    embeddings_digest: str | None  # digest of the vectors stored in the lance table (None: lexical-only)
    files: list[FileEntry]


class BundleManifest(_Model):
    format: Literal["ragpipe.bundle/v2"] = BUNDLE_FORMAT
    bundle_id: BundleId
    semantic: BundleSemantic
    material_digest: str
    material: BundleMaterial
    seal: Seal

    @property
    def files(self) -> list[FileEntry]:
        return self.material.files

    @property
    def payload_bytes(self) -> int:
        """Bytes of every file the manifest lists (the manifest itself aside): what serving and
        storing the bundle costs. Bound by the material digest, like the sizes it sums."""
        return sum(f.size for f in self.material.files)


def bundle_id_of(semantic: BundleSemantic) -> BundleId:
    return BundleId(content_id("bundle", 2, semantic.model_dump(mode="json")))


def material_digest_of(bundle_id: str, material: BundleMaterial) -> str:
    return content_id("bundle-material", 1, {"bundle_id": bundle_id, **material.model_dump(mode="json")})


def make_manifest(
    semantic: BundleSemantic, embeddings_digest: str | None, files: list[FileEntry], key: SealKey | None
) -> BundleManifest:
    bundle_id = bundle_id_of(semantic)
    material = BundleMaterial(embeddings_digest=embeddings_digest, files=sorted(files, key=lambda f: f.path))
    digest = material_digest_of(bundle_id, material)
    return BundleManifest(
        bundle_id=bundle_id,
        semantic=semantic,
        material_digest=digest,
        material=material,
        seal=make_seal(bundle_id, digest, key),
    )


def manifest_bytes(manifest: BundleManifest) -> bytes:
    return (json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
