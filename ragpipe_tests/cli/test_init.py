"""A new corpus is a path: ``ragpipe init``, a build that says no suite case applies, a query by
revision, cases of one's own, a build that evaluates them, activation (docs/your-corpus.md).

Run as a user runs it: the CLI in a subprocess, with the variables ``ragpipe init`` prints, so the
project's state lives in the project (fresh homes under ``tmp_path``). Two real builds in all.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from ragpipe.experiment.decision import decide, skipped_cases_text
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.corpora import write_tree
from ragpipe_tests.support.gate_support import arm, policy
from ragpipe_tests.support.paths import REPO

NOTES = {
    "garden.md": "---\ntitle: Garden\n---\n# Tomatoes\n\nWater tomato plants deeply twice a week and stake them before they flower.\n",
    "kitchen/bread.md": "---\ntitle: Sourdough\n---\n# Sourdough bread\n\nFeed the starter with rye flour the night before; bake at 250 degrees in a covered pot.\n",
    "bike.md": "---\ntitle: Bicycle\n---\n# Chain care\n\nClean the bicycle chain with degreaser and oil it every 300 kilometres.\n",
    "money/tax.md": "---\ntitle: Taxes\n---\n# Tax return\n\nThe tax return is due on the last day of July; keep receipts for five years.\n",
    "home/boiler.md": "---\ntitle: Boiler\n---\n# Boiler pressure\n\nIf the boiler pressure drops below one bar, refill it through the filling loop.\n",
    "cat.md": "---\ntitle: Cat\n---\n# Cat food\n\nThe cat eats wet food in the morning and dry kibble in the evening.\n",
}
CASES = [
    {
        "id": "water-tomatoes",
        "query": "how often should I water the tomatoes?",
        "target_level": "document",
        "judgments": {"garden.md": 1},
    },
    {
        "id": "boiler-pressure",
        "query": "the boiler pressure is too low",
        "target_level": "document",
        "judgments": {"home/boiler.md": 1},
    },
]
REFUSED = "is not empty: ragpipe init writes a project into a new or empty folder"


def ragpipe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # COLUMNS: rich lays the human output out for a wide terminal, so no line is wrapped
    return run_cli(*args, env={"COLUMNS": "1000", **(env or {})}, timeout=900)


def project_env(project: Path) -> dict[str, str]:
    """The variables ``ragpipe init`` tells one to export."""
    return {
        "RAGPIPE_PIPELINE_SPEC": str(project / "pipeline.yaml"),
        "RAGPIPE_TARGETS": str(project / "targets.yaml"),
        "RAGPIPE_HOME": str(project / "var" / "ragpipe"),
        "DAGSTER_HOME": str(project / "var" / "dagster"),
    }


@pytest.fixture(scope="module")
def first_build(tmp_path_factory: pytest.TempPathFactory):
    """``ragpipe init`` a project, then build the notes with it: the suite is still the placeholder."""
    root = tmp_path_factory.mktemp("your-corpus")
    notes = write_tree(root / "notes", NOTES)
    project = root / "notes-project"
    made = ragpipe("init", str(project))
    env = project_env(project)
    built = ragpipe("build", str(notes), "--revision", "notes-1", "--default-scope", "public", env=env)
    return root, notes, project, made, env, built


@pytest.fixture(scope="module")
def second_build(first_build):
    """The two cases written into the suite, coverage lowered to 2 cases, the same revision built again."""
    _, notes, project, _, env, _ = first_build
    (project / "suite.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CASES))
    policy = project / "gate_policy.yaml"
    text = policy.read_text()
    assert text.count("min_cases: 20 ") == 1
    policy.write_text(text.replace("min_cases: 20 ", "min_cases: 2  "))
    built = ragpipe("build", str(notes), "--revision", "notes-1", "--default-scope", "public", "--json", env=env)
    return built


def test_init_writes_the_project_and_prints_the_next_commands(first_build):
    _, _, project, made, _, _ = first_build
    assert (made.returncode, made.stderr) == (0, ""), made.stderr
    assert made.stdout.splitlines() == [
        f"wrote {project}/pipeline.yaml  pipeline spec: ragpipe's defaults, evaluated on suite.jsonl under gate_policy.yaml",
        f"wrote {project}/gate_policy.yaml  gate policy: a copy of ragpipe's default",
        f"wrote {project}/targets.yaml  release targets staging and production, accepting gate_policy.yaml",
        f"wrote {project}/suite.jsonl  the suite: one placeholder case without a judgment",
        f"wrote {project}/README.md  the suite format and the next steps",
        f"wrote {project}/.gitignore  keeps var/ (this project's state) out of version control",
        "next:",
        f"  export RAGPIPE_PIPELINE_SPEC={project}/pipeline.yaml RAGPIPE_TARGETS={project}/targets.yaml",
        f"  export RAGPIPE_HOME={project}/var/ragpipe DAGSTER_HOME={project}/var/dagster",
        "  ragpipe build CORPUS --revision KEY [--default-scope SCOPE]",
        '  ragpipe query --revision KEY "..."',
    ]
    assert json.loads((project / "suite.jsonl").read_text()) == {
        "id": "placeholder",
        "query": "replace this line with your cases (format: README.md)",
        "target_level": "document",
        "judgments": {},
    }
    assert "## The suite: `suite.jsonl`" in (project / "README.md").read_text()
    # the default policy, unchanged but for its comments: the same policy ID
    assert (project / "gate_policy.yaml").read_text().endswith((REPO / "ragpipe/specs/gate_policy.yaml").read_text())


def test_init_refuses_a_folder_that_is_not_empty(tmp_path: Path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.md").write_text("# mine\n")
    done = ragpipe("init", str(taken))
    assert (done.returncode, done.stdout, done.stderr) == (1, "", f"error: {taken} {REFUSED}\n")
    assert [p.name for p in taken.iterdir()] == ["notes.md"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert ragpipe("init", str(empty)).returncode == 0 and (empty / "pipeline.yaml").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "taken"]  # no temporary folder left


def test_init_into_the_current_empty_folder_keeps_that_folder(tmp_path: Path, cli):
    """``ragpipe init .``: the files move into the caller's folder, which stays the same folder."""
    here = tmp_path / "here"
    here.mkdir()
    inode = here.stat().st_ino
    done = cli("init", ".", env={"PYTHONPATH": str(REPO)}, cwd=here, timeout=120)
    assert done.returncode == 0, done.stderr
    assert here.stat().st_ino == inode and (here / "pipeline.yaml").is_file() and (here / "suite.jsonl").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]  # no temporary folder left


