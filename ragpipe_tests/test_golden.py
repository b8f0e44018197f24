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
from ragpipe.representations.derive import derive_representations
from ragpipe.spec import load_pipeline_spec

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
        "lexical_index": "sha256:63f903b2a7501f3624954dce2c4f23a91b16bb148fc4561a47474d5a93275aaf",
        "vector_index": "sha256:60487fa7d0498c116f40bd0549820291af02783d5962bfd138805a634dfac0bd",
        "index_bundle": "sha256:7e3df6226208464fb0a73f647f2e79861e1b76bbcc6eb83a85a09daf6f08370d",
    }
    assert SPEC.spec_ids["chunks"] == "sha256:cc3b61f564c7c58b29d7f8016d6d0469bfc81270f82866a517ac64362fe1c74d"
    assert SPEC.spec_ids["index_bundle"] == "sha256:4e2a08423d44d83eb2fd01bb23b5e3c0e6bd658c202dcdb28c1969f22e790ee7"


def test_document_chunk_and_representation_ids():
    assert corpus_digest([DOC], "public") == "sha256:068145297f3ef40d7186d6f4bff2ec70f2931c13f045ac207f6642351bc62f2c"
    (chunk,) = make_chunker(SPEC.chunker, SPEC.own_spec_ids["chunks"]).chunk(DOC)
    assert (chunk.chunk_id, chunk.byte_start, chunk.byte_end) == (
        "sha256:6a26d5cc49685a83e1bbe4208f9321e0a6a9133b220c9e137838c57f9478a8d0",
        0,
        23,
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
        has_vector_index=False,
        counts=BundleCounts(documents=1, chunks=2, representations=4, lexical_documents=4, vectors=0),
    )
    # For ASCII strings and small integers RFC 8785 equals sorted-key compact JSON: an independent check.
    canonical = json.dumps(sem.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()
    expected = "sha256:" + hashlib.sha256(b"ragpipe/bundle/v2\0" + canonical).hexdigest()
    assert bundle_id_of(sem) == expected == "sha256:6e9d7f7aabac99ef82b2a87931e83dd119349af6abb4c25b8ea25ba80df88307"


def test_material_digest_and_seals_are_independently_recomputable():
    """The documented formulas, computed here with hashlib/hmac alone, give the manifest's values."""
    import hmac

    from ragpipe.bundle.manifest import FileEntry, make_manifest
    from ragpipe.kernel.seals import SealKey

    sem = BundleSemantic(
        corpus_digest="sha256:" + "1" * 64,
        default_scope="public",
        specs={"chunks": StageSpecRecord(spec_id="sha256:" + "2" * 64, spec={"max_bytes": 1200})},
        chunk_set_digest="sha256:" + "3" * 64,
        representation_set_digest="sha256:" + "4" * 64,
        has_vector_index=False,
        counts=BundleCounts(documents=1, chunks=2, representations=4, lexical_documents=4, vectors=0),
    )
    files = [FileEntry(path="a", size=1, sha256="sha256:" + "5" * 64)]
    compact = {"sort_keys": True, "separators": (",", ":")}
    unkeyed = make_manifest(sem, None, files, None)
    material = json.dumps(
        {"bundle_id": unkeyed.bundle_id, "embeddings_digest": None, "files": [f.model_dump() for f in files]}, **compact
    )
    assert (
        unkeyed.material_digest
        == "sha256:" + hashlib.sha256(b"ragpipe/bundle-material/v1\0" + material.encode()).hexdigest()
    )
    assert unkeyed.material_digest == "sha256:bfd8e942fbe0cca44f9e6da28c3e49fe10d392c4a46d1d9552a53cb95599b899"
    payload = json.dumps(
        {"bundle_id": unkeyed.bundle_id, "material_digest": unkeyed.material_digest}, **compact
    ).encode()
    assert unkeyed.seal.kind == "sha256" and unkeyed.seal.key_id is None
    assert unkeyed.seal.value == "sha256:" + hashlib.sha256(b"ragpipe/bundle-seal/v2\0" + payload).hexdigest()
    assert unkeyed.seal.value == "sha256:5e0de9f5385997ab9940a8bf90f18903e0d6b1deb9aadda41b5e6114954397ce"
    keyed = make_manifest(sem, None, files, SealKey(b"k" * 32))
    mac = hmac.new(b"k" * 32, b"ragpipe/bundle-seal/v2\0" + payload, hashlib.sha256).hexdigest()
    assert (keyed.seal.kind, keyed.seal.key_id, keyed.seal.value) == (
        "hmac-sha256",
        "sha256:91a11923fc49601e",
        f"hmac-sha256:{mac}",
    )
    assert mac == "c3c1d12f8c1ce298396ea25608c7fdf0cb501a1c97a00607dde349c10e44c42a"


def test_query_plan_id_encoding():
    """The plan ID covers every field, ``depth_policy`` included (added with scope-aware depth, which
    changed every plan ID: the depth a channel ranks now depends on it) and ``vector_search``
    (added with exact vector scores, which changed every plan ID again: the scores changed)."""
    from ragpipe.retrieval.plan import parse_plan

    plan = parse_plan({"channels": {"lexical": {}}}, "golden")
    dumped = plan.model_dump(mode="json", by_alias=True)
    assert dumped["depth_policy"] == {"kind": "settled_units/v1", "request_multiple": 2, "growth": 2}
    assert dumped["vector_search"] == {"kind": "exact", "scores": "float64_sequential/v1"}

    def integral(value):  # RFC 8785 writes 1.0 as 1; the rest of this plan is ASCII and small ints
        if isinstance(value, dict):
            return {k: integral(v) for k, v in value.items()}
        return int(value) if isinstance(value, float) and value.is_integer() else value

    canonical = json.dumps(integral(dumped), sort_keys=True, separators=(",", ":")).encode()
    expected = "sha256:" + hashlib.sha256(b"ragpipe/query-plan/v1\0" + canonical).hexdigest()
    assert plan.plan_id == expected == "sha256:7d147dcc412e3cde2f536339f881fa2c253a3dc1c301ef367a26ea4d369f905d"
