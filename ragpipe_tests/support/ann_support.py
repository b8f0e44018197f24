"""A small real bundle with an ANN index: the evaluation bundle's 100 SciFact documents built again
(in the same home, so the embedding cache is reused) with ``vector_index.ann`` set — an IVF_HNSW_SQ
index of two partitions. Built once per session; the bundle without it is ``eval_bundle``'s."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.spec import PipelineSpec, load_pipeline_spec
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.eval_support import eval_bundle  # noqa: F401  (fixture)

ANN = {"kind": "ivf_hnsw_sq", "num_partitions": 2, "m": 16, "ef_construction": 100}


def ann_spec() -> PipelineSpec:
    spec = load_pipeline_spec()
    return PipelineSpec.model_validate(
        {**spec.model_dump(by_alias=True), "vector_index": {"metric": spec.vector_index.metric, "ann": ANN}}
    )


@pytest.fixture(scope="session")
def ann_bundle(eval_bundle) -> tuple[Path, Path]:  # noqa: F811
    """(bundle path, suite path): ``eval_bundle``'s documents and suite, with an ANN index."""
    _, suite = eval_bundle
    root = suite.parent
    marker = root / "ann-bundle-path"
    if not marker.exists():
        _, _, bundle = build_all_stages(root / "home", "s1-ann", root / "rev-1-head.jsonl", "beir", spec=ann_spec())
        marker.write_text(str(bundle), encoding="utf-8")
    return Path(marker.read_text(encoding="utf-8")), suite
