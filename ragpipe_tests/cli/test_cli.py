"""The `ragpipe` command, run as a user runs it (subprocess, fresh homes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance

from ragpipe.cli.build_view import BuildView
from ragpipe.orchestration.progress import EmbeddingProgress, StepFinished
from ragpipe_tests.support.cli import homes_under, run_cli
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.paths import REPO


def exact_engine(vectors: int) -> dict[str, str]:
    """What serves a handbook bundle's ``vectors`` (384 dimensions), in the words users see."""
    size = vectors * 384 * 4
    return {
        "engine": "memory",
        "why": f"exact scores (float64_sequential/v1) in memory: {vectors:,} vectors of 384 dimensions, "
        f"{size:,} bytes" + (f" ({size / 2**20:.1f} MiB)" if size >= 2**20 else "") + ", read from vectors.arrow",
    }


def ragpipe(*args: str, home: Path, **extra_env: str) -> subprocess.CompletedProcess:
    return run_cli(*args, env={**homes_under(home), **extra_env})


@pytest.fixture(scope="module")
def cli_build(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("cli")
    corpus = write_tree(home / "handbook", HANDBOOK)
    first = ragpipe("build", str(corpus), "--revision", "hb-1", "--default-scope", "internal", "--json", home=home)
    assert first.returncode == 0, first.stderr
    return home, corpus, first


def test_build_json_is_exactly_one_object(cli_build):
    home, _, first = cli_build
    lines = first.stdout.strip().splitlines()
    assert len(lines) == 1
    # --json: no progress, no Dagster stream, no warnings, on any host
    assert first.stderr == ""
    out = json.loads(lines[0])
    # what served the evaluation's vector channel is in the object
    assert out["vector_engine"] == exact_engine(out["representations"])
    assert out["launched"] == "in_process" and out["up_to_date"] is False
    assert {
        k: out[k] for k in ("revision", "documents", "excluded", "chunks", "representations", "embedded", "cache_hits")
    } == {
        "revision": "hb-1",
        "documents": 3,
        "excluded": 1,
        "chunks": 4,
        "representations": 8,
        "embedded": 8,
        "cache_hits": 0,
    }
    assert out["bundle_id"].startswith("sha256:") and Path(out["bundle_path"]).name == out["bundle_id"][7:]
    # the evaluation's folder (home-relative), its primary metrics (nothing measured: no suite case
    # judges the handbook, and no incumbent to compare with), and what becomes of the release
    assert re.fullmatch(
        r"evaluations/[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", out["evaluation_run"]
    )
    assert (home / "ragpipe" / out["evaluation_run"] / "ledger.jsonl").is_file()
    nothing = {"value": None, "paired": False, "delta": None, "ci_low": None, "ci_high": None}
    assert out["metrics"] == {"ndcg@10": nothing, "recall@100": nothing}
    assert out["next"] == (
        "not eligible, so it goes live on no target: hard max unauthorized_disclosures: no evaluable case: "
        "all 101 suite cases judge documents this revision lacks"
    )


def test_rebuild_same_revision_reports_same_bundle(cli_build):
    home, corpus, first = cli_build
    again = ragpipe("build", str(corpus), "--revision", "hb-1", "--default-scope", "internal", "--json", home=home)
    assert again.returncode == 0, again.stderr
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert (b["bundle_id"], b["bundle_path"], b["embedded"], b["up_to_date"]) == (
        a["bundle_id"],
        a["bundle_path"],
        0,
        True,
    )


STEP_LINE = re.compile(r"^✓ (\w+)  (\d+\.\d) s  (.+)$")


def test_build_prints_one_line_per_step_and_the_summary_last(cli_build):
    """Same corpus, new key: every stage runs (all texts from the embedding cache)."""
    home, corpus, _ = cli_build
    out = ragpipe("build", str(corpus), "--revision", "hb-lines", "--default-scope", "internal", home=home)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == f"registered: revision hb-lines from {corpus}"
    run_id = re.fullmatch(r"run ([0-9a-f-]{36}) started", lines[1]).group(1)
    steps, checks = [], []
    for line in lines[2:]:
        if line.startswith("✓ check "):
            checks.append(line)
            steps.append(line.split()[2])
        else:
            name, seconds, counts = STEP_LINE.fullmatch(line).groups()
            steps.append((name, counts))
    bundle, release = steps[7][1], steps[12][1]
    assert steps == [
        ("source_snapshot", "3 rows, 1 excluded"),
        ("chunks", "4 rows"),
        "chunks_match_source",
        ("representations", "8 rows"),
        ("embeddings", "8 rows, 0 encoded, 8 cached"),
        ("lexical_index", "8 rows"),
        ("vector_index", "8 rows"),
        ("index_bundle", bundle),
        "bundle_verifies",
        # the checked-in spec's evaluation section: the SciFact sample suite judges no handbook
        # document, so every case is skipped; with nothing measured the bootstrap gate fails
        # closed in its first phase (a check without a value fails)
        ("evaluation_run", "0 evaluated, 101 skipped, 0 failed"),
        "evaluation_ledger_verifies",
        ("gate_decision", "not eligible, decisive phase hard"),
        ("release_manifest", release),
    ]
    assert re.fullmatch(r"bundle sha256:[0-9a-f]{12}…", bundle) and re.fullmatch(
        r"release sha256:[0-9a-f]{12}…", release
    )
    assert checks == [
        "✓ check chunks_match_source  passed",
        "✓ check bundle_verifies  passed",
        "✓ check evaluation_ledger_verifies  passed",
    ]
    for noise in ("DEBUG", "PreviewWarning", "Warning", "Loading weights", "STEP_SUCCESS"):
        assert noise not in out.stderr
    table = out.stdout.splitlines()
    assert table[-1].startswith("└") and f"│ run_id          │ {run_id}" in out.stdout
    assert "│ launched        │ in_process" in out.stdout


def test_build_verbose_shows_dagsters_event_stream(cli_build):
    home, corpus, _ = cli_build
    out = ragpipe(
        "build", str(corpus), "--revision", "hb-verbose", "--default-scope", "public", "--verbose", "--json", home=home
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["revision"] == "hb-verbose"  # stdout still holds only the object
    assert "STEP_SUCCESS" in out.stderr and 'Finished execution of step "index_bundle"' in out.stderr


def test_the_summarys_metrics_line_rounds_for_a_person():
    from ragpipe.cli.build_view import metrics_line

    metrics = {
        "ndcg@10": {
            "value": 0.9217678885599524,
            "paired": True,
            "delta": 0.00123456,
            "ci_low": -0.0030001,
            "ci_high": 0.0051,
        },
        "recall@100": {"value": 0.9, "paired": True, "delta": None, "ci_low": None, "ci_high": None},
        "mrr@10": {"value": None, "paired": False, "delta": None, "ci_low": None, "ci_high": None},
    }
    assert metrics_line(metrics) == (
        "ndcg@10 0.9218 (Δ +0.001235, interval -0.003 … 0.0051); recall@100 0.9 (Δ none: no scored case); "
        "mrr@10 no value (no incumbent)"
    )


def test_embedding_progress_bar_shows_count_and_speed():
    from io import StringIO

    from rich.console import Console

    console = Console(force_terminal=True, color_system=None, file=StringIO(), width=120)
    view = BuildView(console)
    view(EmbeddingProgress(0, 1034))
    view(EmbeddingProgress(512, 1034))
    shown = console.file.getvalue()
    assert "512/1034" in shown and "texts/s" in shown and "embedding new texts" in shown
    view(StepFinished("embeddings", True, 3.25, (("rows", 1034), ("encoded", 1034), ("cached", 0))))
    assert view.bar is None  # the step line replaced the bar
    assert "✓ embeddings  3.2 s  1034 rows, 1034 encoded, 0 cached" in console.file.getvalue()


def test_new_revision_with_one_new_document_embeds_only_it(cli_build, tmp_path: Path):
    home, corpus, first = cli_build
    shutil.copytree(corpus, tmp_path / "v2")
    (tmp_path / "v2" / "guide" / "faq.md").write_text("# FAQ\n\nHow do I roll back? Point the release pointer back.\n")
    out = ragpipe(
        "build", str(tmp_path / "v2"), "--revision", "hb-2", "--default-scope", "internal", "--json", home=home
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["documents"], result["embedded"], result["cache_hits"]) == (4, 2, 8)


def test_changed_source_under_same_key_is_refused(cli_build, tmp_path: Path):
    home, corpus, _ = cli_build
    shutil.copytree(corpus, tmp_path / "edited")
    (tmp_path / "edited" / "guide" / "intro.md").write_text("# Intro\n\nCompletely different words now.\n")
    out = ragpipe("build", str(tmp_path / "edited"), "--revision", "hb-1", "--default-scope", "internal", home=home)
    assert out.returncode == 1
    assert "revision 'hb-1' is already registered with different content" in " ".join(out.stderr.split())


def test_bad_corpus_exits_nonzero_and_registers_nothing(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "a", "text": "fine text"}\n{"_id": "a", "text": "again"}\n')
    out = ragpipe("build", str(bad), "--revision", "bad-1", "--default-scope", "public", "--json", home=tmp_path)
    assert out.returncode == 1
    assert out.stdout == ""
    assert f"{bad}:2 [id=a]: duplicate document ID (first seen on line 1)" in out.stderr.replace("\n", "")
    assert not (tmp_path / "ragpipe" / "revisions" / "bad-1.json").exists()


def test_unscoped_documents_without_a_default_scope_exit_nonzero_and_register_nothing(tmp_path: Path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        '{"_id": "a", "text": "one text", "metadata": {"access_scopes": ["staff"]}}\n{"_id": "b", "text": "two text"}\n'
    )
    out = ragpipe("build", str(corpus), "--revision", "c-1", "--json", home=tmp_path)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == (
        f"error: {corpus}: 1 document declares no access_scopes: 'b' (line 2); declare them, or give the revision "
        "a default scope (ragpipe build --default-scope SCOPE, default_scope in the sources file)\n"
    )
    assert not (tmp_path / "ragpipe" / "revisions").exists()


def test_forced_queue_without_a_daemon_is_refused_before_any_run(tmp_path: Path):
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    out = ragpipe(
        "build",
        str(corpus),
        "--revision",
        "hb-q",
        "--default-scope",
        "public",
        "--launch",
        "queue",
        "--json",
        home=tmp_path,
    )
    assert (out.returncode, out.stdout) == (1, "")
    assert "launch queue: no dagster-daemon serves this instance's run queue" in " ".join(out.stderr.split())
    with DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
        assert instance.get_runs() == []


def test_relative_dagster_home_is_a_clear_error(tmp_path: Path):
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    out = ragpipe(
        "build",
        str(corpus),
        "--revision",
        "hb-rel",
        "--default-scope",
        "public",
        home=tmp_path,
        DAGSTER_HOME="var/rel-dagster",
    )
    assert (out.returncode, out.stdout) == (1, "")
    assert " ".join(out.stderr.split()).endswith(  # after "registered: …", no traceback
        f"error: DAGSTER_HOME 'var/rel-dagster' is not an absolute path: set it to one, e.g. DAGSTER_HOME={REPO / 'var/rel-dagster'}"
    )
    assert "Traceback" not in out.stderr
    assert not (REPO / "var" / "rel-dagster").exists()


def test_bundle_verify_and_inspect(cli_build, tmp_path: Path):
    _, _, first = cli_build
    bundle = Path(json.loads(first.stdout)["bundle_path"])
    ok = ragpipe("bundle", "verify", str(bundle), home=tmp_path)
    assert ok.returncode == 0 and "ok: sha256:" in ok.stdout
    inspect = ragpipe("bundle", "inspect", str(bundle), "--json", home=tmp_path)
    data = json.loads(inspect.stdout)
    assert data["bundle_id"] == json.loads(first.stdout)["bundle_id"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert data["material_digest"] == manifest["material_digest"] != data["bundle_id"]
    assert data["seal"] == {"kind": "sha256", "key_id": None, "value": manifest["seal"]["value"]}
    assert f"ok: {data['bundle_id']} material {data['material_digest']} (26 files verified, sha256 seal)" in " ".join(
        ok.stdout.split()
    )
    assert data["counts"] == {"documents": 3, "chunks": 4, "representations": 8, "lexical_documents": 8, "vectors": 8}
    assert data["default_scope"] == "internal"
    assert sorted(data["specs"]) == [
        "chunks",
        "embeddings",
        "lexical_index",
        "representations",
        "source_snapshot",
        "vector_index",
    ]
    copy = tmp_path / bundle.name
    shutil.copytree(bundle, copy)
    (copy / "chunks.parquet").write_bytes((copy / "chunks.parquet").read_bytes()[:-3])
    bad = ragpipe("bundle", "verify", str(copy), home=tmp_path)
    assert bad.returncode == 1
    assert "chunks.parquet: size" in bad.stderr and "(truncated or extended)" in bad.stderr.replace("\n", "")


def test_the_vector_engine_is_said_in_words_by_the_build_and_bundle_inspect(cli_build):
    """The build's summary row and ``bundle inspect`` say what serves the vectors and how."""
    home, _, first = cli_build
    built = json.loads(first.stdout)
    engine = exact_engine(built["representations"])
    bundle = built["bundle_path"]
    text = ragpipe("bundle", "inspect", bundle, home=home)
    assert text.returncode == 0 and f"vectors {engine['why']}" in " ".join(text.stdout.split())
    data = json.loads(ragpipe("bundle", "inspect", bundle, "--json", home=home).stdout)
    assert data["vector_engine"] == engine


def test_release_activate_by_revision_names_that_revisions_release(cli_build):
    """``release activate --revision KEY`` activates the release of the revision's latest build:
    here refused for what it is (the handbook's build gates ineligible), naming that release."""
    home, _, first = cli_build
    release_id = json.loads(first.stdout)["release_id"]
    out = ragpipe("release", "activate", "--revision", "hb-1", "--target", "staging", home=home)
    assert out.returncode == 1
    assert " ".join(out.stderr.split()).startswith(f"error: release {release_id} is not eligible for activation")
    unknown = ragpipe("release", "activate", "--revision", "hb-404", home=home)
    assert unknown.returncode == 1 and "revision 'hb-404' has no release" in " ".join(unknown.stderr.split())


def test_configured_bundle_key_refuses_an_unkeyed_bundle(cli_build, tmp_path: Path):
    _, _, first = cli_build
    bundle = json.loads(first.stdout)["bundle_path"]
    keyed = ragpipe("bundle", "verify", bundle, home=tmp_path, RAGPIPE_BUNDLE_KEY="k" * 32)
    assert keyed.returncode == 1
    assert "manifest.json: seal: unkeyed, but bundle key sha256:" in keyed.stderr.replace("\n", "")
    short = ragpipe("bundle", "verify", bundle, home=tmp_path, RAGPIPE_BUNDLE_KEY="short")
    assert short.returncode == 1 and "RAGPIPE_BUNDLE_KEY: key has 5 bytes, at least 32 are required" in short.stderr


def test_dagster_definitions_validate():
    env = {**os.environ, "DAGSTER_HOME": str(REPO / "var" / "dagster-validate")}
    os.makedirs(env["DAGSTER_HOME"], exist_ok=True)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "All code locations passed validation" in out.stderr + out.stdout
    assert "Validation successful for code location ragpipe." in out.stderr + out.stdout
