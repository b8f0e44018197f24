"""Golden vectors for every persisted schema's identity. A failure here means stored artifacts
(chunk IDs, bundle IDs, cache keys, code versions) would change: bump the schema or
implementation version deliberately instead of editing these values casually."""

from __future__ import annotations

import hashlib
import json

from ragpipe.bundle.manifest import BundleCounts, BundleSemantic, StageSpecRecord, bundle_id_of
from ragpipe.chunking.chunkers import make_chunker
from ragpipe.chunking.models import chunk_set_digest
from ragpipe.corpus.models import Document, corpus_digest
from ragpipe.kernel.ids import ContentDigest, DocumentId, bytes_digest
from ragpipe.pipeline_spec import load_pipeline_spec
from ragpipe.representations.derive import derive_representations

SPEC = load_pipeline_spec()
TEXT = "# Title\n\nBody text é.\n"
DOC = Document(
    document_id=DocumentId("doc/1.md"),
    title="Title",
    text=TEXT,
    content_digest=ContentDigest(bytes_digest(TEXT.encode())),
    access_scopes=("public",),
    source_role="primary",
)


def test_default_pipeline_spec_ids():
    assert SPEC.own_spec_ids == {
        "source_snapshot": "sha256:5d917061aefdcb3d9a40eb191bd3655eb9720324506f6cbea6f9cee862e53c13",
        "chunks": "sha256:8f66deca7764c2507272f0d9d675a2ddb814232f805a7b4ea1d64a411456a777",
        "representations": "sha256:3d09985edd718e94adbfaf8c11cacbc7099d2bc22467ff02f778ffb6e275fb1e",
        "embeddings": "sha256:89c4a5d61e206c10829439c9f17d632a3d93abab5530dd309814ed551efcc97b",
        "lexical_index": "sha256:9dbc74f07bc04dc1b776abf6b93872d7803f15b3ca62f7c1761a4ea0d2ed259b",
        "vector_index": "sha256:60487fa7d0498c116f40bd0549820291af02783d5962bfd138805a634dfac0bd",
        "index_bundle": "sha256:aa1bd2b2c69ed3bbe9c85cfa28b3d5f5d949e684adae4feacdf82a61fa347306",
    }
    assert SPEC.spec_ids["chunks"] == "sha256:cc3b61f564c7c58b29d7f8016d6d0469bfc81270f82866a517ac64362fe1c74d"
    assert SPEC.spec_ids["index_bundle"] == "sha256:d61b61f9d58af8fef1f5eaceebbcb80fddb93a637858b124c144e95942825021"


def test_document_chunk_and_representation_ids():
    assert corpus_digest([DOC], "public") == "sha256:068145297f3ef40d7186d6f4bff2ec70f2931c13f045ac207f6642351bc62f2c"
    (chunk,) = make_chunker(SPEC.chunker, SPEC.own_spec_ids["chunks"]).chunk(DOC)
    assert (chunk.chunk_id, chunk.byte_start, chunk.byte_end) == (
        "sha256:6a26d5cc49685a83e1bbe4208f9321e0a6a9133b220c9e137838c57f9478a8d0", 0, 23
    )
    assert chunk_set_digest([chunk]) == "sha256:4b58b88fb61bfd6b1d308d9562f5eb3617a6deec79aa05f8a99e668ee5f1eca5"
    reps = derive_representations([DOC], [chunk], SPEC.representations.kinds, SPEC.own_spec_ids["representations"])
    assert [(r.kind, r.representation_id) for r in reps] == [
        ("raw", "sha256:701e1912c9b756d24a7f56c9115180f98382adefec18e5c5684997346e38aa59"),
        ("title_breadcrumb", "sha256:0733e6583365a2a800addf785036d3710c9cf80caf717126fdc4b008a9b5b68f"),
    ]


def test_bundle_id_encoding_is_rfc8785_under_the_bundle_domain():
    sem = BundleSemantic(
        corpus_digest="sha256:" + "1" * 64,
        default_scope="public",
        specs={"chunks": StageSpecRecord(spec_id="sha256:" + "2" * 64, spec={"max_bytes": 1200})},
        chunk_set_digest="sha256:" + "3" * 64,
        representation_set_digest="sha256:" + "4" * 64,
        embeddings_digest=None,
        has_vector_index=False,
        counts=BundleCounts(documents=1, chunks=2, representations=4, lexical_documents=4, vectors=0),
    )
    # For ASCII strings and small integers RFC 8785 equals sorted-key compact JSON: an independent check.
    canonical = json.dumps(sem.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()
    expected = "sha256:" + hashlib.sha256(b"ragpipe/bundle/v1\0" + canonical).hexdigest()
    assert bundle_id_of(sem) == expected == "sha256:9f84de21fd46e02ceb08fa46e37c6a70cf550b116477b47756daa898426825fe"
