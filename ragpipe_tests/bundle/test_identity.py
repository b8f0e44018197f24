"""Two identities: the bundle ID is a pure function of (corpus digest, semantic specs); the bytes
actually written are bound by the material digest. Execution never enters the bundle ID."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ragpipe.bundle.verify import open_bundle
from ragpipe.embedding.cache import EmbeddingCache
from ragpipe.index.vector import read_vector_rows
from ragpipe.representations.derive import read_representations
from ragpipe.spec import PipelineSpec, load_pipeline_spec
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import SCOPED_DOCS, write_beir

# Texts of very different lengths: in a batch they are padded to the longest, which changes the
# float results in their last bits (the reason the vectors' digest cannot be part of the ID).
DOCS = SCOPED_DOCS + [
    {
        "_id": f"long-{i}",
        "title": f"Long {i}",
        "text": " ".join(["aspirin stroke prevention cohort outcome"] * (3 + 7 * i)),
    }
    for i in range(6)
]


def with_execution(**settings) -> PipelineSpec:
    spec = load_pipeline_spec()
    raw = spec.model_dump(by_alias=True)
    raw["execution"] = {**raw["execution"], **settings}
    return PipelineSpec.model_validate(raw)


def vectors(bundle: Path) -> np.ndarray:
    table = read_vector_rows(bundle / "vector")
    return np.stack(table.column("vector").to_numpy(zero_copy_only=False))


def test_bundle_id_is_independent_of_batch_size_threads_and_cache_state(tmp_path: Path):
    corpus = write_beir(tmp_path / "corpus.jsonl", DOCS)
    half = write_beir(tmp_path / "half.jsonl", DOCS[::2])
    builds = {}
    _, _, builds["cold batch 1, 1 thread"] = build_all_stages(
        tmp_path / "b1", "r", corpus, "beir", spec=with_execution(embed_batch_size=1, torch_threads=1)
    )
    _, _, builds["cold batch 64"] = build_all_stages(
        tmp_path / "b64", "r", corpus, "beir", spec=with_execution(embed_batch_size=64)
    )
    # warm: a second revision of the same content in a home whose cache holds every text
    _, _, builds["warm"] = build_all_stages(
        tmp_path / "b64", "r-again", corpus, "beir", spec=with_execution(embed_batch_size=64)
    )
    # half-warm: the cache holds vectors of half the texts that differ from a cold encode in their
    # last bits (as vectors from other batches or threads do), the rest is encoded now
    _, half_spec, half_bundle = build_all_stages(
        tmp_path / "half", "h", half, "beir", spec=with_execution(embed_batch_size=3)
    )
    seeded = tmp_path / "seeded"
    reps = read_representations(half_bundle / "representations.parquet")
    cache = EmbeddingCache(
        seeded / "embedding_cache", half_spec.own_spec_ids["embeddings"], half_spec.embedder.dimensions
    )
    nudged = vectors(half_bundle) + np.float32(2e-7)
    unique = {r.digest: i for i, r in enumerate(reps)}
    cache.add(list(unique), nudged[list(unique.values())])
    _, _, builds["half-warm"] = build_all_stages(seeded, "r", corpus, "beir", spec=with_execution(embed_batch_size=64))

    opened = {name: open_bundle(path) for name, path in builds.items()}
    assert len({b.bundle_id for b in opened.values()}) == 1, {n: b.bundle_id for n, b in opened.items()}
    assert len({p.name for p in builds.values()}) == 1
    # the material really differs (the half-warm vectors were nudged): an ID that hashed the
    # vectors would differ; each bundle's material digest binds its own vectors
    cold, warmish = vectors(builds["cold batch 64"]), vectors(builds["half-warm"])
    assert 0 < np.abs(cold - warmish).max() < 1e-5
    m_cold, m_half = opened["cold batch 64"].manifest, opened["half-warm"].manifest
    assert m_cold.material.embeddings_digest != m_half.material.embeddings_digest
    assert m_cold.material_digest != m_half.material_digest
    assert np.abs(vectors(builds["cold batch 1, 1 thread"]) - cold).max() < 1e-5
    # nothing operational is recorded in the semantic section
    assert "execution" not in json.dumps(m_cold.semantic.model_dump(mode="json"))


def test_a_corpus_without_a_default_scope_builds_and_verifies_recording_none(tmp_path: Path):
    """Every document declares its scopes: no default is needed, and "none" is what the revision,
    the snapshot's facts and the bundle record — another corpus digest than the same bytes with one."""
    from ragpipe.corpus.registry import load_revision
    from ragpipe.stages.steps import read_stage_record

    scoped = [
        {
            "_id": f"d{i}",
            "title": f"T{i}",
            "text": f"aspirin stroke text number {i}",
            "metadata": {"access_scopes": ["staff"]},
        }
        for i in range(4)
    ]
    corpus = write_beir(tmp_path / "c.jsonl", scoped)
    ws, _, none = build_all_stages(tmp_path / "none", "r1", corpus, "beir", default_scope=None)
    _, _, public = build_all_stages(tmp_path / "public", "r1", corpus, "beir", default_scope="public")
    assert load_revision(ws.registry, "r1").default_scope is None
    assert read_stage_record(ws, "r1", "source_snapshot").facts["default_scope"] is None
    opened, other = open_bundle(none), open_bundle(public)
    assert opened.manifest.semantic.default_scope is None and other.manifest.semantic.default_scope == "public"
    assert opened.manifest.semantic.corpus_digest != other.manifest.semantic.corpus_digest
    assert opened.manifest.bundle_id != other.manifest.bundle_id
