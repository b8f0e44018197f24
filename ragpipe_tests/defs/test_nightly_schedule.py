"""nightly_rebuild with ``build_schedule_context`` on a real instance: changed source → new revision,
partition and run request; unchanged → skip."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_schedule_context

from ragpipe.corpus.connectors import source_digest
from ragpipe.corpus.registry import list_revisions, load_revision
from ragpipe.corpus.watched import SourcesError, load_sources
from ragpipe.defs import build_definitions
from ragpipe.defs.resources import RagpipeHome
from ragpipe_tests.conftest import SAMPLE

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
    # unchanged the next night: nothing
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
    bad.write_text("schema: ragpipe.sources/v1\nsources:\n  - {name: a, path: x, format: pdf}\n")
    with pytest.raises(SourcesError, match=rf"^{bad}: invalid sources config: sources\.0\.format: "):
        load_sources(bad)
