"""Run one step over many items: cache first, then admission, retries and a commit per batch.

The one path for expensive work (model generation and embedding):

1. Items are de-duplicated by key — equal keys within a run are computed once.
2. Every key is looked up in the step's store *before* anything is admitted; hits cost nothing.
3. Misses, in key order, form batches of ``policy.batch_size``; up to ``policy.concurrency``
   batches run at once. A batch takes the leases of its keys (``ragpipe.work.leases``: another
   run computing one of them makes this one wait) and looks them up again, so a key a concurrent
   run committed meanwhile is read, not recomputed.
4. Each attempt is admitted by the budget (its worst-case cost must still fit, or admission stops
   for good) and by the rate limiter, then computed. Successes are committed to the store at once —
   a batch at a time, atomically — so a killed run keeps every finished batch.
5. A failed item is retried if its kind is in ``policy.retry_on`` and attempts remain, after a
   backoff (the server's ``Retry-After`` when it sent one, which also pauses every other thread);
   otherwise it ends as an ``ItemFailure`` in the report — never as a value.

``run_step`` returns the values of every key that has one and a ``StepReport`` with the counts and
usage; a budget stop raises ``BudgetExhausted`` once the admitted calls have finished.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ragpipe.work.admission import Budget, RateLimiter, backoff
from ragpipe.work.failures import BudgetExhausted, BudgetUnenforceable, ItemFailure, StepFailure
from ragpipe.work.leases import KeyLeases
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.usage import Usage, UsageTotals

log = logging.getLogger(__name__)
I = TypeVar("I")  # noqa: E741 - the input type
V = TypeVar("V")


@dataclass(frozen=True)
class Done(Generic[V]):
    """One item's value, and what its call cost (None for work that is not a priced call)."""

    value: V
    usage: Usage | None = None


class Step(Protocol[I, V]):
    """One kind of expensive work. ``compute`` makes one call for a batch and returns one outcome
    per input, in order (raising ``StepFailure`` fails the whole batch); ``worst_cost`` bounds
    the micros one attempt at the batch can cost (None: unknown). A step may name the setting of
    its budget as ``budget_setting`` (a budget stop's message says to raise it)."""

    name: str

    def compute(self, inputs: list[I]) -> list[Done[V] | StepFailure]: ...

    def worst_cost(self, inputs: list[I]) -> int | None: ...


class EntryStore(Protocol[V]):
    """Where a step's values are cached. ``lookup`` finds any committed key; ``lookup_new`` may
    skip entries this store object has already read (a cheap re-check under a lease)."""

    def lookup(self, keys: set[str]) -> dict[str, V]: ...

    def lookup_new(self, keys: set[str]) -> dict[str, V]: ...

    def commit(self, entries: list[tuple[str, V]]) -> None: ...


@dataclass(frozen=True)
class StepReport:
    step: str
    items: int  # items asked for, duplicates included
    unique: int
    cache_hits: int  # found before admission
    waited_hits: int  # committed by a concurrent run while this one waited for the key's lease
    computed: int  # computed and committed by this run
    failures: tuple[ItemFailure, ...]
    not_admitted: int  # left out by a budget stop
    attempts: int
    retries: dict[str, int]  # retried attempts by failure kind
    usage: UsageTotals

    def failure_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(f.kind for f in self.failures).items()))


