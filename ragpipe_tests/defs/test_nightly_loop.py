"""Ten nights of a living corpus through the real schedule, build job, activation sensor and job.

Documents are added, edited and deleted; the suite grows with cases for new documents and loses
the case of a deleted one (and, one night, keeps a case whose document was deleted: lost
coverage). Every night is gated as a refresh against what staging serves and activated by the
sensor without a person — except the night that truncates half of the judged documents (refused
by non-inferiority; staging keeps the night before) and the night that changes the chunker
(gated as an experiment). ``ragpipe_tests.support.nightly_loop`` drives it.
"""

from __future__ import annotations

import pytest
from dagster import AssetKey, AssetRecordsFilter

from ragpipe.kernel.workspace import Workspace
from ragpipe.release.history import read_history
from ragpipe.release.manifest import load_manifest
from ragpipe.release.store import ReleaseStore
from ragpipe_tests.support.nightly_loop import Night, NightlyLoop, judged, ten_nights


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory):
    loop = NightlyLoop(tmp_path_factory.mktemp("nightly"))
    with pytest.MonkeyPatch.context() as mp:
        scenario = ten_nights(loop, mp)
    yield loop, scenario
    loop.close()


def by_number(loop: NightlyLoop) -> dict[int, Night]:
    return {n.number: n for n in loop.nights}


def test_every_refresh_goes_live_on_staging_without_a_person(nights):
    loop, _ = nights
    n = by_number(loop)
    assert (n[1].change, n[1].eligible, n[1].staging) == ("bootstrap", True, n[1].release_id)
    live = n[1].release_id
    store = ReleaseStore(Workspace(loop.home))
    for night in (2, 3, 4, 5, 6, 8, 10):
        manifest = load_manifest(store, n[night].release_id)
        assert (n[night].change, n[night].eligible, n[night].reasons) == ("refresh", True, ()), night
        assert (manifest.gate.change, manifest.gate.incumbent) == ("refresh", live), night
        assert n[night].staging == n[night].release_id, night
        live = n[night].release_id
    state = read_history(store, "staging")[0]
    assert state.active == n[10].release_id
    history = [r for r in read_history(store, "staging")[1] if r.kind == "intent"]
    # every activation was the sensor's run, waiving human_apply_required (the targets file says so)
    assert [(r.payload["release_id"], r.payload["waived"]) for r in history] == [
        (n[i].release_id, "human_apply_required") for i in (1, 2, 3, 4, 5, 6, 8, 10)
    ]
    assert all(r.payload["by"].startswith("dagster run ") for r in history)


def test_the_suite_grows_and_shrinks_with_the_corpus(nights):
    loop, s = nights
    n = by_number(loop)
    assert n[2].new_coverage == tuple(sorted(s.added[2]))
    assert n[4].new_coverage == tuple(s.added[4])
    assert (n[5].new_coverage, n[5].lost_coverage) == ((), ())  # the case left with its document
    assert (n[6].new_coverage, n[6].lost_coverage) == (tuple(s.added[6]), ("100",))
    (kept,) = [c for c in loop.cases if c["id"] == "100"]
    assert s.removed_case_kept == [judged(kept)]  # the lost case's judged document is the deleted one
    assert s.removed_with_case[0] not in {judged(c) for c in loop.cases}
    assert n[8].new_coverage == tuple(s.added[8])
    assert [x.cases for x in loop.nights] == [24, 26, 26, 27, 26, 27, 27, 28, 28, 28]


def test_the_truncating_night_is_refused_by_non_inferiority_and_staging_keeps_the_night_before(nights):
    loop, s = nights
    n = by_number(loop)
    assert len(s.truncated) == 13  # every other one of the 26 judged documents present that night
    assert (n[7].change, n[7].eligible) == ("refresh", False)
    assert n[7].reasons[0].startswith("target non_inferiority ndcg@10: -0.0")
    assert n[7].reasons[0].endswith(" is not >= -0.01")
    assert n[7].staging == n[6].release_id
    manifest = load_manifest(ReleaseStore(Workspace(loop.home)), n[8].release_id)
    assert manifest.gate.incumbent == n[6].release_id  # the night after is gated against what is live


def test_the_chunker_night_is_an_experiment(nights):
    loop, _ = nights
    n = by_number(loop)
    assert (n[9].change, n[9].differs) == ("experiment", ("stage_specs.chunks",))
    assert (n[9].eligible, n[9].reasons[0]) == (False, "target ci_lower ndcg@10: 0 is not > 0")
    assert n[9].staging == n[8].release_id
    manifest = load_manifest(ReleaseStore(Workspace(loop.home)), n[10].release_id)
    assert manifest.gate.incumbent == n[8].release_id
    # what the Dagster UI shows on the gate and release assets of that night
    gate = loop.latest("gate_decision", n[9].revision)
    assert gate["change"].value == f"experiment (stage_specs.chunks differs) against {n[8].release_id[:19]}…"
    assert (gate["changed"].value, gate["incumbent_release"].value) == ("stage_specs.chunks", n[8].release_id)
    release = loop.latest("release_manifest", n[9].revision)
    assert (release["change"].value, release["incumbent_release"].value) == ("experiment", n[8].release_id)


def test_only_new_and_edited_texts_are_embedded(nights):
    loop, _ = nights
    # night 1 encodes every text; later nights only what changed (each document: its chunks'
    # raw and title-breadcrumb texts); the chunker night encodes its new chunks
    assert [x.encoded for x in loop.nights] == [124, 12, 6, 2, 6, 2, 26, 2, 258, 14]


def test_the_release_asset_says_where_each_release_is_live(nights):
    loop, _ = nights
    n = by_number(loop)

    def observed(night: int) -> list[dict]:
        records = loop.instance.fetch_observations(
            AssetRecordsFilter(asset_key=AssetKey("release_manifest"), asset_partitions=[n[night].revision]), limit=5
        ).records
        return [
            {k: v.value for k, v in r.asset_observation.metadata.items() if k != "since"}
            for r in sorted(records, key=lambda r: r.storage_id)
        ]

    assert observed(10) == [{"live_on": "staging", "release_id": n[10].release_id, "generation": 8}]
    assert observed(8) == [
        {"live_on": "staging", "release_id": n[8].release_id, "generation": 7},
        {"no_longer_live_on": "staging", "release_id": n[8].release_id, "generation": 8},
    ]
    assert observed(7) == observed(9) == []  # refused: never live
