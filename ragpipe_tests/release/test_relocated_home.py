"""A home is relocatable: stored state names bundles, runs and releases by ID or by a path relative
to ``$RAGPIPE_HOME`` (or to the run folder), so a copy whose original is deleted still works for
every command — query, eval --resume, release list/current/activate/rollback, gc."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import read_ledger
from ragpipe.evaluation.runner import run_evaluation
from ragpipe.evaluation.suite import Case, Suite
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import activate
from ragpipe.retrieval.retriever import Retriever
from ragpipe.stages import steps
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.release_fixtures import fresh_ws, publish

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


class Stop(Exception):
    """Stops a run after its first cell: a run left to resume."""


def cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    return run_cli(*args, home=home, env={"COLUMNS": "200"}, timeout=300)


def unfinished_run(ws: Workspace, bundle: Path) -> Path:
    """An evaluation run inside the home with one of its cells done (cases: public documents' titles)."""
    retriever = Retriever(bundle)
    docs = [d for d in retriever.bundle.tables.documents if "public" in d.access_scopes][:3]
    cases = [
        Case(id=f"t{i}", query=d.title, target_level="document", judgments={d.document_id: 1})
        for i, d in enumerate(docs)
    ]
    spec = EvaluationSpec.build(Suite.of(cases, "suite"), retriever.plan, bundle, retriever.bundle_id, k=5)
    out = ws.home / "eval_runs" / "unfinished"

    def stop(done: int, expected: int, _key) -> None:
        raise Stop

    with pytest.raises(Stop):
        run_evaluation(spec, out, retriever_factory=lambda _: retriever, on_progress=stop)
    retriever.close()
    return out


def test_a_copied_home_whose_original_is_deleted_works_for_every_command(tmp_path: Path, bundle: Path):
    ws = fresh_ws(tmp_path / "a", bundle)
    first = publish(ws, bundle, "r1")
    second = publish(ws, bundle, "r2", against=first)
    activate(ws, first, "staging")
    activate(ws, second, "staging")
    unfinished = unfinished_run(ws, ws.bundles / bundle.name)
    created = read_ledger(unfinished).records[0].payload
    assert created["bundle_path"] == f"../../bundles/{bundle.name}"  # relative to the run folder
    expected = len(created["cells"])
    moved = tmp_path / "b" / "home"
    shutil.copytree(ws.home, moved, symlinks=True)
    shutil.rmtree(tmp_path / "a")

    listed = cli("release", "list", "--json", home=moved)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["release_id"] for r in rows] == [first, second]
    current = cli("release", "current", "--target", "staging", "--json", home=moved)
    assert current.returncode == 0 and json.loads(current.stdout)["release_id"] == second, current.stderr
    query = cli("query", "evaluation", "--k", "1", "--json", home=moved)
    assert query.returncode == 0, query.stderr
    assert f'"release_id": "{second}"' in query.stdout
    assert cli("release", "rollback", "--target", "staging", home=moved).returncode == 0
    current = cli("release", "current", "--target", "staging", "--json", home=moved)
    assert json.loads(current.stdout)["release_id"] == first
    activated = cli("release", "activate", second, "--target", "staging", home=moved)
    assert activated.returncode == 0, activated.stderr
    resumed = cli("eval", "--resume", str(moved / "eval_runs" / "unfinished"), "--json", home=moved)
    assert resumed.returncode == 0, resumed.stderr
    cells = {"expected": expected, "completed": expected, "failed": 0, "pending": 0}
    assert expected >= 2 and json.loads(resumed.stdout)["cells"] == cells
    collected = cli("gc", "--json", home=moved)
    assert collected.returncode == 0, collected.stderr
    assert (moved / "bundles" / bundle.name).is_dir()  # both releases were active: kept


def test_stage_records_name_bundles_and_runs_inside_the_home_relatively(built_workspace, tmp_path: Path):
    ws, spec = built_workspace
    facts = steps.read_stage_record(ws, "hb", "index_bundle", spec).facts
    assert facts["bundle_path"] == f"bundles/{Path(str(facts['bundle_path'])).name}"
    copy = Workspace(Path(shutil.copytree(ws.home, tmp_path / "copy", symlinks=True)))
    path, problems = steps.check_bundle(copy, "hb")
    assert (Path(path).parent, problems) == (copy.bundles, [])
    assert Workspace(tmp_path).stored(Path("/elsewhere/x")) == "/elsewhere/x"  # outside a home: absolute


def test_a_stored_path_that_leaves_the_home_is_refused(tmp_path: Path):
    ws = Workspace(tmp_path / "home")
    assert ws.located("bundles/x") == tmp_path / "home" / "bundles" / "x"
    with pytest.raises(ValueError, match=r"^stored path '../../etc' leaves the home "):
        ws.located("../../etc")
