"""The pure reducer: ledger events -> evaluation run state (no I/O, no clock).

``apply(state, kind, payload)`` returns a new ``RunState`` or raises ``TransitionError``; the
ledger calls it *before* writing, so a refused event never reaches the disk, and ``reduce``
replays a ledger the same way. Laws (tested with hypothesis): replaying a prefix then the rest
equals replaying the whole; a cell is terminal at most once and its terminal record never changes;
``RunCompleted`` needs every expected cell terminal; after ``RunCompleted`` / ``RunFailed`` every
event is refused.

Events (payload keys): ``RunCreated`` {run_id, spec_id, cells: [{case, repeat, arm}], ...}
first and once; ``InputBound`` {name, digest, ...} before any cell starts, one per name;
``CellStarted`` {cell}; ``CellCompleted`` {cell, outcome: success|abstained, ...};
``CellFailed`` {cell, outcome: failure|cancelled, error}; ``RunCompleted`` {...}; ``RunFailed``
{reason}. A cell may be started again after a crash (resume) until it is terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

CellKey = tuple[str, int, str]  # (case ID, repeat, arm)
KINDS = ("RunCreated", "InputBound", "CellStarted", "CellCompleted", "CellFailed", "RunCompleted", "RunFailed")
COMPLETED_OUTCOMES = ("success", "abstained")
FAILED_OUTCOMES = ("failure", "cancelled")


class TransitionError(ValueError):
    """An event the run's current state does not allow; the message states the rule."""


@dataclass(frozen=True)
class RunState:
    status: str = "empty"  # empty -> created -> running -> completed | failed
    run_id: str | None = None
    spec_id: str | None = None
    created: Mapping[str, Any] = field(default_factory=dict)
    expected: tuple[CellKey, ...] = ()
    expected_set: frozenset[CellKey] = frozenset()  # ``expected`` as a set: one look-up per event, not a set per event
    inputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    starts: Mapping[CellKey, int] = field(default_factory=dict)
    terminal: Mapping[CellKey, Mapping[str, Any]] = field(default_factory=dict)
    outcome: Mapping[str, Any] | None = None
    events: int = 0

    @property
    def is_terminal(self) -> bool:
        return self.status in ("completed", "failed")

    def missing(self) -> tuple[CellKey, ...]:
        """Expected cells that are not terminal, in expected order (what a resume runs)."""
        return tuple(c for c in self.expected if c not in self.terminal)


def initial_state() -> RunState:
    return RunState()


def cell_key(raw: object) -> CellKey:
    """``{case, repeat, arm}`` -> key, refusing anything else."""
    if not isinstance(raw, Mapping) or set(raw) != {"case", "repeat", "arm"}:
        raise TransitionError("cell must be an object with exactly case, repeat, arm")
    case, repeat, arm = raw["case"], raw["repeat"], raw["arm"]
    if (
        not isinstance(case, str)
        or not isinstance(arm, str)
        or isinstance(repeat, bool)
        or not isinstance(repeat, int)
        or repeat < 0
    ):
        raise TransitionError("cell: case and arm must be strings, repeat an integer >= 0")
    return (case, repeat, arm)


def cell_dict(key: CellKey) -> dict[str, Any]:
    return {"case": key[0], "repeat": key[1], "arm": key[2]}


def describe(key: CellKey) -> str:
    return f"cell ({key[0]!r}, {key[1]}, {key[2]!r})"


def _created(state: RunState, payload: Mapping[str, Any]) -> RunState:
    if state.status != "empty":
        raise TransitionError("RunCreated must be the first record and appear once")
    run_id, spec_id, cells = payload.get("run_id"), payload.get("spec_id"), payload.get("cells")
    if not isinstance(run_id, str) or not isinstance(spec_id, str) or not isinstance(cells, list):
        raise TransitionError("RunCreated needs run_id, spec_id (strings) and cells (a list)")
    expected = tuple(cell_key(c) for c in cells)
    if len(set(expected)) != len(expected):
        raise TransitionError("RunCreated lists a cell twice")
    return replace(
        state,
        status="created",
        run_id=run_id,
        spec_id=spec_id,
        created=dict(payload),
        expected=expected,
        expected_set=frozenset(expected),
    )


