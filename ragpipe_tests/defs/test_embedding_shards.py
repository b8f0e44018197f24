"""The ``embeddings`` asset in shard steps (``RAGPIPE_EMBEDDING_SHARDS``), through Dagster: one
step per shard plus the assembling step, one materialization of ``embeddings`` (which encoded
nothing: the shards did), the bundle ID of the one-step build of the same corpus and its vectors
to float32 rounding."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import yaml
from dagster import AssetKey, DagsterEventType, DagsterInstance, EventRecordsFilter

from ragpipe.embedding.compute import read_embeddings
from ragpipe.kernel.workspace import Workspace
from ragpipe.stages.stage_store import read_output
from ragpipe.stages.steps import read_stage_record
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.paths import REPO


def build(root: Path, corpus: Path, **env: str) -> dict:
    spec = yaml.safe_load((REPO / "ragpipe" / "specs" / "pipeline.yaml").read_text(encoding="utf-8"))
    spec.pop("evaluation")  # the build group is what shards
    (root / "pipeline.yaml").parent.mkdir(parents=True, exist_ok=True)
    (root / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAGPIPE_", "DAGSTER_"))},
        "HF_HUB_OFFLINE": "1",
        "RAGPIPE_PIPELINE_SPEC": str(root / "pipeline.yaml"),
        "RAGPIPE_HOME": str(root / "ragpipe"),
        "DAGSTER_HOME": str(root / "dagster"),
        **env,
    }
    args = ["build", str(corpus), "--revision", "hb", "--default-scope", "public", "--launch", "in-process", "--json"]
    proc = run_cli(*args, env=full, inherit=False, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_sharded_build_runs_a_step_per_shard_and_equals_the_one_step_build(tmp_path: Path):
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    one = build(tmp_path / "one", corpus)
    sharded = build(tmp_path / "sharded", corpus, RAGPIPE_EMBEDDING_SHARDS="3")
    assert sharded["bundle_id"] == one["bundle_id"]  # a semantic ID: what the shard count cannot change
    homes = {name: Workspace(tmp_path / name / "ragpipe") for name in ("one", "sharded")}
    for stage in ("source_snapshot", "chunks", "representations", "lexical_index"):
        expected = read_stage_record(homes["one"], "hb", stage).data_version
        assert read_stage_record(homes["sharded"], "hb", stage).data_version == expected, stage
    # The vectors are the same texts' vectors, encoded in other batches: equal to float32 rounding
    # (a batch's padding changes the order of the sums), so their exact-bytes digest may differ.
    (ids_one, one_vectors), (ids_sharded, sharded_vectors) = (
        read_embeddings(read_output(home, "hb", "embeddings").path / "embeddings.parquet") for home in homes.values()
    )
    assert ids_sharded == ids_one
    assert float(np.max(np.abs(sharded_vectors - one_vectors))) < 1e-5
    instance = DagsterInstance.from_config(str(tmp_path / "sharded" / "dagster"))
    done = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.STEP_SUCCESS))
    steps = {r.event_log_entry.step_key for r in done if r.event_log_entry.run_id == sharded["run_id"]}
    shard_steps = {"embeddings.embed_shard_00", "embeddings.embed_shard_01", "embeddings.embed_shard_02"}
    assert {s for s in steps if s.startswith("embeddings")} == shard_steps | {"embeddings.assemble"}
    (materialization,) = instance.fetch_materializations(AssetKey("embeddings"), limit=10).records
    assert materialization.run_id == sharded["run_id"]
    meta = materialization.asset_materialization.metadata
    assert (meta["encoded"].value, meta["cache_hits"].value) == (0, meta["unique_texts"].value)  # the shards encoded
    instance.dispose()