def test_a_build_with_no_applicable_case_says_so_in_one_line(first_build):
    _, notes, project, _, _, built = first_build
    assert built.returncode == 0, built.stderr
    note = (
        "no suite case applies to revision notes-1: the suite's only case has no relevant judgment (grade >= 1); "
        f"add cases judged against this corpus' document IDs to {project}/suite.jsonl, then build again; "
        'meanwhile: ragpipe query --revision notes-1 "..."'
    )
    lines = built.stdout.splitlines()
    assert lines[0] == note and lines[-1].startswith("└")
    rows = {
        cells[0].strip(): cells[1].strip()
        for line in lines
        if line.startswith("│") and len(cells := line.strip("│").split("│")) == 2
    }
    assert {k: rows[k] for k in ("documents", "eligible", "decisive_phase", "evaluated_cases", "skipped_cases")} == {
        "documents": "6",
        "eligible": "False",
        "decisive_phase": "hard",
        "evaluated_cases": "0",
        "skipped_cases": "1",
    }
    assert rows["gate_reasons"] == (
        "hard max unauthorized_disclosures: no evaluable case: the suite's only case has no relevant judgment (grade >= 1)"
    )
    assert "0 evaluated, 1 skipped, 0 failed" in built.stderr
    assert "not eligible, decisive phase hard" in built.stderr


def test_query_by_revision_serves_the_notes_meanwhile(first_build):
    _, _, _, _, env, _ = first_build
    found = ragpipe(
        "query", "--revision", "notes-1", "how often should I water the tomatoes?", "--k", "3", "--json", env=env
    )
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)["hits"]
    assert [h["document_id"] for h in hits][:1] == ["garden.md"] and len(hits) == 3
    assert {h["document_id"] for h in hits} <= set(NOTES)
    assert hits[0]["text"] == NOTES["garden.md"].split("---\n", 2)[2]
    nothing_active = ragpipe("query", "how often should I water the tomatoes?", env=env)
    assert (nothing_active.returncode, nothing_active.stdout) == (1, "")
    assert "target 'staging' has no active release" in nothing_active.stderr


