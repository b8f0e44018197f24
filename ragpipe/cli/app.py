"""The ``ragpipe`` command: one root app; each concern's commands live in their own module."""

from __future__ import annotations

import atexit
import gc as collector  # `gc` is the garbage-collection command below
import sys

import typer
from rich.markup import escape

from ragpipe.cli.build import build, gc
from ragpipe.cli.bundle import bundle_app
from ragpipe.cli.candidate import candidate_app, tune
from ragpipe.cli.common import err
from ragpipe.cli.dataset import dataset_app
from ragpipe.cli.embedder import embedder_app
from ragpipe.cli.eval import eval_app, suite_app
from ragpipe.cli.gate import compare, gate
from ragpipe.cli.init import init
from ragpipe.cli.query import answer, query
from ragpipe.cli.release import release_app
from ragpipe.cli.serve import serve, serve_key
from ragpipe.kernel.settings import Settings, SettingsError

app = typer.Typer(
    help="Build, evaluate, gate, release and query retrieval index bundles.", no_args_is_help=True, add_completion=False
)


@app.callback()
def check_settings() -> None:
    """Every command starts by reading the ``RAGPIPE_*`` variables once (``ragpipe.kernel.settings``):
    a problem prints one ``error:`` line each and exits 1 before the command does anything. The
    commands below read the same values through ``current_settings()``, which re-reads only if a
    variable changed."""
    try:
        Settings.from_environ()
    except SettingsError as exc:
        for problem in exc.problems:
            err.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


app.command()(init)
app.command()(build)
app.command()(gc)
app.command()(query)
app.command()(answer)
app.add_typer(bundle_app, name="bundle")
app.add_typer(embedder_app, name="embedder")
app.add_typer(suite_app, name="suite")
app.add_typer(eval_app, name="eval")
app.add_typer(dataset_app, name="dataset")
app.command()(compare)
app.command()(gate)
app.add_typer(candidate_app, name="candidate")
app.command()(tune)
app.add_typer(release_app, name="release")
app.command()(serve)
app.command(name="serve-key")(serve_key)


# Commands that do one short piece of work and exit (see ``_one_shot``).
ONE_SHOT_COMMANDS = frozenset({"query", "answer"})


def main() -> None:
    """The console script: ``ragpipe ARGS``."""
    if len(sys.argv) > 1 and sys.argv[1] in ONE_SHOT_COMMANDS:
        _one_shot()
    app()


def _one_shot() -> None:
    """The process answers one query and exits. The cyclic garbage collector would only walk the
    objects the imports and the verified bundle allocate — during the command and once more at
    interpreter exit (≈ 0.2 s together on the demo release, docs/benchmarks.md) — and nothing it
    could free outlives the process: it is switched off, and what exists at exit is frozen so the
    final collection skips it (the operating system reclaims the memory). Only here, in the console
    script: the command functions themselves never change the collector of a process they run in."""
    collector.disable()
    atexit.register(collector.freeze)
