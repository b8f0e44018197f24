"""The revision sensor turns registered revisions into partitions and build requests."""

from __future__ import annotations

from pathlib import Path

from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

from ragpipe.corpus.registry import register_revision
from ragpipe.defs.resources import RagpipeHome
from ragpipe.defs.sensors import corpus_revision_sensor
from ragpipe_tests.conftest import HANDBOOK, write_tree


def test_sensor_adds_partitions_and_requests_each_revision_once(tmp_path: Path):
    corpus = write_tree(tmp_path / "hb", HANDBOOK)
    home = tmp_path / "ragpipe"
    register_revision(home / "revisions", "a", corpus, "markdown")
    register_revision(home / "revisions", "b", corpus, "markdown")
    (tmp_path / "dagster").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "dagster")) as instance:
        instance.add_dynamic_partitions("corpus_revisions", ["a"])
        ctx = build_sensor_context(instance=instance, resources={"ragpipe": RagpipeHome(home=str(home))})
        result = corpus_revision_sensor(ctx)
        assert isinstance(result, SensorResult)
        assert [(r.partition_key, r.run_key) for r in result.run_requests] == [("b", "revision:b")]
        assert [list(r.partition_keys) for r in result.dynamic_partitions_requests] == [["b"]]
        instance.add_dynamic_partitions("corpus_revisions", ["b"])
        skipped = corpus_revision_sensor(build_sensor_context(instance=instance, resources={"ragpipe": RagpipeHome(home=str(home))}))
        assert isinstance(skipped, SkipReason)
        assert skipped.skip_message == "no newly registered corpus revisions"


def test_sensor_carries_its_description_into_the_ui():
    assert corpus_revision_sensor.description == (
        "Adds every corpus revision registered under $RAGPIPE_HOME/revisions as a partition and requests its build."
    )
