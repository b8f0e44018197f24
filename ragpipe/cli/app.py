"""The ``ragpipe`` command: one root app; each concern's commands live in their own module."""

from __future__ import annotations

import typer

from ragpipe.cli.build import build, gc
from ragpipe.cli.bundle import bundle_app
from ragpipe.cli.candidate import candidate_app, tune
from ragpipe.cli.eval import eval_app, suite_app
from ragpipe.cli.gate import compare, gate
from ragpipe.cli.init import init
from ragpipe.cli.query import answer, query
from ragpipe.cli.release import release_app
from ragpipe.cli.serve import serve, serve_key

app = typer.Typer(
    help="Build, evaluate, gate, release and query retrieval index bundles.", no_args_is_help=True, add_completion=False
)
app.command()(init)
app.command()(build)
app.command()(gc)
app.command()(query)
app.command()(answer)
app.add_typer(bundle_app, name="bundle")
app.add_typer(suite_app, name="suite")
app.add_typer(eval_app, name="eval")
app.command()(compare)
app.command()(gate)
app.add_typer(candidate_app, name="candidate")
app.command()(tune)
app.add_typer(release_app, name="release")
app.command()(serve)
app.command(name="serve-key")(serve_key)


def main() -> None:
    app()
