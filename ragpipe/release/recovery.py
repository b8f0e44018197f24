"""Recovery of interrupted activations, and the agreement rule between pointer and history.

Every writer of a target (activate, rollback, approve) first runs ``settle`` under the target's
lock. An intent record without its observed record means a writer died (or failed) between the
two appends; the pointer says how far it got:

- the pointer names the intent's release at the intent's generation and carries the intent's hash
  as ``ledger_head`` → the swap happened: append ``observed`` ``active``;
- the pointer is still the one the intent started from → the swap never happened: append
  ``observed`` ``failed`` (the release did not go live; the previous one still serves);
- anything else → refuse, naming both files: something other than ragpipe changed one of them.

With no open intent, pointer and history must agree exactly (generation, release, ledger head);
a missing pointer with an active history, or a pointer with no history behind it, refuses.
"""

from __future__ import annotations

from ragpipe.kernel.ledger import Record
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.history import History, TargetHistory, now_iso
from ragpipe.release.pointer import Pointer, read_pointer
from ragpipe.release.store import ReleaseError, ReleaseStore

MOVED = "recovered: the pointer had been swapped before the writer stopped"
NOT_MOVED = "recovered: the writer stopped before the pointer swap; the pointer was not changed"


def _names(pointer: Pointer | None) -> tuple[int, str | None, str | None]:
    return (0, None, None) if pointer is None else (pointer.generation, pointer.release_id, pointer.ledger_head)


def check_agreement(store: ReleaseStore, target: str, state: TargetHistory, pointer: Pointer | None) -> None:
    """Refuse unless ``pointer`` is exactly what the history (with no open intent) says is active."""
    expected = (state.generation, state.active, state.active_intent)
    actual = _names(pointer)
    if actual != expected:
        raise ReleaseError(
            f"{store.pointer_path(target)}: pointer (generation {actual[0]}, release {actual[1]}) disagrees with "
            f"{store.history_path(target)} (generation {expected[0]}, release {expected[1]}); refusing to guess which is right"
        )


def settle(store: ReleaseStore, history: History, not_moved: tuple[str, str] = ("failed", NOT_MOVED)) -> Record | None:
    """Resolve an open intent from the pointer (module docstring); returns the appended record.
    ``not_moved`` is the (outcome, reason) recorded when the swap did not happen. Then check
    agreement. Caller holds the target's lock."""
    target, state = history.target, history.state
    pointer = read_pointer(store, target)
    appended = None
    intent = state.open_intent
    if intent is not None:
        p = intent.payload
        if _names(pointer) == (p["generation"], p["release_id"], intent.hash):
            outcome, reason = "active", MOVED
        elif _names(pointer) == (state.generation, state.active, state.active_intent):
            outcome, reason = not_moved
        else:
            gen, rid, _ = _names(pointer)
            raise ReleaseError(
                f"{store.pointer_path(target)}: pointer (generation {gen}, release {rid}) matches neither side of the "
                f"unresolved intent in {store.history_path(target)} record {intent.seq}; refusing to guess which is right"
            )
        appended = history.append(
            "observed",
            {
                "intent": intent.seq,
                "outcome": outcome,
                "release_id": p["release_id"],
                "generation": p["generation"],
                "reason": reason,
                "at": now_iso(),
            },
        )
    check_agreement(store, target, history.state, pointer)
    return appended


def recover_target(ws: Workspace, target: str) -> Record | None:
    """Take the target's lock, verify its history and settle an interrupted activation, if any.
    Returns the observed record appended, or None when there was nothing to resolve."""
    store = ReleaseStore(ws)
    with store.target_lock(target), History(store, target) as history:
        return settle(store, history)
