"""Telling a run that waits for a Celery worker from one that hangs.

Dagster's Celery executor submits a step and polls for its result with no deadline: when no worker
listens on the step's queue, the run's last word is "Submitting celery task for step …" for ever.
``QueueWatch`` runs beside the executor's loop in the process that orchestrates the run, reads the
run's engine events (the submission opens Dagster's ``celery_queue_wait`` marker, the worker's
"Executing steps … in celery worker" closes it) and, once a step has waited ``after_s`` seconds,
records one engine event on the run saying so — the UI shows it in the run's log, ``ragpipe build``
prints it. The run keeps waiting (a worker may yet start); it is never failed for it.

``settled_after_interrupt`` serves the other half: when the run is interrupted, the Celery loop
revokes its tasks and waits for each result — but a task no worker ever received never yields
one, so the loop would wait for ever. Once every submitted step has either finished or was never
taken, there is nothing left to wait for.
"""

from __future__ import annotations

import threading
import time

from dagster import DagsterEventType, DagsterInstance, DagsterRun

QUEUE_WAIT_MARKER = "celery_queue_wait"
WAIT_MESSAGE = "no Celery worker has taken step"


class QueueWatch:
    def __init__(self, instance: DagsterInstance, run: DagsterRun, after_s: float, poll_s: float = 1.0):
        self.instance, self.run, self.after_s, self.poll_s = instance, run, after_s, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ragpipe-celery-queue-watch", daemon=True)
        self._submitted: dict[str, tuple[float, str]] = {}  # step -> (first seen, queue)
        self._taken: set[str] = set()
        self._reported: set[str] = set()
        self._finished: set[str] = set()
        self._cursor: str | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> QueueWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.refresh()
            with self._lock:
                self._report(time.monotonic())

    def refresh(self) -> None:
        """Read the run's engine events stored since the last read."""
        with self._lock:
            connection = self.instance.get_records_for_run(
                self.run.run_id, cursor=self._cursor, of_type=DagsterEventType.ENGINE_EVENT
            )
            self._cursor = connection.cursor
            for record in connection.records:
                self._see(record.event_log_entry)

    def finished(self, step: str) -> None:
        with self._lock:
            self._finished.add(step)

    def untaken(self) -> list[str]:
        """The submitted steps no worker has taken, in submission order."""
        with self._lock:
            return [step for step in self._submitted if step not in self._taken]

    def settled_after_interrupt(self) -> bool:
        """Whether every submitted step has finished or was never taken by a worker."""
        self.refresh()
        with self._lock:
            return all(step in self._finished or step not in self._taken for step in self._submitted)

    def _see(self, entry) -> None:
        event = entry.dagster_event
        data = event.event_specific_data if event is not None else None
        step = event.step_key if event is not None else None
        if step is None or data is None:
            return
        if getattr(data, "marker_start", None) == QUEUE_WAIT_MARKER:
            queue = entry.message.rsplit(' to queue "', 1)[-1].split('"', 1)[0] if "to queue" in entry.message else "?"
            self._submitted.setdefault(step, (time.monotonic(), queue))
        elif getattr(data, "marker_end", None) == QUEUE_WAIT_MARKER:
            self._taken.add(step)

    def _report(self, now: float) -> None:
        for step, (since, queue) in self._submitted.items():
            if step in self._taken or step in self._reported or now - since < self.after_s:
                continue
            self._reported.add(step)
            self.instance.report_engine_event(
                f"{WAIT_MESSAGE} {step} from queue {queue!r} in {now - since:.0f} s: the run waits until a "
                f"worker listening on {queue!r} starts (make celery-worker)",
                self.run,
                step_key=step,
            )
