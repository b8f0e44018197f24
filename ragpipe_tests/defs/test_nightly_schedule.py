"""nightly_rebuild with ``build_schedule_context`` on a real instance: changed source → new revision,
partition and run request; unchanged → skip."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, build_schedule_context
from dagster._core.test_utils import create_run_for_test

from ragpipe.corpus.connectors import source_digest
from ragpipe.corpus.registry import list_revisions, load_revision
from ragpipe.corpus.watched import SourcesError, load_sources
from ragpipe.defs import build_definitions
from ragpipe.defs.resources import RagpipeHome
from ragpipe_tests.support.paths import SAMPLE

NIGHT_1 = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)
NIGHT_2 = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    corpus = tmp_path / "src" / "corpus.jsonl"
    corpus.parent.mkdir()
    shutil.copyfile(SAMPLE / "rev-1.jsonl", corpus)
    sources = tmp_path / "sources.yaml"
    sources.write_text(
        "schema: ragpipe.sources/v1\nsources:\n  - {name: sci, path: src/corpus.jsonl, format: beir, default_scope: public}\n"
    )
    home = tmp_path / "home"
    monkeypatch.setenv("RAGPIPE_HOME", str(home))
    monkeypatch.setenv("RAGPIPE_SOURCES", str(sources))
    (tmp_path / "dagster").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "dagster")) as instance:
        yield home, instance, build_definitions(), corpus


def tick(env, when: datetime):
    home, instance, defs, _ = env
    ctx = build_schedule_context(
        instance=instance,
        scheduled_execution_time=when,
        resources={"ragpipe": RagpipeHome(home=str(home))},
        repository_def=defs.get_repository_def(),
    )
    return defs.get_schedule_def("nightly_rebuild").evaluate_tick(ctx)


def built(instance: DagsterInstance, revision: str, status: DagsterRunStatus) -> None:
    """A ``build_revision`` run of ``revision`` in ``status``, as the daemon would have recorded it."""
    create_run_for_test(instance, job_name="build_revision", status=status, tags={"dagster/partition": revision})


def test_changed_source_becomes_a_revision_with_a_partition_and_a_run_request(env):
    home, instance, _, corpus = env
    d1 = source_digest(corpus, "beir")
    rev1 = f"sci-20261130-{d1.split(':')[1][:8]}"
    data = tick(env, NIGHT_1)
    assert [(r.partition_key, r.run_key, r.tags["ragpipe/nightly_source"]) for r in data.run_requests] == [
        (rev1, f"nightly:{rev1}", "sci")
    ]
    assert instance.get_dynamic_partitions("corpus_revisions") == [rev1]
    assert load_revision(home / "revisions", rev1).source_digest == d1
    built(instance, rev1, DagsterRunStatus.SUCCESS)
    # unchanged the next night, and built: nothing
    unchanged = tick(env, NIGHT_2)
    assert unchanged.run_requests == []
    assert unchanged.skip_message == f"sci: unchanged since revision {rev1}"
    # the source changes: a new revision of that night
    shutil.copyfile(SAMPLE / "rev-2.jsonl", corpus)
    d2 = source_digest(corpus, "beir")
    rev2 = f"sci-20261201-{d2.split(':')[1][:8]}"
    changed = tick(env, NIGHT_2)
    assert [(r.partition_key, r.run_key) for r in changed.run_requests] == [(rev2, f"nightly:{rev2}")]
    assert sorted(instance.get_dynamic_partitions("corpus_revisions")) == sorted([rev1, rev2])
    assert list_revisions(home / "revisions") == sorted([rev1, rev2])


def test_no_watched_sources_skips(env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    empty = tmp_path / "empty.yaml"
    empty.write_text("schema: ragpipe.sources/v1\nsources: []\n")
    monkeypatch.setenv("RAGPIPE_SOURCES", str(empty))
    data = tick(env, NIGHT_1)
    assert (data.run_requests, data.skip_message) == ([], "no watched sources")


def test_bad_sources_config_names_the_file(tmp_path: Path):
    bad = tmp_path / "s.yaml"
    bad.write_text(
        "schema: ragpipe.sources/v1\nsources:\n  - {name: a, path: x, format: beir}\n  - {name: a, path: y, format: beir}\n"
    )
    with pytest.raises(SourcesError, match=f"^{bad}: source name 'a' is declared twice$"):
        load_sources(bad)
    bad.write_text("schema: ragpipe.sources/v1\nsources:\n  - {name: a, path: x, format: docx}\n")
    with pytest.raises(SourcesError, match=rf"^{bad}: invalid sources config: sources\.0\.format: "):
        load_sources(bad)
    bad.write_text("schema: ragpipe.sources/v1\nsources:\n  - {name: a, path: x, format: beir, name: b}\n")
    with pytest.raises(SourcesError, match=rf"^{bad}:3: sources\[0\]\.name: duplicate key \(first at column "):
        load_sources(bad)


def test_a_malformed_source_stops_no_other_and_nothing_is_lost(env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home, instance, _, corpus = env
    bad = tmp_path / "src" / "bad.jsonl"
    bad.write_text('{"_id": "d1", "title": "x", "text": "y"}\nnot json\n', encoding="utf-8")
    sources = tmp_path / "two.yaml"
    sources.write_text(
        "schema: ragpipe.sources/v1\nsources:\n"
        "  - {name: sci, path: src/corpus.jsonl, format: beir, default_scope: public}\n"
        "  - {name: broken, path: src/bad.jsonl, format: beir, default_scope: public}\n"
        "  - {name: unscoped, path: src/corpus.jsonl, format: beir}\n"
    )
    monkeypatch.setenv("RAGPIPE_SOURCES", str(sources))
    rev1 = f"sci-20261130-{source_digest(corpus, 'beir').split(':')[1][:8]}"
    data = tick(env, NIGHT_1)
    assert [(r.partition_key, r.run_key) for r in data.run_requests] == [(rev1, f"nightly:{rev1}")]
    assert instance.get_dynamic_partitions("corpus_revisions") == [rev1]
    assert list_revisions(home / "revisions") == [rev1]  # the broken source registered nothing
    # the request was never built (its run failed): the next night it is pending, with a new run key
    built(instance, rev1, DagsterRunStatus.FAILURE)
    again = tick(env, NIGHT_2)
    assert [(r.partition_key, r.run_key) for r in again.run_requests] == [(rev1, f"nightly:{rev1}:20261201")]
    built(instance, rev1, DagsterRunStatus.SUCCESS)
    done = tick(env, NIGHT_2)
    assert done.run_requests == []
    assert done.skip_message.startswith(
        f"sci: unchanged since revision {rev1}; broken: cannot snapshot: invalid corpus: {bad}:2: malformed JSON"
    )
    # a source with no default scope and documents that declare none is refused, never made public
    assert (
        f"; unscoped: cannot snapshot: {corpus.resolve()}: 300 documents declare no access_scopes: "
        in done.skip_message
    )


def test_a_revision_registered_by_a_tick_that_died_is_requested_next_time(env):
    """What a tick killed right after registering leaves — the revision on disk, no partition, no
    run — makes the revision pending, never "unchanged"."""
    home, instance, _, corpus = env
    from ragpipe.corpus.watched import snapshot_changed_sources
    from ragpipe.kernel.workspace import Workspace

    (check,) = snapshot_changed_sources(Workspace(home), load_sources(), NIGHT_1.date())
    assert instance.get_dynamic_partitions("corpus_revisions") == []
    data = tick(env, NIGHT_2)
    assert [(r.partition_key, r.run_key) for r in data.run_requests] == [
        (check.revision, f"nightly:{check.revision}:20261201")
    ]
    assert instance.get_dynamic_partitions("corpus_revisions") == [check.revision]
    built(instance, check.revision, DagsterRunStatus.STARTED)  # running: not requested twice
    assert tick(env, NIGHT_2).run_requests == []


def test_pending_follows_the_sensors_view_of_runs_and_stops_after_three_failed_nights(env):
    """Canceling and backfill (partition-range) runs count as may-still-build, as the revision
    sensor counts them; a revision whose nightly builds failed three times is left to a person,
    named in the skip reason (failures of runs the nightly did not request do not count)."""
    home, instance, _, _ = env
    (request,) = tick(env, NIGHT_1).run_requests
    rev = request.partition_key
    night = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
    run = create_run_for_test(
        instance, job_name="build_revision", status=DagsterRunStatus.CANCELING, tags={"dagster/partition": rev}
    )
    assert tick(env, night).run_requests == []
    instance.delete_run(run.run_id)
    ranged = {"dagster/asset_partition_range_start": rev, "dagster/asset_partition_range_end": rev}
    run = create_run_for_test(instance, job_name="__ASSET_JOB", status=DagsterRunStatus.STARTED, tags=ranged)
    assert tick(env, night).run_requests == []
    instance.delete_run(run.run_id)
    create_run_for_test(
        instance, job_name="build_revision", status=DagsterRunStatus.FAILURE, tags={"dagster/partition": rev}
    )
    nightly = {"dagster/partition": rev, "ragpipe/nightly_source": "sci"}
    for attempt in range(3):
        assert [r.partition_key for r in tick(env, night).run_requests] == [rev], attempt
        create_run_for_test(instance, job_name="build_revision", status=DagsterRunStatus.FAILURE, tags=nightly)
    stopped = tick(env, night)
    assert stopped.run_requests == []
    assert stopped.skip_message == (
        f"sci: unchanged since revision {rev}; revision {rev} failed 3 nightly builds: build it by hand "
        "(ragpipe build, or the UI)"
    )


KILLED_TICK = """
import os, signal, sys
from datetime import datetime
from dagster import DagsterInstance, build_schedule_context
import ragpipe.corpus.watched as watched
from ragpipe.defs import build_definitions
from ragpipe.defs.resources import RagpipeHome

