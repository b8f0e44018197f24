"""Pools: two runs of the same partition never run one stage at the same time.

The instance is configured from ``dagster.yaml`` (every pool one slot, op granularity). Two
runs of ``build_revision`` for one partition are created like ``ragpipe build`` creates them and
executed at once in two processes. The test holds the ``ragpipe_stage_files`` slot itself until both
runs wait on it, so they provably contend, then lets them go.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus

from ragpipe.corpus.registry import register_revision
from ragpipe.defs.assets import POOLS
from ragpipe.defs.release_chain import CHAIN_POOLS
from ragpipe.orchestration.launch import create_build_run
from ragpipe.orchestration.progress import EmbeddingProgress, PoolWait, Tracker
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.paths import REPO

EXECUTE = (
    "import sys\n"
    "from dagster import DagsterInstance\n"
    "from ragpipe.orchestration.launch import execute_build_run\n"
    "print(execute_build_run(DagsterInstance.get(), sys.argv[1]).value)\n"
)
HOLDER_RUN, HOLDER_STEP = "test-holder", "holder"


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def _intervals(instance: DagsterInstance, run_id: str) -> dict[str, tuple[float, float]]:
    """(STEP_START, STEP_SUCCESS) timestamps per step of a run."""
    starts = {e.step_key: e.timestamp for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)}
    ends = {e.step_key: e.timestamp for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_SUCCESS)}
    return {k: (starts[k], ends[k]) for k in starts}


def test_two_runs_of_one_partition_take_turns_per_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Not tmp_path / "ragpipe": with cwd=tmp_path that folder would shadow the package in `python -c`.
    home, dagster_home = tmp_path / "home", tmp_path / "dagster"
    dagster_home.mkdir()
    shutil.copy(REPO / "dagster.yaml", dagster_home / "dagster.yaml")
    register_revision(home / "revisions", "hb", write_tree(tmp_path / "hb", HANDBOOK), "markdown", "public")
    monkeypatch.setenv("RAGPIPE_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    instance = DagsterInstance.get()
    storage = instance.event_log_storage
    instance.add_dynamic_partitions("corpus_revisions", ["hb"])
    run_ids = [create_build_run(instance, "hb") for _ in range(2)]

    # Hold the first pool's only slot so that both runs must wait on it.
    storage.initialize_concurrency_limit_to_default("ragpipe_stage_files")
    assert storage.claim_concurrency_slot("ragpipe_stage_files", HOLDER_RUN, HOLDER_STEP).is_claimed
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", EXECUTE, run_id],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run_id in run_ids
    ]
    try:

        def both_waiting() -> bool:
            pending = storage.get_concurrency_info("ragpipe_stage_files").pending_steps
            return {p.run_id for p in pending} >= set(run_ids)

        _wait_for(both_waiting, 180, "both runs to wait for the ragpipe_stage_files slot")
        storage.free_concurrency_slot_for_step(HOLDER_RUN, HOLDER_STEP)
        outputs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0 and out.strip() == "SUCCESS", err

    progress: dict[str, list[EmbeddingProgress]] = {}
    for run_id in run_ids:
        assert instance.get_run_by_id(run_id).status == DagsterRunStatus.SUCCESS
        assert instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE) == []
        blocked = [e.message for e in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)]
        assert "Step blocked by limit for pool ragpipe_stage_files" in blocked
        # What `ragpipe build` shows comes from the events' structured data, one wait line per step.
        tracker = Tracker()
        shown = [item for entry in instance.all_logs(run_id) for item in tracker.feed(entry)]
        waits = [item for item in shown if isinstance(item, PoolWait)]
        assert waits[0] == PoolWait("source_snapshot", "ragpipe_stage_files")
        # the release chain's pools too: under load both runs can reach evaluation_run together
        pools = set(POOLS.values()) | set(CHAIN_POOLS.values())
        assert len(waits) == len({w.step for w in waits}) and {w.pool for w in waits} <= pools
        progress[run_id] = [item for item in shown if isinstance(item, EmbeddingProgress)]
    # The run that embedded first observed its progress from 0 to every new text; the other found
    # all of them in the shared cache and encoded nothing.
    encoded = {
        r: e.asset_materialization.metadata["encoded"].value
        for r in run_ids
        for e in instance.all_logs(r, of_type=DagsterEventType.ASSET_MATERIALIZATION)
        if e.step_key == "embeddings"
    }
    embedder = next(r for r in run_ids if encoded[r])
    total = encoded[embedder]
    assert sorted(encoded.values()) == [0, total] and total > 0
    assert progress[embedder][0] == EmbeddingProgress(0, total) and progress[embedder][-1] == EmbeddingProgress(
        total, total
    )
    assert [p.done for p in progress[embedder]] == sorted(p.done for p in progress[embedder])
    assert progress[next(r for r in run_ids if r != embedder)] == []
    first, second = (_intervals(instance, r) for r in run_ids)
    assert set(POOLS) <= set(first) and set(POOLS) <= set(second)
    for pool in set(POOLS.values()):
        steps = [s for s, p in POOLS.items() if p == pool]
        spans = sorted([first[s] for s in steps] + [second[s] for s in steps])
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start, f"pool {pool}: two steps overlapped ({spans})"

    # Equal content: both runs published one version per stage.
    for stage in POOLS:
        folder = home / "work" / "hb" / stage
        names = sorted(p.name for p in folder.iterdir())
        assert len(names) == 2 and names[1] == "latest.json", (stage, names)
    for pool in set(POOLS.values()):
        info = storage.get_concurrency_info(pool)
        assert (info.limit, info.claimed_slots, info.pending_steps) == (1, [], []), pool
