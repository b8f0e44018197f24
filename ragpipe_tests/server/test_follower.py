"""The follower in process: what it serves after forgeries, rollbacks and failures, and how a
replaced release drains."""

from __future__ import annotations

import pytest
import yaml

from ragpipe.release.activation import activate
from ragpipe.release.history import History, now_iso
from ragpipe.release.kept_decision import publish_gate_evidence
from ragpipe.release.manifest import ReleaseManifest, publish_manifest
from ragpipe.release.pointer import Pointer, write_pointer
from ragpipe.release.rollback import rollback
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.retrieval.results import QueryError
from ragpipe.server import follower as follower_module
from ragpipe.server.follower import ReleaseFollower
from ragpipe_tests.server.test_follow import forge_activation
from ragpipe_tests.support.release_fixtures import bundle_of, gate_of, manifest_for
from ragpipe_tests.support.serving import Serving, b1_after_a1


@pytest.fixture
def following(serving: Serving):
    made: list[ReleaseFollower] = []

    def make(target: str = "staging") -> ReleaseFollower:
        f = ReleaseFollower(serving.ws, target, 0.01, serving.targets)
        made.append(f)
        return f

    yield make
    for f in made:
        f.stop()


def served(f: ReleaseFollower) -> str | None:
    release = f.status()["release"]
    return release["release_id"] if release else None


def test_a_forged_gate_decision_is_made_again_and_refused(serving: Serving, following, built_workspace):
    """A decision flipped to eligible (every digest of its evidence recomputed) behind a forged but
    agreeing history: the follower makes the decision again from its runs, as activation does."""
    store, a1 = ReleaseStore(serving.ws), serving.releases["a1"]
    bundle = bundle_of(built_workspace)  # the original: its evaluation run is the one the workspace holds
    policy, real = gate_of(bundle, "hard")  # the run fails the hard phase under this policy
    forged = real.model_copy(
        update={
            "eligible": True,
            "decisive_phase": None,
            "reasons": (),
            "checks": tuple(c.model_copy(update={"verdict": "pass", "reason": None}) for c in real.checks),
        }
    )
    publish_gate_evidence(store, forged.as_json(), None, policy)
    base = manifest_for(bundle, "r-forged")
    manifest = ReleaseManifest(
        **{
            **base.model_dump(by_alias=True),
            "gate_policy_id": policy.policy_id,
            # the forger keeps the real gate's change (bootstrap, no incumbent): only eligibility is forged
            "gate": {
                **base.gate.model_dump(),
                "decision_id": forged.decision_id,
                "eligible": True,
                "decisive_phase": None,
            },
        }
    )
    release_id = publish_manifest(store, manifest)[0]
    with pytest.raises(ReleaseError, match="made again from its runs"):
        activate(serving.ws, release_id, "staging")
    activate(serving.ws, a1, "staging")
    f = following()
    f.poll()
    assert served(f) == a1
    forge_activation(serving.ws, release_id)
    f.poll()
    status = f.status()
    assert served(f) == a1 and status["refusal"]["release_id"] is None
    assert status["refusal"]["reason"].startswith(f"target 'staging': release {release_id} failed verification: ")
    assert "made again from its runs" in status["refusal"]["reason"]


def test_production_needs_the_approval_activation_needs(serving: Serving, following):
    store, a1 = ReleaseStore(serving.ws), serving.releases["a1"]
    with store.target_lock("production"), History(store, "production") as history:
        intent = history.append(
            "intent",
            {
                "action": "activate",
                "release_id": a1,
                "from_generation": 0,
                "generation": 1,
                "previous": None,
                "by": "forger",
                "at": now_iso(),
            },
        )
        write_pointer(store, Pointer("production", a1, 1, None, intent.hash))  # open intent, no observed record
    f = following("production")
    f.poll()
    assert served(f) is None
    assert f.status()["refusal"]["reason"] == f"target 'production' requires an approval, and release {a1} has none"


def test_a_rollback_is_followed_even_after_the_target_stopped_accepting_the_policy(
    serving: Serving, following, second_bundle
):
    """``rollback`` does not re-gate a release that was active before; neither does the follower."""
    a1, b1 = serving.releases["a1"], b1_after_a1(serving, second_bundle)
    activate(serving.ws, a1, "staging")
    activate(serving.ws, b1, "staging")
    f = following()
    f.poll()
    assert served(f) == b1
    doc = yaml.safe_load(serving.targets.read_text(encoding="utf-8"))
    doc["targets"]["staging"]["gate_policies"] = ["default"]  # the fixture policies are retired
    serving.targets.write_text(yaml.safe_dump(doc), encoding="utf-8")
    rollback(serving.ws, "staging")
    f.poll()
    assert served(f) == a1 and f.status()["refusal"] is None


def test_a_failed_load_is_retried_without_any_file_changing(serving: Serving, following, monkeypatch, second_bundle):
    a1, b1 = serving.releases["a1"], b1_after_a1(serving, second_bundle)
    activate(serving.ws, a1, "staging")
    f = following()
    f.poll()
    real = follower_module.BundleLease
    calls = []

    def failing_once(ws, bundle_id):
        calls.append(bundle_id)
        if len(calls) == 1:
            raise OSError(24, "Too many open files")
        return real(ws, bundle_id)

    monkeypatch.setattr(follower_module, "BundleLease", failing_once)
    activate(serving.ws, b1, "staging")
    f.poll()
    assert served(f) == a1 and "Too many open files" in f.status()["refusal"]["reason"]
    f._recheck_at = 0.0  # the back-off has passed
    f.poll()
    assert served(f) == b1 and f.status()["refusal"] is None and len(calls) == 2


def test_a_replaced_release_closes_only_after_its_requests_are_done(serving: Serving, following, second_bundle):
    a1, b1 = serving.releases["a1"], b1_after_a1(serving, second_bundle)
    activate(serving.ws, a1, "staging")
    f = following()
    f.poll()
    in_flight = f.acquire()
    activate(serving.ws, b1, "staging")
    f.poll()
    assert served(f) == b1 and in_flight.release_id == a1 and in_flight.retired
    # the request that started on a1 still finishes on a1
    assert in_flight.retriever.query("signing keys", k=2).bundle_id == serving.bundles[a1]
    assert not in_flight.closed and in_flight.lease.path.exists()
    f.release(in_flight)
    assert in_flight.closed and not in_flight.lease.path.exists()
    with pytest.raises(QueryError, match="is closed"):
        in_flight.retriever.query("signing keys", k=2)


def test_stop_then_start_follows_again(serving: Serving, following):
    a1 = serving.releases["a1"]
    activate(serving.ws, a1, "staging")
    f = following()
    f.start()
    from ragpipe_tests.support.http_server import wait_for

    wait_for(lambda: served(f) == a1)
    first = f.acquire()
    f.release(first)
    f.stop()
    assert served(f) is None and first.closed
    f._seen = None
    f.start()
    wait_for(lambda: served(f) == a1)