registered = watched.register_revision

def register_then_die(*args, **kwargs):
    out = registered(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)  # right after the revision is on disk, before its partition
    return out

watched.register_revision = register_then_die
defs = build_definitions()
with DagsterInstance.from_config(sys.argv[1]) as instance:
    ctx = build_schedule_context(
        instance=instance,
        scheduled_execution_time=datetime.fromisoformat(sys.argv[3]),
        resources={"ragpipe": RagpipeHome(home=sys.argv[2])},
        repository_def=defs.get_repository_def(),
    )
    defs.get_schedule_def("nightly_rebuild").evaluate_tick(ctx)
"""


def test_a_tick_sigkilled_right_after_registering_loses_nothing(env, tmp_path: Path):
    """A real tick process killed the moment it registered a revision: the revision is on disk
    without a partition or run, and the next tick requests it (never "unchanged")."""
    import os
    import signal
    import subprocess
    import sys

    from ragpipe_tests.support.paths import REPO

    home, instance, _, _ = env
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_TICK, str(tmp_path / "dagster"), str(home), NIGHT_1.isoformat()],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (revision,) = list_revisions(home / "revisions")
    assert instance.get_dynamic_partitions("corpus_revisions") == []
    data = tick(env, NIGHT_2)
    assert [(r.partition_key, r.run_key) for r in data.run_requests] == [(revision, f"nightly:{revision}:20261201")]
    assert instance.get_dynamic_partitions("corpus_revisions") == [revision]
