"""How ``ragpipe build`` shows a run while it happens: one line per finished step or check, a
progress bar (texts/s, ETA) while new texts are embedded. Everything goes to the given console
(stderr); the summary that follows on stdout is the CLI's.

The items are the plain dataclasses of ``ragpipe.orchestration.progress``; this module never touches a
Dagster object.
"""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from ragpipe.orchestration.progress import (
    CheckFinished,
    EmbeddingProgress,
    LogLine,
    PoolWait,
    RunQueued,
    RunStarted,
    StepFinished,
    WorkerWait,
)

OK, FAILED = "[green]✓[/]", "[red]✗[/]"


class TextsPerSecond(ProgressColumn):
    """Encoding speed; ``?`` until rich has two samples."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text(f"{speed:.0f} texts/s" if speed is not None else "? texts/s")


def count_text(counts: tuple[tuple[str, object], ...]) -> str:
    """``517 rows``, ``8 encoded, 0 cached``, ``bundle sha256:0123456789ab…``, ``not eligible,
    decisive phase target``."""
    parts = []
    for label, value in counts:
        if label in ("bundle", "release"):
            text = str(value)
            parts.append(f"{label} {text[:19]}…" if len(text) > 19 else f"{label} {text}")
        elif label == "eligible":
            parts.append("eligible" if value is True or value == "True" else "not eligible")
        elif label == "decisive phase":
            if value not in (None, "none"):
                parts.append(f"decisive phase {value}")
        else:
            parts.append(f"{value} {label}")
    return ", ".join(parts)


class BuildView:
    """Callable sink for progress items; ``close()`` removes a bar still showing."""

    def __init__(self, console: Console):
        self.console = console
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def __call__(self, item: object) -> None:
        if isinstance(item, EmbeddingProgress):
            self._embedding(item)
            return
        self.close()  # anything else means the encoding is over (or is interrupted by a line)
        if isinstance(item, StepFinished):
            tail = count_text(item.counts) if item.ok else "failed"
            self._line(
                f"{OK if item.ok else FAILED} {escape(item.step)}  {item.seconds:.1f} s"
                + (f"  {escape(tail)}" if tail else "")
            )
        elif isinstance(item, CheckFinished):
            verdict = "passed" if item.passed else f"failed: {item.description or '(no description)'}"
            self._line(f"{OK if item.passed else FAILED} check {escape(item.check)}  {escape(verdict)}")
        elif isinstance(item, WorkerWait):
            self._line(f"… {escape(item.message)}")
        elif isinstance(item, PoolWait):
            self._line(f"… {escape(item.step)} waits for a slot in pool {escape(item.pool)}")
        elif isinstance(item, RunQueued):
            self._line(f"run {item.run_id} queued; waiting for the daemon to start it")
        elif isinstance(item, RunStarted):
            self._line(f"run {item.run_id} started")
        elif isinstance(item, LogLine):
            self.console.print(item.text, markup=False, highlight=False, soft_wrap=True)

    def _line(self, markup: str) -> None:
        self.console.print(markup, highlight=False, soft_wrap=True)

    def _embedding(self, item: EmbeddingProgress) -> None:
        if not self.console.is_terminal:  # a bar in a log file is only blank lines and escape codes
            return
        if self.bar is None:
            self.bar = Progress(
                TextColumn("embedding new texts"),
                BarColumn(),
                MofNCompleteColumn(),
                TextsPerSecond(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("embeddings", total=item.total, completed=item.done)
        else:
            self.bar.update(self.task, total=item.total, completed=item.done)  # type: ignore[arg-type]
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar, self.task = None, None


NOTE = "evaluation_note"  # shown as a line of its own above the table, not as a row


def summary_table(summary: dict[str, object], *, note: bool = True) -> RenderableType:
    """The build's summary, one row per field (printed last, on stdout); ``gate_reasons`` as one
    row of ``; ``-separated reasons. When no suite case applies to the revision, the summary's
    ``evaluation_note`` comes first, as a line of its own (the table stays last); rich wraps it at
    the console's width, which ``print_summary`` avoids (``note=False``: the table alone)."""
    title = f"revision {summary['revision']}" + (" (up to date, nothing rebuilt)" if summary["up_to_date"] else "")
    table = Table(title=title)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for key, value in summary.items():
        if key == NOTE:
            continue
        if key == "gate_reasons" and isinstance(value, (list, tuple)):
            value = "; ".join(map(str, value)) or "none"
        if key == "generation":
            if value is None:
                continue
            value = generation_line(value)  # type: ignore[arg-type]
        if key == "metrics":
            if value is None:
                continue
            value = metrics_line(value)  # type: ignore[arg-type]
        if key in ("evaluation_run", "change", "next") and value is None:
            continue
        if key == "vector_engine":
            if value is None:
                continue
            value = value["why"]  # type: ignore[index]  # "lancedb: …" / "in memory: …": it names the engine
        table.add_row(key, str(value))
    line = summary.get(NOTE) if note else None
    return table if not line else Group(Text(str(line), overflow="fold"), table)


def sig4(value: float) -> str:
    """A figure for a person: 4 significant digits (the raw value stays in the JSON and the run)."""
    return f"{value:.4g}"


def metrics_line(metrics: dict[str, dict]) -> str:
    """``ndcg@10 0.7123 (Δ +0.0012, interval -0.003 … 0.0051); recall@100 0.9 (no incumbent)``: the
    paired interval is the gate's (at its policy's confidence level)."""
    parts = []
    for name, m in metrics.items():
        if "reason" in m:  # the run's report could not be read
            parts.append(f"{name}: {m['reason']}")
            continue
        value = "no value" if m["value"] is None else sig4(m["value"])
        if not m.get("paired"):
            parts.append(f"{name} {value} (no incumbent)")
            continue
        if m["delta"] is None:
            parts.append(f"{name} {value} (Δ none: no scored case)")
            continue
        interval = (
            f", interval {sig4(m['ci_low'])} … {sig4(m['ci_high'])}"
            if m["ci_low"] is not None and m["ci_high"] is not None
            else ""
        )
        parts.append(f"{name} {value} (Δ {m['delta']:+.4g}{interval})")
    return "; ".join(parts)


def generation_line(g: dict[str, object]) -> str:
    """The build's model calls on one row: ``12 calls · 30 cached · 1 invalid · 2 withheld ·
    tokens in 4100 · out 610 · cost 981 micros`` (the cost as ``unknown (…)`` when a model has no
    price); ``· 3 chunks lack a generated kind`` ends it when some do."""
    missing = g.get("missing") or 0
    lacking = f" · {missing} chunk(s) lack a generated kind" if missing else ""
    return (
        f"{g['calls']} calls · {g['cache_hits']} cached · {g['invalid_output']} invalid · "
        f"{g.get('withheld') or 0} withheld · tokens in {g['input_tokens']} · out {g['output_tokens']} · "
        f"cost {g['cost']}{lacking}"
    )


def print_summary(console: Console, summary: dict[str, object]) -> None:
    """The summary as ``ragpipe build`` shows it: the ``evaluation_note``, if any, on one line
    whatever the console's width, then the table."""
    if summary.get(NOTE):
        console.print(str(summary[NOTE]), soft_wrap=True, markup=False, highlight=False)
    console.print(summary_table(summary, note=False))
