"""The target pointer: canonical file, compare-and-swap, and ≥ 8 racing activating processes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragpipe.kernel.workspace import Workspace
from ragpipe.release.history import read_history
from ragpipe.release.pointer import Pointer, check_generation, parse_pointer, pointer_bytes, read_pointer, write_pointer
from ragpipe.release.recovery import recover_target
from ragpipe.release.store import ConflictError, ReleaseError, ReleaseStore
from ragpipe_tests.support.release_fixtures import bundle_of, fresh_ws, publish, race

# Fixture releases are gated under fixture policies (release_fixtures.fixture_policy): the targets accept them.
pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")

A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_pointer_file_is_canonical_and_replaced_atomically(tmp_path: Path):
    store = ReleaseStore(Workspace(tmp_path))
    assert read_pointer(store, "staging") is None
    (store.target_dir("staging")).mkdir(parents=True)
    stale = store.target_dir("staging") / ".tmp-pointer.json-999999999-dead"
    stale.write_bytes(b"half")
    steps: list[str] = []
    write_pointer(store, Pointer("staging", A, 1, None, B), on_step=steps.append)
    assert steps == ["pointer_temp_written", "pointer_temp_fsynced", "pointer_renamed", "pointer_dir_fsynced"]
    path = store.pointer_path("staging")
    assert path.read_bytes() == (
        b'{"generation":1,"ledger_head":"'
        + B.encode()
        + b'","previous":null,"release_id":"'
        + A.encode()
        + b'","schema":"ragpipe.release-pointer/v1","target":"staging"}\n'
    )
    assert read_pointer(store, "staging") == Pointer("staging", A, 1, None, B)
    assert sorted(p.name for p in path.parent.iterdir()) == ["pointer.json"]  # stale temp of a dead pid removed


@pytest.mark.parametrize(
    "data, problem",
    [
        (b"{", "pointer is not valid JSON"),
        (
            b'{"release_id": 1}',
            "not a ragpipe.release-pointer/v1 pointer (keys must be generation, ledger_head, previous, release_id, schema, target)",
        ),
        (
            pointer_bytes(Pointer("staging", A, 1, None, B), None).replace(b'"generation":1', b'"generation":0'),
            "generation must be an integer >= 1, not 0",
        ),
        (
            pointer_bytes(Pointer("staging", A, 1, None, B), None).replace(b'"previous":null', b'"previous":"x"'),
            "release_id, previous and ledger_head must be sha256:<64 hex> (previous may be null)",
        ),
        (pointer_bytes(Pointer("production", A, 1, None, B), None), "pointer names target 'production', not 'staging'"),
        (
            pointer_bytes(Pointer("staging", A, 1, None, B), None).replace(b"{", b"{ "),
            "bytes are not the canonical rendering of the pointer (edited by hand?)",
        ),
    ],
)
def test_malformed_pointer_refused(tmp_path: Path, data: bytes, problem: str):
    with pytest.raises(ReleaseError) as exc:
        parse_pointer(tmp_path / "pointer.json", data, "staging")
    assert str(exc.value) == f"{tmp_path / 'pointer.json'}: {problem}"


def test_compare_and_swap_refuses_a_moved_generation(tmp_path: Path):
    store = ReleaseStore(Workspace(tmp_path))
    assert check_generation(store, "staging", 0) is None
    write_pointer(store, Pointer("staging", A, 1, None, B))
    assert check_generation(store, "staging", 1) == Pointer("staging", A, 1, None, B)
    with pytest.raises(ConflictError) as exc:
        check_generation(store, "staging", 0)
    assert str(exc.value) == (
        "target 'staging': pointer is at generation 1, expected 0 (another activation or rollback changed it first); nothing was changed"
    )


RACER = """
import json, sys, time
from pathlib import Path
from ragpipe.release.activation import activate
from ragpipe.release.manifest import load_manifest
from ragpipe.release.pointer import current_generation, read_pointer
from ragpipe.release.store import ConflictError, ReleaseError, ReleaseStore
from ragpipe.kernel.workspace import Workspace

