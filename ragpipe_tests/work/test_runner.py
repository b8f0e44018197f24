"""The step runner: cache before admission, one computation per key, typed retries, budget, leases."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.work.entries import JsonEntryStore
from ragpipe.work.failures import BudgetExhausted, BudgetUnenforceable, StepFailure
from ragpipe.work.keys import step_key
from ragpipe.work.leases import KeyLeases
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.runner import Done, run_step
from ragpipe.work.usage import Usage


def key(text: str) -> str:
    return step_key("upper", 1, {"text": text})


def usage(cost: int | None) -> Usage:
    return Usage(provider="test", model="m", input_tokens=3, output_tokens=2, latency_ms=1, cost_micros=cost)


class Upper:
    """Upper-cases its inputs; ``script[text]`` is a list of failures to raise first, in order."""

    name = "upper"

    def __init__(self, script=None, cost: int | None = 10, delay: float = 0.0):
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.calls: list[str] = []
        self.cost = cost
        self.delay = delay
        self.lock = threading.Lock()

    def compute(self, inputs):
        out = []
        for text in inputs:
            with self.lock:
                self.calls.append(text)
                planned = self.script.get(text)
                failure = planned.pop(0) if planned else None
            if self.delay:
                time.sleep(self.delay)
            out.append(failure if failure is not None else Done(text.upper(), usage(self.cost)))
        return out

    def worst_cost(self, inputs):
        return None if self.cost is None else self.cost * len(inputs)


def items(*texts: str):
    return [(key(t), t) for t in texts]


def store(tmp_path: Path) -> JsonEntryStore:
    return JsonEntryStore(tmp_path / "cache", "test cache")


NO_WAIT = ExecutionPolicy(backoff_seconds=0, max_backoff_seconds=0)


def test_equal_keys_are_computed_once_and_every_value_committed(tmp_path):
    step, cache = Upper(), store(tmp_path)
    values, report = run_step(step, items("a", "b", "a", "a"), cache, NO_WAIT)
    assert sorted(step.calls) == ["a", "b"]
    assert values == {key("a"): "A", key("b"): "B"}
    assert (report.items, report.unique, report.computed, report.cache_hits) == (4, 2, 2, 0)
    assert cache.lookup({key("a"), key("b")}) == values


def test_the_cache_is_read_before_anything_is_admitted(tmp_path):
    cache = store(tmp_path)
    cache.commit([(key("a"), "A")])
    step = Upper()
    # a zero budget admits nothing: a hit needs no admission
    values, report = run_step(step, items("a"), cache, ExecutionPolicy(budget_micros=0))
    assert step.calls == [] and values == {key("a"): "A"}
    assert (report.cache_hits, report.computed, report.usage.calls) == (1, 0, 0)


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_retryable_failures_are_retried_and_retry_after_pauses_every_attempt(tmp_path):
    clock = FakeClock()
    script = {
        "a": [StepFailure("rate_limited", "429", retry_after=7.0), StepFailure("server_error", "500")],
        "b": [StepFailure("timeout", "slow")],
    }
    step = Upper(script)
    started: list[tuple[str, float]] = []
    compute = step.compute
    step.compute = lambda inputs: (started.extend((t, clock.now) for t in inputs), compute(inputs))[1]
    policy = ExecutionPolicy(backoff_seconds=0.5, max_backoff_seconds=30)
    values, report = run_step(step, items("a", "b"), store(tmp_path), policy, clock=clock, sleep=clock.sleep)
    assert values == {key("a"): "A", key("b"): "B"}
    assert step.calls.count("a") == 3 and step.calls.count("b") == 2
    assert report.retries == {"rate_limited": 1, "server_error": 1, "timeout": 1}
    assert report.attempts == 5 and report.failures == ()
    # the 429's Retry-After (7 s) holds back every later attempt, of any item
    first_429 = next(t for text, t in started if text == "a")
    assert all(t >= first_429 + 7.0 for _, t in started[started.index(("a", first_429)) + 1 :])
    assert 7.0 in clock.slept and 1.0 in clock.slept  # a's second retry: 0.5 × 2


def test_retry_after_and_backoff_are_capped():
    from ragpipe.work.admission import backoff

    assert backoff(1, 0.5, 30, None) == 0.5 and backoff(3, 0.5, 30, None) == 2.0
    assert backoff(10, 0.5, 30, None) == 30 and backoff(1, 0.5, 30, 120.0) == 30 and backoff(1, 0.5, 30, 3.0) == 3.0


def test_attempts_end_at_max_attempts_and_non_retryable_kinds_at_once(tmp_path):
    script = {
        "a": [StepFailure("server_error", "boom")] * 5,
        "b": [StepFailure("client_error", "400 bad", detail="http_error:400")],
    }
    step = Upper(script)
    values, report = run_step(
        step, items("a", "b", "c"), store(tmp_path), ExecutionPolicy(max_attempts=3, backoff_seconds=0)
    )
    assert values == {key("c"): "C"}
    failures = {f.key: (f.kind, f.detail, f.attempts) for f in report.failures}
    assert failures == {key("a"): ("server_error", "server_error", 3), key("b"): ("client_error", "http_error:400", 1)}
    assert report.failure_counts() == {"client_error": 1, "server_error": 1}
    assert store(tmp_path).lookup({key("a"), key("b")}) == {}  # a failure is never a value


def test_an_invalid_output_is_retried_only_when_the_policy_says_so(tmp_path):
    bad = StepFailure("invalid_output", "3 questions for the 2 asked", evidence={"content": "x"})
    _, report = run_step(Upper({"a": [bad]}), items("a"), store(tmp_path), NO_WAIT)
    assert [(f.kind, f.attempts, f.evidence) for f in report.failures] == [("invalid_output", 1, {"content": "x"})]
    policy = NO_WAIT.model_copy(update={"retry_on": ("invalid_output",)})
    values, report = run_step(Upper({"a": [bad]}), items("a"), store(tmp_path / "2"), policy)
    assert values == {key("a"): "A"} and report.retries == {"invalid_output": 1}


def test_the_budget_stops_admission_before_it_is_exceeded_and_keeps_what_finished(tmp_path):
    cache, step = store(tmp_path), Upper(cost=10)
    texts = [f"t{i}" for i in range(6)]
    with pytest.raises(BudgetExhausted) as caught:
        run_step(step, items(*texts), cache, ExecutionPolicy(budget_micros=35))
    assert len(step.calls) == 3  # 3 × 10 fits 35; a fourth call's worst case would not
    assert caught.value.spent == 30 and caught.value.not_admitted == 3
    assert str(caught.value).startswith(
        "upper: budget of 35 micros reached: 30 micros spent, 3 calls by this step, 3 items not admitted"
    )
    assert len(cache.lookup({key(t) for t in texts})) == 3  # committed before the stop
    again = Upper(cost=10)
    values, report = run_step(again, items(*texts), cache, ExecutionPolicy(budget_micros=35))
    assert len(again.calls) == 3 and report.cache_hits == 3 and len(values) == 6


def test_a_failed_attempt_a_provider_may_bill_is_charged_its_worst_case(tmp_path):
    """A timeout or 5xx reports no usage but may have been billed: the budget counts it at its
    worst case, so retries of failing calls cannot spend past the budget."""
    step = Upper({f"t{i}": [StepFailure("timeout", "slow")] * 4 for i in range(10)}, cost=100)
    with pytest.raises(BudgetExhausted) as caught:
        run_step(
            step,
            items(*[f"t{i}" for i in range(10)]),
            store(tmp_path),
            ExecutionPolicy(budget_micros=150, backoff_seconds=0),
        )
    assert len(step.calls) == 1 and caught.value.spent == 100 <= 150
    # a 429 is not billed: it costs the budget nothing
    limited = Upper({"a": [StepFailure("rate_limited", "429")] * 3}, cost=100)
    values, _ = run_step(
        limited, items("a"), store(tmp_path / "2"), ExecutionPolicy(budget_micros=150, backoff_seconds=0)
    )
    assert values == {key("a"): "A"} and len(limited.calls) == 4


def test_concurrent_admission_never_spends_past_the_budget(tmp_path):
    step = Upper(cost=10, delay=0.01)
    with pytest.raises(BudgetExhausted) as caught:
        run_step(
            step,
            items(*[f"t{i}" for i in range(40)]),
            store(tmp_path),
            ExecutionPolicy(concurrency=4, budget_micros=95),
        )
    assert len(step.calls) == 9 and caught.value.spent == 90


def test_a_budget_with_an_unpriced_model_is_refused_before_any_call(tmp_path):
    step = Upper(cost=None)
    with pytest.raises(BudgetUnenforceable, match="cost of a call is unknown"):
        run_step(step, items("a"), store(tmp_path), ExecutionPolicy(budget_micros=100))
    assert step.calls == []
    values, report = run_step(Upper(cost=None), items("a"), store(tmp_path), ExecutionPolicy())
    assert report.usage.unpriced_calls == 1 and not report.usage.cost_known


def test_concurrent_runs_never_compute_one_key_twice(tmp_path):
    """Two runs (threads with their own store objects, as two processes would have) over
    overlapping keys, each 4-way concurrent, with a slow step: every key is computed once."""
    texts = [f"t{i}" for i in range(24)]
    step = Upper(delay=0.02)
    policy = ExecutionPolicy(concurrency=4)
    reports = []

    def run(part):
        _, report = run_step(step, items(*part), store(tmp_path), policy, leases=KeyLeases(tmp_path / "leases"))
        reports.append(report)

    threads = [threading.Thread(target=run, args=(texts[:18],)), threading.Thread(target=run, args=(texts[6:],))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert sorted(step.calls) == sorted(texts)
    assert sum(r.computed for r in reports) == 24
    assert sum(r.computed + r.cache_hits + r.waited_hits for r in reports) == 36


@settings(max_examples=40, deadline=None)
@given(
    texts=st.lists(st.sampled_from("abcdefgh"), max_size=20),
    broken=st.sets(st.sampled_from("abcdefgh")),
    concurrency=st.integers(1, 4),
    batch=st.integers(1, 3),
)
def test_every_unique_key_ends_a_value_or_a_failure_exactly_once(tmp_path_factory, texts, broken, concurrency, batch):
    root = tmp_path_factory.mktemp("law")
    step = Upper({t: [StepFailure("client_error", "no")] for t in broken})
    policy = ExecutionPolicy(concurrency=concurrency, batch_size=batch, backoff_seconds=0)
    values, report = run_step(step, items(*texts), store(root), policy)
    unique = set(texts)
    assert set(values) == {key(t) for t in unique - broken}
    assert {f.key for f in report.failures} == {key(t) for t in unique & broken}
    assert report.computed + len(report.failures) == len(unique) == report.unique
    assert sorted(step.calls) == sorted(unique)