def test_cases_judged_against_the_notes_are_evaluated_gated_and_activated(first_build, second_build):
    _, _, project, _, env, first = first_build
    assert second_build.returncode == 0, second_build.stderr
    summary = json.loads(second_build.stdout)
    assert {
        k: summary[k]
        for k in (
            "revision",
            "documents",
            "embedded",
            "cache_hits",
            "up_to_date",
            "evaluated_cases",
            "skipped_cases",
            "eligible",
            "decisive_phase",
            "gate_reasons",
            "evaluation_note",
        )
    } == {
        "revision": "notes-1",
        "documents": 6,
        "embedded": 0,  # the corpus did not change: every text comes from the embedding cache
        "cache_hits": 12,
        "up_to_date": False,  # the suite did: evaluation, gate and release are made again
        "evaluated_cases": 2,
        "skipped_cases": 0,
        "eligible": True,
        "decisive_phase": None,
        "gate_reasons": [],
        "evaluation_note": None,
    }
    assert f"│ bundle_id       │ {summary['bundle_id']}" in first.stdout  # the same bundle, a new release
    valid = ragpipe("suite", "validate", str(project / "suite.jsonl"), "--revision", "notes-1", "--json", env=env)
    assert (json.loads(valid.stdout)["cases"], json.loads(valid.stdout)["evaluable"]) == (2, 2), valid.stderr
    activated = ragpipe("release", "activate", summary["release_id"], env=env)
    assert activated.returncode == 0, activated.stderr
    assert activated.stdout.startswith(f"activated {summary['release_id']} on staging")
    served = ragpipe("query", "the boiler pressure is too low", "--k", "2", "--json", env=env)
    assert served.returncode == 0, served.stderr
    data = json.loads(served.stdout)
    assert (data["release_id"], data["hits"][0]["document_id"]) == (summary["release_id"], "home/boiler.md")


def test_no_evaluable_case_names_the_missing_evidence_and_keeps_the_outcome():
    assert (
        skipped_cases_text({"missing_judged_targets": 12}) == "all 12 suite cases judge documents this revision lacks"
    )
    assert (
        skipped_cases_text({"no_positive_judgment": 2, "missing_judged_targets": 10})
        == "all 12 suite cases were skipped: 10 judge documents this revision lacks, 2 have no relevant judgment (grade >= 1)"
    )
    skipped = {f"c{i:02d}": "missing_judged_targets" for i in range(12)}
    ceiling = {"max_p95_latency_ratio": 1.5, "latency_slack_ms": 5.0, "max_p95_latency_ms": 50.0}
    d = decide(policy(cost=ceiling), None, arm("run-1", {}, skipped=skipped))
    gap = "no evaluable case: all 12 suite cases judge documents this revision lacks"
    assert (d.eligible, d.decisive_phase) == (False, "hard")  # as before: a check without a value fails
    assert d.reasons == (
        f"hard max unauthorized_disclosures: {gap}",
        f"coverage failed_rate (challenger): {gap}",
        "coverage evaluated_cases: 0 is not >= 10",
        f"target floor ndcg@10: {gap}",
        f"target floor recall@100: {gap}",
    )
    (latency,) = [c for c in d.checks if c.phase == "cost"]  # advisory: shown with the same reason
    assert (latency.verdict, latency.reason.split(" (advisory")[0]) == ("advisory", f"cost p95_latency_absolute: {gap}")
    # a run that evaluated a case keeps the reasons it had
    d = decide(policy(cost=ceiling), None, arm("run-2", {"a": 0.5}, skipped={"b": "no_positive_judgment"}))
    assert d.reasons == ("coverage evaluated_cases: 1 is not >= 10",)


PASSPORT = "---\ntitle: Travel\n---\n# Passport\n\nThe passport expires in March 2031; renew it at the town hall three months before.\n"
PASSPORT_CASE = {
    "id": "passport-renewal",
    "query": "when does the passport expire?",
    "target_level": "document",
    "judgments": {"travel/passport.md": 1},
}