ws, rid, ready, go = Workspace(Path(sys.argv[1])), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
store = ReleaseStore(ws)
incumbent = load_manifest(store, rid).gate.incumbent
generation = current_generation(store, "staging")  # every racer decides at generation 0
ready.touch()
while not go.exists():  # a start line: wait on the condition, not a fixed sleep
    time.sleep(0.002)
conflicts, refusals = [], []
while True:
    try:
        result = activate(ws, rid, "staging", expected_generation=generation, by=ready.name)
        break
    except ConflictError as exc:
        conflicts.append([generation, str(exc)])
        generation = current_generation(store, "staging")
    except ReleaseError as exc:  # gated against a release not live yet: wait for it, still deciding at the same generation
        refusals.append(str(exc))
        while (pointer := read_pointer(store, "staging")) is None or pointer.release_id != incumbent:
            time.sleep(0.002)
print(json.dumps({"release_id": rid, "generation": result.generation, "previous": result.previous, "conflicts": conflicts, "refusals": refusals}))
"""
CONFLICT = re.compile(
    r"^target 'staging': pointer is at generation (\d+), expected (\d+) \(another activation or rollback changed it first\); nothing was changed$"
)


def test_racing_activations_one_generation_per_swap(built_workspace, tmp_path: Path):
    n = 8
    bundle = bundle_of(built_workspace)
    ws = fresh_ws(tmp_path, bundle)
    # Each release is gated against the one before it (the first: bootstrap), so each activates only
    # where its predecessor is live: the racers contend for the lock at once, and a racer whose
    # predecessor is not live yet is refused and waits for it, still deciding at generation 0.
    releases = [publish(ws, bundle, revision="r0")]
    for i in range(1, n):
        releases.append(publish(ws, bundle, revision=f"r{i}", against=releases[-1]))
    results = race(RACER, tmp_path, [[str(ws.home), rid] for rid in releases])
    # exactly one generation per swap: 1..n, one winner each
    assert sorted(r["generation"] for r in results) == list(range(1, n + 1))
    by_generation = {r["generation"]: r for r in results}
    assert [by_generation[g]["previous"] for g in range(1, n + 1)] == [None] + [
        by_generation[g]["release_id"] for g in range(1, n)
    ]
    # everyone decided at generation 0, so only the first winner saw no conflict; every loser got the clear error
    assert [len(r["conflicts"]) == 0 for r in results].count(True) == 1
    for r in results:
        for expected, message in r["conflicts"]:
            found, said = map(int, CONFLICT.match(message).groups())
            assert said == expected and found > expected
    assert sum(len(r["conflicts"]) for r in results) >= n - 1
    for r in results:  # the only other refusal: its predecessor was not live yet
        previous = releases[releases.index(r["release_id"]) - 1]
        for message in r["refusals"]:
            assert message.startswith(
                f"release {r['release_id']} was gated against release {previous}, but target 'staging' "
            )
    # history complete: one intent and one observed record per swap, no lost update
    state, records = read_history(ReleaseStore(ws), "staging")
    assert [r.kind for r in records] == ["intent", "observed"] * n
    assert [r.payload["generation"] for r in records if r.kind == "intent"] == list(range(1, n + 1))
    assert [(g, rid) for g, rid, _ in state.activations] == [
        (g, by_generation[g]["release_id"]) for g in range(1, n + 1)
    ]
    assert (state.generation, state.active) == (n, by_generation[n]["release_id"])
    pointer = read_pointer(ReleaseStore(ws), "staging")
    assert (pointer.generation, pointer.release_id, pointer.ledger_head) == (n, state.active, state.active_intent)
    assert recover_target(ws, "staging") is None  # pointer and ledger agree; nothing to settle