def _bound(state: RunState, payload: Mapping[str, Any]) -> RunState:
    if state.status != "created":
        raise TransitionError("InputBound is allowed only after RunCreated and before the first cell starts")
    name = payload.get("name")
    if not isinstance(name, str) or not isinstance(payload.get("digest"), str):
        raise TransitionError("InputBound needs name and digest (strings)")
    if name in state.inputs:
        raise TransitionError(f"input {name!r} is already bound")
    return replace(state, inputs={**state.inputs, name: dict(payload)})


def _open_cell(state: RunState, payload: Mapping[str, Any], kind: str) -> CellKey:
    if state.status not in ("created", "running"):
        raise TransitionError(f"{kind} needs a created, non-terminal run")
    key = cell_key(payload.get("cell"))
    if key not in state.expected_set:
        raise TransitionError(f"{kind}: {describe(key)} is not an expected cell of this run")
    if key in state.terminal:
        raise TransitionError(f"{kind}: {describe(key)} is already terminal")
    return key


def _started(state: RunState, payload: Mapping[str, Any]) -> RunState:
    key = _open_cell(state, payload, "CellStarted")
    return replace(state, status="running", starts={**state.starts, key: state.starts.get(key, 0) + 1})


def _finished(state: RunState, payload: Mapping[str, Any], kind: str, outcomes: tuple[str, ...]) -> RunState:
    key = _open_cell(state, payload, kind)
    if not state.starts.get(key):
        raise TransitionError(f"{kind}: {describe(key)} was never started")
    if payload.get("outcome") not in outcomes:
        raise TransitionError(f"{kind}: outcome must be one of {', '.join(outcomes)}")
    return replace(state, terminal={**state.terminal, key: dict(payload)})


def _run_completed(state: RunState, payload: Mapping[str, Any]) -> RunState:
    if state.status not in ("created", "running"):
        raise TransitionError("RunCompleted needs a created, non-terminal run")
    missing = state.missing()
    if missing:
        raise TransitionError(
            f"RunCompleted with {len(missing)} expected cells not terminal (first: {describe(missing[0])})"
        )
    return replace(state, status="completed", outcome=dict(payload))


def _run_failed(state: RunState, payload: Mapping[str, Any]) -> RunState:
    if state.status not in ("created", "running"):
        raise TransitionError("RunFailed needs a created, non-terminal run")
    if not isinstance(payload.get("reason"), str):
        raise TransitionError("RunFailed needs a reason (string)")
    return replace(state, status="failed", outcome=dict(payload))


def apply(state: RunState, kind: str, payload: Mapping[str, Any]) -> RunState:
    """The state after one event, or ``TransitionError`` (module docstring)."""
    if state.is_terminal:
        raise TransitionError(
            f"the run is {state.status}: no record may follow {'RunCompleted' if state.status == 'completed' else 'RunFailed'}"
        )
    if not isinstance(payload, Mapping):
        raise TransitionError(f"{kind}: payload must be an object")
    if kind == "RunCreated":
        new = _created(state, payload)
    elif state.status == "empty":
        raise TransitionError(f"{kind} before RunCreated")
    elif kind == "InputBound":
        new = _bound(state, payload)
    elif kind == "CellStarted":
        new = _started(state, payload)
    elif kind == "CellCompleted":
        new = _finished(state, payload, kind, COMPLETED_OUTCOMES)
    elif kind == "CellFailed":
        new = _finished(state, payload, kind, FAILED_OUTCOMES)
    elif kind == "RunCompleted":
        new = _run_completed(state, payload)
    elif kind == "RunFailed":
        new = _run_failed(state, payload)
    else:
        raise TransitionError(f"unknown record kind {kind!r} (one of {', '.join(KINDS)})")
    return replace(new, events=state.events + 1)


def reduce(events: Iterable[tuple[str, Mapping[str, Any]]], state: RunState | None = None) -> RunState:
    """Fold ``(kind, payload)`` events from ``state`` (default: the empty run)."""
    state = state or initial_state()
    for kind, payload in events:
        state = apply(state, kind, payload)
    return state
