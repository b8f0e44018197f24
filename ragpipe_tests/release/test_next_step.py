"""What ``ragpipe build`` says becomes of a new release, target by target."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import activate
from ragpipe.release.status import what_happens_next
from ragpipe_tests.support.release_fixtures import publish

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


def test_each_target_says_what_happens_next_with_the_command(ws: Workspace, bundle: Path):
    rid = publish(ws, bundle, "r1")
    short = rid[:23]
    assert what_happens_next(ws, rid) == (
        f"production: awaiting approval (ragpipe release approve {short} --target production --by NAME --key KEYFILE); "
        f"staging: the activation sensor activates it while the Dagster daemon runs "
        f"(now: ragpipe release activate {short} --target staging)"
    )
    activate(ws, rid, "staging")
    assert what_happens_next(ws, rid).endswith("; staging: live")
    bad = publish(ws, bundle, "r2", eligible=False, phase="coverage")
    assert what_happens_next(ws, bad, ("coverage min_cases: 1 is not >= 20",)) == (
        "not eligible, so it goes live on no target: coverage min_cases: 1 is not >= 20"
    )
    assert what_happens_next(ws, bad) == "not eligible, so it goes live on no target: decisive phase coverage"
