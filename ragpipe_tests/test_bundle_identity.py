"""Two identities: the bundle ID is a pure function of (corpus digest, semantic specs); the bytes
actually written are bound by the material digest. Execution never enters the bundle ID."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ragpipe.bundle.verify import open_bundle
from ragpipe.index.vector import read_vector_rows
from ragpipe.pipeline_spec import PipelineSpec, load_pipeline_spec
from ragpipe_tests.conftest import SCOPED_DOCS, build_all_stages, write_beir

# Texts of very different lengths: in a batch they are padded to the longest, which changes the
# float results in their last bits (the reason the vectors' digest cannot be part of the ID).
DOCS = SCOPED_DOCS + [
    {"_id": f"long-{i}", "title": f"Long {i}", "text": " ".join(["aspirin stroke prevention cohort outcome"] * (3 + 7 * i))}
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
    _, _, builds["cold batch 64"] = build_all_stages(tmp_path / "b64", "r", corpus, "beir", spec=with_execution(embed_batch_size=64))
    # warm: a second revision of the same content in a home whose cache holds every text
    _, _, builds["warm"] = build_all_stages(tmp_path / "b64", "r-again", corpus, "beir", spec=with_execution(embed_batch_size=64))
    # half-warm: the cache holds the vectors of half the documents, encoded in other batches
    build_all_stages(tmp_path / "half", "h", half, "beir", spec=with_execution(embed_batch_size=3))
    _, _, builds["half-warm"] = build_all_stages(tmp_path / "half", "r", corpus, "beir", spec=with_execution(embed_batch_size=64))

    opened = {name: open_bundle(path) for name, path in builds.items()}
    assert len({b.bundle_id for b in opened.values()}) == 1, {n: b.bundle_id for n, b in opened.items()}
    assert len({p.name for p in builds.values()}) == 1
    # the material really differs: the test would catch an ID that hashed the vectors
    one, many = vectors(builds["cold batch 1, 1 thread"]), vectors(builds["cold batch 64"])
    assert np.abs(one - many).max() < 1e-5
    assert (one != many).any()
    m1, m64 = opened["cold batch 1, 1 thread"].manifest, opened["cold batch 64"].manifest
    assert m1.material.embeddings_digest != m64.material.embeddings_digest
    assert m1.material_digest != m64.material_digest
    # nothing operational is recorded in the semantic section
    assert "execution" not in json.dumps(m1.semantic.model_dump(mode="json"))
