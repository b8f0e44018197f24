"""corpus_revision_sensor: partitions for new revisions, a cursor of attempts, bounded retries.

Ticks are evaluated with ``build_sensor_context(...).evaluate_tick`` on a real instance; requested
runs are executed the way the daemon would (the run key becomes the ``dagster/run_key`` tag).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, build_sensor_context
from dagster._core.definitions.sensor_definition import SensorExecutionData

from ragpipe.corpus.registry import register_revision
from ragpipe.defs import build_definitions
from ragpipe.defs.resources import RagpipeHome
from ragpipe.defs.sensors import MAX_ATTEMPTS, corpus_revision_sensor, load_cursor
from ragpipe_tests.support.corpora import HANDBOOK, write_tree


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A RAGPIPE_HOME, a temporary instance and the definitions the code location would load."""
    home = tmp_path / "ragpipe"
    monkeypatch.setenv("RAGPIPE_HOME", str(home))
    (tmp_path / "dagster").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "dagster")) as instance:
        yield home, instance, build_definitions()


def tick(env, cursor: str | None) -> SensorExecutionData:
    home, instance, defs = env
    # instance_ref as well: resolving a request for a partition added in the same tick reads the
    # partitions through it (like the gRPC server that evaluates sensors for the daemon).
    ctx = build_sensor_context(
        instance=instance,
        instance_ref=instance.get_ref(),
        cursor=cursor,
        resources={"ragpipe": RagpipeHome(home=str(home))},
        definitions=defs,
    )
    data = corpus_revision_sensor.evaluate_tick(ctx)
    for req in data.dynamic_partitions_requests or []:  # what the daemon does with them
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    return data


def requested(data: SensorExecutionData) -> list[tuple[str, str, dict[str, str]]]:
    return [
        (r.partition_key, r.run_key, {k: v for k, v in r.tags.items() if k.startswith("ragpipe/")})
        for r in data.run_requests
    ]


def launch(env, data: SensorExecutionData) -> list[DagsterRunStatus]:
    """Run each request as the daemon would: same job, partition, tags and the run key tag."""
    _, instance, defs = env
    job = defs.resolve_job_def("build_revision")
    statuses = []
    for req in data.run_requests:
        result = job.execute_in_process(
            partition_key=req.partition_key,
            instance=instance,
            tags={**req.tags, "dagster/run_key": req.run_key},
            raise_on_error=False,
        )
        statuses.append(instance.get_run_by_id(result.run_id).status)
    return statuses


def attempt_tags(n: int) -> dict[str, str]:
    return {"ragpipe/attempt": str(n), "ragpipe/max_attempts": str(MAX_ATTEMPTS)}


def register(home: Path, revision: str, corpus: Path) -> None:
    register_revision(home / "revisions", revision, corpus, "markdown", "public")


def test_new_revision_is_requested_once_and_recorded_in_the_cursor(env, tmp_path: Path):
    home, instance, _ = env
    register(home, "a", write_tree(tmp_path / "hb", HANDBOOK))
    first = tick(env, None)
    assert requested(first) == [("a", "a#1", attempt_tags(1))]
    assert [list(r.partition_keys) for r in first.dynamic_partitions_requests] == [["a"]]
    assert first.run_requests[0].tags["dagster/partition"] == "a"
    assert json.loads(first.cursor) == {"v": 1, "attempts": {"a": 1}}
    # (b) no run was launched: the request is pending, so the next tick requests nothing.
    second = tick(env, first.cursor)
    assert second.run_requests == []
    assert second.dynamic_partitions_requests == []
    assert second.skip_message == "a: attempt 1 requested, not launched yet"
    assert second.cursor == first.cursor
    assert instance.get_dynamic_partitions("corpus_revisions") == ["a"]


def test_failed_build_is_retried_with_a_new_run_key_until_it_succeeds(env, tmp_path: Path):
    home, instance, _ = env
    corpus = write_tree(tmp_path / "hb", HANDBOOK)
    register(home, "a", corpus)
    original = (corpus / "guide/intro.md").read_bytes()
    (corpus / "guide/intro.md").write_bytes(original + b"\nChanged after registration.\n")
    first = tick(env, None)
    assert launch(env, first) == [DagsterRunStatus.FAILURE]
    # (c) the failed attempt is retried with the next run key and attempt tag.
    retry = tick(env, first.cursor)
    assert requested(retry) == [("a", "a#2", attempt_tags(2))]
    assert json.loads(retry.cursor) == {"v": 1, "attempts": {"a": 2}}
    (corpus / "guide/intro.md").write_bytes(original)
    assert launch(env, retry) == [DagsterRunStatus.SUCCESS]
    bundle = instance.fetch_materializations(_bundle_filter("a"), limit=1).records[0]
    assert bundle.asset_materialization.metadata["run_attempt"].value == 2
    # (d) built: never requested again.
    for cursor in (retry.cursor, tick(env, retry.cursor).cursor):
        done = tick(env, cursor)
        assert done.run_requests == []
        assert done.skip_message == "a: built"
        assert load_cursor(done.cursor) == {"a": 2}


