"""How a step runs — operational settings that change speed and spending, never a result.

Nothing here enters a semantic ID: two runs of one step under different policies compute the same
values for the same keys (a policy may stop a run early — a budget, attempts exhausted — but never
changes what a finished item is).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ragpipe.kernel.models import FrozenModel

# The typed reasons an attempt fails (``ragpipe.work.failures``); ``refused``: the model declined
# (``message.refusal``) or the provider filtered the reply (``finish_reason: content_filter``).
FailureKind = Literal["rate_limited", "timeout", "server_error", "invalid_output", "client_error", "refused"]


class ExecutionPolicy(FrozenModel):
    """Concurrency, rate, retries and budget of one step.

    * ``concurrency``: batches in flight at once (threads);
    * ``batch_size``: items one call computes (1 for a model call per item; an embedder encodes
      many texts per call) — each batch is committed on its own;
    * ``requests_per_minute``: attempts started per minute, across all threads (None: unlimited);
    * ``max_attempts``: attempts per item, the first included;
    * ``retry_on``: failure kinds worth another attempt (an invalid output of a deterministic
      model is not, by default: the same request gives the same reply);
    * ``backoff_seconds`` doubles per attempt up to ``max_backoff_seconds``; a server's
      ``Retry-After`` replaces it (capped the same way) and pauses every thread's admission;
    * ``budget_micros``: money this run may spend; a call is admitted only if its worst case
      still fits (None: no budget).
    """

    concurrency: int = Field(1, ge=1, le=64)
    batch_size: int = Field(1, ge=1, le=100_000)
    requests_per_minute: int | None = Field(None, ge=1)
    max_attempts: int = Field(4, ge=1, le=20)
    retry_on: tuple[FailureKind, ...] = ("rate_limited", "timeout", "server_error")
    backoff_seconds: float = Field(1.0, ge=0, le=600)
    max_backoff_seconds: float = Field(60.0, ge=0, le=3600)
    budget_micros: int | None = Field(None, ge=0)