@pytest.fixture(scope="module")
def three_revisions(first_build, second_build):
    """notes-1 (the two cases) live, then three revisions each built and activated as a user would:
    notes-2 adds a note and a case for it, notes-3 edits a note, notes-4 deletes one."""
    _, notes, project, _, env, _ = first_build
    steps = {}
    live = ragpipe("release", "activate", "--revision", "notes-1", env=env)
    assert live.returncode == 0, live.stderr

    def build_and_activate(revision: str) -> None:
        built = ragpipe("build", str(notes), "--revision", revision, "--default-scope", "public", "--json", env=env)
        assert built.returncode == 0, built.stderr
        activated = ragpipe("release", "activate", "--revision", revision, env=env)
        steps[revision] = (json.loads(built.stdout), activated)

    (notes / "travel").mkdir()
    (notes / "travel" / "passport.md").write_text(PASSPORT)
    (project / "suite.jsonl").write_text("".join(json.dumps(c) + "\n" for c in [*CASES, PASSPORT_CASE]))
    build_and_activate("notes-2")
    (notes / "bike.md").write_text(NOTES["bike.md"].replace("300 kilometres", "500 kilometres"))
    build_and_activate("notes-3")
    (notes / "cat.md").unlink()
    build_and_activate("notes-4")
    listing = ragpipe("release", "list", "--json", env=env)
    return steps, json.loads(listing.stdout), ragpipe("release", "list", env=env), env


def test_three_revisions_add_edit_delete_each_go_live_as_a_refresh(three_revisions):
    steps, listing, _, env = three_revisions
    previous = next(r["release_id"] for r in listing if r["revision"] == "notes-1" and r["eligible"])
    for revision, documents, embedded, coverage in (
        ("notes-2", 7, 2, "new coverage: 1 case; lost coverage: none"),
        ("notes-3", 7, 2, "new coverage: none; lost coverage: none"),
        ("notes-4", 6, 0, "new coverage: none; lost coverage: none"),
    ):
        summary, activated = steps[revision]
        assert (summary["documents"], summary["embedded"], summary["eligible"]) == (documents, embedded, True)
        assert summary["change"] == f"refresh against {previous[:19]}… ({coverage})", revision
        assert summary["next"] == (
            f"production: not here: it was gated against {previous[:23]}… and production serves nothing; "
            "staging: the activation sensor activates it while the Dagster daemon runs "
            f"(now: ragpipe release activate {summary['release_id'][:23]} --target staging)"
        )
        assert activated.returncode == 0, activated.stderr
        assert activated.stdout.startswith(f"activated {summary['release_id']} on staging"), activated.stdout
        target = {
            c["name"]: c for c in json.loads(read_decision_file(env, summary))["checks"] if c["phase"] == "target"
        }
        assert target["non_inferiority"]["verdict"] == "pass"
        previous = summary["release_id"]
    served = ragpipe("query", "when does the passport expire?", "--k", "1", "--json", env=env)
    assert json.loads(served.stdout)["hits"][0]["document_id"] == "travel/passport.md"
    assert json.loads(served.stdout)["release_id"] == previous


def read_decision_file(env: dict[str, str], summary: dict) -> str:
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.release.kept_decision import evidence_path
    from ragpipe.release.manifest import load_manifest
    from ragpipe.release.store import ReleaseStore

    store = ReleaseStore(Workspace(Path(env["RAGPIPE_HOME"])))
    manifest = load_manifest(store, summary["release_id"])
    return json.dumps(json.loads(evidence_path(store, manifest.gate.decision_id).read_bytes())["decision"])


def test_release_list_shows_time_change_metric_eligibility_and_where_live(three_revisions):
    steps, listing, table, _ = three_revisions
    rows = {r["release_id"]: r for r in listing}
    live = steps["notes-4"][0]["release_id"]
    assert rows[live]["active_targets"] == ["staging"]
    assert (rows[live]["change"], rows[live]["eligible"], rows[live]["first_reason"]) == ("refresh", True, None)
    assert rows[live]["metric"]["name"] == "ndcg@10" and rows[live]["metric"]["paired"] is True
    assert rows[live]["published"].endswith("Z")
    placeholder = next(r for r in listing if r["revision"] == "notes-1" and not r["eligible"])
    assert placeholder["first_reason"].startswith("hard max unauthorized_disclosures: no evaluable case")
    assert table.returncode == 0, table.stderr
    header = next(line for line in table.stdout.splitlines() if "release" in line and "published" in line)
    assert re.fullmatch(r"release +published +revision +change +ndcg@10 \(Δ\) +eligible +live on *", header)
    live_line = next(line for line in table.stdout.splitlines() if "notes-4" in line)
    row = rf"{live[7:19]} +\d\d-\d\d \d\d:\d\d +notes-4 +refresh +\d(\.\d+)? \+0 +yes +staging *"
    assert re.fullmatch(row, live_line), live_line