def test_gives_up_after_three_failed_attempts(env, tmp_path: Path):
    home, instance, _ = env
    corpus = write_tree(tmp_path / "hb", HANDBOOK)
    register(home, "a", corpus)
    (corpus / "guide/intro.md").write_text("changed after registration\n", encoding="utf-8")
    cursor = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        data = tick(env, cursor)
        assert requested(data) == [("a", f"a#{attempt}", attempt_tags(attempt))]
        assert launch(env, data) == [DagsterRunStatus.FAILURE]
        cursor = data.cursor
    # (e) no fourth request, and the skip message says why.
    for _ in range(2):
        data = tick(env, cursor)
        assert data.run_requests == []
        assert data.skip_message == "a: gave up after 3 attempts (last: FAILURE)"
        cursor = data.cursor
    runs = instance.get_run_records()
    assert sorted(r.dagster_run.tags["dagster/run_key"] for r in runs) == ["a#1", "a#2", "a#3"]


def test_revision_built_by_the_cli_is_never_requested(env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.orchestration.materialize import materialize_revision

    home, instance, _ = env
    register(home, "a", write_tree(tmp_path / "hb", HANDBOOK))
    monkeypatch.setenv("DAGSTER_HOME", instance.root_directory)
    summary = materialize_revision("a", Workspace(home), instance=instance)
    assert summary.up_to_date is False
    # (f) the partition exists and its bundle run succeeded: nothing to request, even with no cursor.
    data = tick(env, None)
    assert data.run_requests == []
    assert data.skip_message == "a: built"
    assert json.loads(data.cursor) == {"v": 1, "attempts": {}}


def test_an_unfinished_run_of_the_partition_blocks_a_request(env, tmp_path: Path):
    home, instance, defs = env
    register(home, "a", write_tree(tmp_path / "hb", HANDBOOK))
    instance.add_dynamic_partitions("corpus_revisions", ["a"])
    # A run somebody else started (the UI, a backfill, the CLI): not finished yet.
    run = instance.create_run_for_job(
        defs.resolve_job_def("build_revision"), tags={"dagster/partition": "a"}, status=DagsterRunStatus.STARTED
    )
    blocked = tick(env, None)
    assert blocked.run_requests == []
    assert blocked.skip_message == f"a: run {run.run_id} has not finished"
    instance.report_run_failed(run)  # it failed: now the sensor builds the revision
    assert requested(tick(env, blocked.cursor)) == [("a", "a#1", attempt_tags(1))]


def test_an_unfinished_backfill_run_of_the_partition_blocks_a_request(env, tmp_path: Path):
    """An asset backfill's runs name a partition range (one partition each), not dagster/partition."""
    home, instance, defs = env
    register(home, "a", write_tree(tmp_path / "hb", HANDBOOK))
    instance.add_dynamic_partitions("corpus_revisions", ["a"])
    range_tags = {
        "dagster/asset_partition_range_start": "a",
        "dagster/asset_partition_range_end": "a",
        "dagster/backfill": "bf",
    }
    run = instance.create_run_for_job(
        defs.resolve_job_def("build_revision"), tags=range_tags, status=DagsterRunStatus.STARTING
    )
    blocked = tick(env, None)
    assert (blocked.run_requests, blocked.skip_message) == ([], f"a: run {run.run_id} has not finished")
    instance.report_run_failed(run)
    assert requested(tick(env, blocked.cursor)) == [("a", "a#1", attempt_tags(1))]


def test_cursor_of_another_version_is_refused():
    with pytest.raises(ValueError) as info:
        load_cursor('{"v": 2, "attempts": {}}')
    assert str(info.value) == """corpus_revision_sensor: unknown cursor version in '{"v": 2, "attempts": {}}'"""


def test_sensor_carries_its_description_into_the_ui():
    assert corpus_revision_sensor.description == (
        "Adds every corpus revision registered under $RAGPIPE_HOME/revisions as a partition and requests its build "
        "until one succeeds (at most 3 attempts per revision; run key <revision>#<attempt>)."
    )


def _bundle_filter(revision: str):
    from dagster import AssetKey, AssetRecordsFilter

    return AssetRecordsFilter(asset_key=AssetKey("index_bundle"), asset_partitions=[revision])
