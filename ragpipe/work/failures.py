"""Typed failures of one attempt at a step's item, and the errors that stop a whole run."""

from __future__ import annotations

from dataclasses import dataclass

from ragpipe.work.policy import FailureKind
from ragpipe.work.usage import Usage, UsageTotals


class StepFailure(Exception):
    """One attempt failed: ``kind`` says how (the policy decides whether to retry), ``detail`` is a
    stable label (``http_error:503``, ``connection_error``), ``retry_after`` the server's wish in
    seconds, ``usage`` what the failed call cost (an invalid reply was still paid for)."""

    def __init__(
        self,
        kind: FailureKind,
        message: str,
        *,
        detail: str | None = None,
        retry_after: float | None = None,
        usage: Usage | None = None,
        evidence: object = None,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.detail = detail or kind
        self.retry_after = retry_after
        self.usage = usage
        self.evidence = evidence  # what the failed attempt produced, for the record (an invalid reply)


@dataclass(frozen=True)
class ItemFailure:
    """An item that ended without a value: its key, the last attempt's failure, how many were made,
    and what the last attempt produced (``StepFailure.evidence``)."""

    key: str
    kind: FailureKind
    detail: str
    message: str
    attempts: int
    evidence: object = None


class BudgetExhausted(RuntimeError):
    """Admission stopped before the budget would be exceeded; what was committed stays committed."""

    def __init__(
        self,
        step: str,
        budget: int,
        spent: int,
        totals: UsageTotals,
        not_admitted: int,
        setting: str = "execution.generation.budget_micros",
    ):
        super().__init__(
            f"{step}: budget of {budget} micros reached: {spent} micros spent, {totals.calls} calls by this step, "
            f"{not_admitted} items not admitted (finished items are cached: raise "
            f"{setting} and build again to continue)"
        )
        self.not_admitted = not_admitted
        self.totals = totals
        self.spent = spent


class BudgetUnenforceable(ValueError):
    """A budget is set but a call's worst-case cost is unknown (its model has no price)."""