@dataclass
class _Tally:
    values: dict[str, Any]
    waited_hits: int = 0
    computed: int = 0
    attempts: int = 0
    not_admitted: int = 0
    failures: list[ItemFailure] = field(default_factory=list)
    retries: Counter = field(default_factory=Counter)
    usage: UsageTotals = UsageTotals()
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_step(
    step: Step[I, V],
    items: Sequence[tuple[str, I]],
    store: EntryStore[V],
    policy: ExecutionPolicy,
    *,
    leases: KeyLeases | None = None,
    budget: Budget | None = None,
    progress: Callable[[int, int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[dict[str, V], StepReport]:
    """Values for every key of ``items`` that has one, and the report (module docstring).

    ``budget`` lets several steps of one run share one budget (default: ``policy.budget_micros``
    for this step alone)."""
    inputs: dict[str, I] = {}
    for key, value in items:
        inputs.setdefault(key, value)
    values = store.lookup(set(inputs))
    hits = len(values)
    misses = sorted(k for k in inputs if k not in values)
    batches = [misses[i : i + policy.batch_size] for i in range(0, len(misses), policy.batch_size)]
    tally = _Tally(values=dict(values))
    budget = budget if budget is not None else Budget(policy.budget_micros)
    limiter, stop = RateLimiter(policy.requests_per_minute, clock, sleep), threading.Event()
    done = [0]

    def run(batch: list[str]) -> None:
        try:
            _run_batch(step, batch, inputs, store, policy, leases, budget, limiter, stop, tally, sleep)
        except BaseException:
            stop.set()  # a bug or a refusal: admit nothing more
            raise
        if progress is not None:
            with tally.lock:
                done[0] += len(batch)
                count = done[0]
            progress(count, len(misses))

    if batches and progress is not None:
        progress(0, len(misses))
    if policy.concurrency == 1 or len(batches) <= 1:
        for batch in batches:
            run(batch)
    else:
        with ThreadPoolExecutor(max_workers=policy.concurrency, thread_name_prefix=f"step-{step.name}") as pool:
            for future in [pool.submit(run, b) for b in batches]:
                future.result()
    report = StepReport(
        step=step.name,
        items=len(items),
        unique=len(inputs),
        cache_hits=hits,
        waited_hits=tally.waited_hits,
        computed=tally.computed,
        failures=tuple(sorted(tally.failures, key=lambda f: f.key)),
        not_admitted=tally.not_admitted,
        attempts=tally.attempts,
        retries=dict(sorted(tally.retries.items())),
        usage=tally.usage,
    )
    if report.not_admitted:
        setting = getattr(step, "budget_setting", "execution.generation.budget_micros")  # where to raise it
        raise BudgetExhausted(step.name, budget.limit or 0, budget.spent, report.usage, report.not_admitted, setting)
    return tally.values, report


# Failures whose request may have reached the provider and been billed without a usage report:
# the budget charges them their worst case (a 429 or a refusal is not billed).
_UNMETERED = ("timeout", "server_error")


def _charged(outcomes: list, worst: int, usages: dict[int, Usage], step: str) -> int:
    """What an attempt costs the budget: the calls' reported cost, or the worst case for an
    attempt that failed in a way a provider may still bill (``_UNMETERED``) or reported no price."""
    if any(isinstance(o, StepFailure) and o.usage is None and o.kind in _UNMETERED for o in outcomes):
        return worst
    if any(u.cost_micros is None for u in usages.values()):
        return worst
    actual = sum(u.cost_micros or 0 for u in usages.values())
    if actual > worst:
        log.warning("%s: an attempt cost %d micros, above its estimated worst case %d", step, actual, worst)
    return actual


def _run_batch(step, batch, inputs, store, policy, leases, budget, limiter, stop, tally, sleep) -> None:
    if stop.is_set():
        with tally.lock:
            tally.not_admitted += len(batch)
        return
    with leases.hold(batch) if leases is not None else nullcontext():
        fresh = store.lookup_new(set(batch)) if leases is not None else {}
        with tally.lock:
            tally.values.update(fresh)
            tally.waited_hits += len(fresh)
        pending = [k for k in batch if k not in fresh]
        attempt = 0
        while pending:
            attempt += 1
            batch_inputs = [inputs[k] for k in pending]
            worst = step.worst_cost(batch_inputs)
            if worst is None and budget.limit is not None:  # the budget in force: the policy's or a shared one
                raise BudgetUnenforceable(
                    f"{step.name}: a budget is set but the cost of a call is unknown (the model has no price "
                    "in the price table, ragpipe/specs/prices.yaml or $RAGPIPE_PRICES)"
                )
            if stop.is_set() or not budget.reserve(worst or 0):
                stop.set()
                with tally.lock:
                    tally.not_admitted += len(pending)
                return
            limiter.wait_turn()
            try:
                outcomes = step.compute(batch_inputs)
            except StepFailure as failure:
                outcomes = [failure] * len(pending)
            if len(outcomes) != len(pending):
                raise RuntimeError(f"{step.name}: {len(outcomes)} outcomes for {len(pending)} inputs")
            usages = {id(o.usage): o.usage for o in outcomes if o.usage is not None}
            budget.settle(worst or 0, _charged(outcomes, worst or 0, usages, step.name))
            committed = [(k, o.value) for k, o in zip(pending, outcomes) if isinstance(o, Done)]
            if committed:
                store.commit(committed)
            retry, final = [], []
            for key, outcome in zip(pending, outcomes):
                if isinstance(outcome, StepFailure):
                    if outcome.kind in policy.retry_on and attempt < policy.max_attempts:
                        retry.append((key, outcome))
                    else:
                        final.append(
                            ItemFailure(key, outcome.kind, outcome.detail, outcome.message, attempt, outcome.evidence)
                        )
            with tally.lock:
                tally.attempts += 1
                tally.values.update(committed)
                tally.computed += len(committed)
                tally.failures += final
                tally.retries.update(f.kind for _, f in retry)
                for usage in usages.values():
                    tally.usage = tally.usage.add(usage)
            if retry:
                waits = [f.retry_after for _, f in retry if f.retry_after is not None]
                server_wish = max(waits) if waits else None
                pause = backoff(attempt, policy.backoff_seconds, policy.max_backoff_seconds, server_wish)
                if server_wish is not None:
                    limiter.pause(pause)  # the server asked everyone to wait, not only this thread
                sleep(pause)
            pending = [k for k, _ in retry]
