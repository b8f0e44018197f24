"""The server follows the target's pointer: hot swaps under load, refusals, garbage-collection roots."""

from __future__ import annotations

import shutil
import threading
import time

import httpx

from ragpipe.gc import collect_garbage
from ragpipe.release.activation import activate
from ragpipe.release.pointer import Pointer, write_pointer
from ragpipe.release.rollback import rollback
from ragpipe.release.store import ReleaseStore
from ragpipe.server.app import app_from
from ragpipe_tests.support.http_server import release_of, running, wait_for
from ragpipe_tests.support.release_fixtures import bundle_of, forge_activation
from ragpipe_tests.support.serving import Serving, b1_after_a1, config_for, refresh_of

CLIENTS, RESPONSES_PER_RELEASE = 4, 30


def server(serving: Serving, **config):
    return running(app_from(serving.ws.home, config_for(serving, **config), "staging", serving.targets))


def test_hot_swap_under_load(serving: Serving, built_workspace, second_bundle):
    """4 clients while staging is activated twice and rolled back once (each release serving 30
    requests started after its swap before the next move): no failed request;
    each response's release was active at some point of its lifetime and its bundle is that
    release's; once a swap is complete, every response started after it carries the new ID.
    Each activated release is gated against the one live when it is activated: a1 (bootstrap),
    b1 against a1, a2 against b1."""
    a1 = serving.releases["a1"]
    b1 = b1_after_a1(serving, second_bundle)
    a2 = refresh_of(serving, bundle_of(built_workspace), "r3", b1)
    activate(serving.ws, a1, "staging")
    responses: list[tuple[float, float, int, str | None, str | None, str | None]] = []
    stop = threading.Event()

    def client(base: str, key: str) -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            while not stop.is_set():
                started = time.monotonic()
                r = http.post("/v1/query", json={"query": "signing keys rotation", "k": 5})
                body = r.json() if r.status_code == 200 else {}
                responses.append(
                    (
                        started,
                        time.monotonic(),
                        r.status_code,
                        r.headers.get("x-release-id"),
                        body.get("release_id"),
                        body.get("bundle_id"),
                    )
                )

    # (release, moved: when the pointer moved, swapped: when /v1/release showed it)
    timeline: list[tuple[str, float, float]] = []
    with server(serving, limits={"requests_per_minute": 0}) as base:
        wait_for(lambda: release_of(base) == a1)
        timeline.append((a1, time.monotonic(), time.monotonic()))
        threads = [
            threading.Thread(target=client, args=(base, serving.keys[s])) for s in ("alice", "bob") * (CLIENTS // 2)
        ]
        for t in threads:
            t.start()

        def served_since_last_swap() -> bool:
            # conditions, not clock windows: each release serves RESPONSES_PER_RELEASE requests that
            # started after its swap completed, however slow the machine is
            swapped = timeline[-1][2]
            return sum(1 for r in list(responses) if r[0] > swapped) >= RESPONSES_PER_RELEASE

        for move, expected in (
            (lambda: activate(serving.ws, b1, "staging"), b1),
            (lambda: activate(serving.ws, a2, "staging"), a2),
            (lambda: rollback(serving.ws, "staging"), b1),
        ):
            wait_for(served_since_last_swap, timeout=300, interval=0.01)
            moved = time.monotonic()
            move()
            wait_for(lambda expected=expected: release_of(base) == expected, timeout=30, interval=0.01)
            timeline.append((expected, moved, time.monotonic()))
        wait_for(served_since_last_swap, timeout=300, interval=0.01)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        status = httpx.get(f"{base}/v1/release").json()
    assert (status["swaps"], status["refused_swaps"]) == (4, 0)  # a1, b1, a2, back to b1: nothing refused
    assert len(responses) >= 4 * RESPONSES_PER_RELEASE
    assert [r for r in responses if r[2] != 200] == []  # zero failed requests
    for started, ended, _, header, release, bundle in responses:
        assert header == release and bundle == serving.bundles[release]  # one release per response
        # active during its lifetime: from the pointer move that made it active to the swap that replaced it
        lifetimes = [
            (moved, timeline[i + 1][2] if i + 1 < len(timeline) else float("inf"))
            for i, (rid, moved, _) in enumerate(timeline)
            if rid == release
        ]
        assert any(begin_ <= ended and started <= end_ for begin_, end_ in lifetimes), (release, started, ended)
    for i, (rid, _, swapped) in enumerate(timeline[1:], start=1):
        next_move = timeline[i + 1][1] if i + 1 < len(timeline) else float("inf")
        after = {r[4] for r in responses if swapped < r[0] and r[1] < next_move}
        assert after == {rid}, (i, after)


def test_a_pointer_moved_by_hand_is_refused_and_the_last_good_release_keeps_serving(serving: Serving):
    a1, b1 = serving.releases["a1"], serving.releases["b1"]
    activate(serving.ws, a1, "staging")
    store = ReleaseStore(serving.ws)
    with server(serving) as base:
        wait_for(lambda: release_of(base) == a1)
        head = store.pointer_path("staging").read_bytes()
        # a pointer edited by hand: it names b1 at the next generation, no history record says so
        write_pointer(store, Pointer("staging", b1, 2, a1, "sha256:" + "0" * 64))
        status = wait_for(
            lambda: httpx.get(f"{base}/v1/release").json()["refusal"] and httpx.get(f"{base}/v1/release").json()
        )
        ready = httpx.get(f"{base}/readyz")
        metrics = httpx.get(f"{base}/metrics").text
    assert status["release"]["release_id"] == a1 and ready.status_code == 200
    assert status["refusal"]["reason"] == (
        f"target 'staging': the pointer names release {b1} at generation 2, but the history has {a1} at generation 1: "
        "the pointer was not moved by activation or rollback; refusing to serve it"
    )
    assert 'ragpipe_release_swaps_refused_total{target="staging"} 1.0' in metrics
    assert head != store.pointer_path("staging").read_bytes()


def test_an_ineligible_release_is_refused_even_with_a_forged_agreeing_history(serving: Serving):
    from ragpipe_tests.support.release_fixtures import (
        bundle_of,  # noqa: F401  (the bundle is already in ws)
        publish,
    )

    a1 = serving.releases["a1"]
    bundle = serving.ws.bundles / serving.bundles[a1].removeprefix("sha256:")
    ineligible = publish(serving.ws, bundle, "r9", eligible=False, phase="hard")
    activate(serving.ws, a1, "staging")
    with server(serving) as base:
        wait_for(lambda: release_of(base) == a1)
        forge_activation(serving.ws, ineligible)
        status = wait_for(lambda: (s := httpx.get(f"{base}/v1/release").json())["refusal"] and s)
    assert status["release"]["release_id"] == a1
    assert status["refusal"]["reason"].startswith(
        f"target 'staging': release {ineligible} is not eligible for activation (gate decision "
    )


def test_a_release_altered_after_activation_is_refused(serving: Serving, second_bundle):
    """Rollback to a release whose bundle was altered after it was active: the rollback itself
    refuses, so the alteration is forged onto the pointer directly; the server refuses it too; and a
    server started on a target whose active release was altered is not ready, saying why."""
    a1, b1 = serving.releases["a1"], b1_after_a1(serving, second_bundle)  # b1 gated against a1: it replaces a1
    activate(serving.ws, a1, "staging")
    activate(serving.ws, b1, "staging")
    bundle_a = serving.ws.bundles / serving.bundles[a1].removeprefix("sha256:")
    chunks = bundle_a / "chunks.parquet"
    with server(serving) as base:
        wait_for(lambda: release_of(base) == b1)
        data = bytearray(chunks.read_bytes())
        data[len(data) // 2] ^= 0x01
        chunks.write_bytes(bytes(data))
        forge_activation(serving.ws, a1)
        status = wait_for(lambda: (s := httpx.get(f"{base}/v1/release").json())["refusal"] and s)
    assert status["release"]["release_id"] == b1
    reason = status["refusal"]["reason"]
    assert reason.startswith(f"target 'staging': release {a1} failed verification: bundle {serving.bundles[a1]}: ")
    assert "chunks.parquet" in reason
    with server(serving) as base:
        ready = wait_for(lambda: (r := httpx.get(f"{base}/readyz")).json().get("status", {}).get("refusal") and r)
    assert ready.status_code == 503 and ready.json()["code"] == "not_ready"
    assert ready.json()["message"] == reason


def test_a_served_bundle_is_a_garbage_collection_root(serving: Serving):
    """gc without any release roots (as a caller that forgets them) keeps the bundle a running
    server holds a lease on, and removes it once the server has stopped."""
    b1 = serving.releases["b1"]
    activate(serving.ws, b1, "staging")
    served = serving.ws.bundles / serving.bundles[b1].removeprefix("sha256:")
    with server(serving) as base:
        wait_for(lambda: release_of(base) == b1)
        report = collect_garbage(serving.ws)
        assert served.is_dir() and f"bundles/{served.name}" not in {r.path for r in report.removed}
        assert (
            httpx.post(
                f"{base}/v1/query",
                json={"query": "rollback note"},
                headers={"Authorization": f"Bearer {serving.keys['alice']}"},
            ).status_code
            == 200
        )
    report = collect_garbage(serving.ws)
    assert f"bundles/{served.name}" in {r.path for r in report.removed} and not served.exists()
    shutil.rmtree(serving.ws.home / "leases", ignore_errors=True)
