"""Garbage collection of stage versions and bundles: exact removal lists, roots survive, crash safety."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragpipe.bundle.verify import open_bundle
from ragpipe.gc import GcError, GcReport, Removal, collect_garbage
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import PipelineSpec, load_pipeline_spec
from ragpipe.stages import steps
from ragpipe.stages.stage_store import POINTER, read_output, version_name, workspace_lock
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import HANDBOOK, write_tree

STAGES = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index", "index_bundle"]
RUNS = list(steps.BUILD_STEPS)


def with_chunk_size(spec: PipelineSpec, max_bytes: int) -> PipelineSpec:
    data = spec.model_dump(by_alias=True)
    data["chunker"] = {**data["chunker"], "max_bytes": max_bytes}
    return PipelineSpec.model_validate(data)


def rebuild(ws: Workspace, revision: str, spec: PipelineSpec) -> None:
    for run in RUNS:
        run(ws, revision, spec)


def size(path: Path) -> int:
    return (
        sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())
        if path.is_dir()
        else path.lstat().st_size
    )


def versions(ws: Workspace, revision: str) -> dict[str, str]:
    """The data version each stage of ``revision`` points at."""
    return {stage: read_output(ws, revision, stage).data_version for stage in STAGES}


def tree(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.lstat().st_size for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory):
    """Revisions 'a' and 'b' of one corpus (one shared bundle), then 'b' rebuilt with 800-byte
    chunks: b's previous versions of chunks … index_bundle are garbage, its snapshot is not."""
    root = tmp_path_factory.mktemp("gc")
    corpus = write_tree(root / "handbook", HANDBOOK)
    spec = load_pipeline_spec()
    ws, _, _ = build_all_stages(root / "home", "a", corpus, "markdown", spec=spec)
    build_all_stages(root / "home", "b", corpus, "markdown", spec=spec)
    first = versions(ws, "b")
    assert first == versions(ws, "a")  # same corpus, same specs: same outputs, one bundle
    changed = with_chunk_size(spec, 800)
    rebuild(ws, "b", changed)
    return ws, spec, changed, first


@pytest.fixture
def ws(base, tmp_path: Path) -> Workspace:
    src = base[0]
    copy = Workspace(tmp_path / "home")
    shutil.copytree(src.home, copy.home, symlinks=True)
    return copy


def expected_b_garbage(ws: Workspace, first: dict[str, str]) -> list[Removal]:
    return [
        Removal(
            "stage_version",
            f"work/b/{stage}/{version_name(first[stage])}",
            size(ws.stage_dir("b", stage) / version_name(first[stage])),
        )
        for stage in sorted(STAGES[1:], key=lambda s: f"work/b/{s}/{version_name(first[s])}")
    ]


def test_dry_run_lists_exactly_the_unreferenced_versions_and_removes_nothing(base, ws: Workspace):
    _, _, _, first = base
    before = tree(ws.home)
    report = collect_garbage(ws, dry_run=True)
    assert report == GcReport(
        dry_run=True, removed=tuple(expected_b_garbage(ws, first)), kept_stage_versions=14, kept_bundles=2
    )
    assert report.removed_bytes == sum(r.bytes for r in report.removed) > 0
    assert tree(ws.home) == before


def test_collection_removes_exactly_that_and_every_pointer_still_resolves(base, ws: Workspace):
    _, spec, changed, first = base
    expected = expected_b_garbage(ws, first)
    cache_before = tree(ws.embedding_cache)
    b_now = versions(ws, "b")
    report = collect_garbage(ws)
    assert report == GcReport(dry_run=False, removed=tuple(expected), kept_stage_versions=14, kept_bundles=2)
    for removal in expected:
        assert not (ws.home / removal.path).exists()
    for stage in STAGES:
        assert sorted(os.listdir(ws.stage_dir("a", stage))) == sorted([version_name(first[stage]), POINTER])
        assert sorted(os.listdir(ws.stage_dir("b", stage))) == sorted([version_name(b_now[stage]), POINTER])
        read_output(ws, "a", stage, spec)
        read_output(ws, "b", stage, changed)
    # a's pointer keeps the first bundle although b moved on; b's new bundle is kept too
    assert sorted(os.listdir(ws.bundles)) == sorted(
        [version_name(first["index_bundle"]), version_name(b_now["index_bundle"])]
    )
    for name in os.listdir(ws.bundles):
        open_bundle(ws.bundles / name)
    assert tree(ws.embedding_cache) == cache_before  # never touched
    assert collect_garbage(ws) == GcReport(dry_run=False, removed=(), kept_stage_versions=14, kept_bundles=2)


def test_a_bundle_goes_when_no_pointer_or_extra_root_references_it(base, ws: Workspace):
    _, _, changed, first = base
    rebuild(ws, "a", changed)  # a moves on too: the first bundle is now unreferenced
    b1 = first["index_bundle"]
    kept = collect_garbage(ws, extra_roots=frozenset({b1}))  # e.g. pinned by a release
    assert [(r.kind, r.path.split("/")[1]) for r in kept.removed] == [("stage_version", "a")] * 6 + [
        ("stage_version", "b")
    ] * 6
    assert (ws.bundles / version_name(b1)).is_dir()
    b1_bytes = size(ws.bundles / version_name(b1))
    report = collect_garbage(ws)
    assert report.removed == (Removal("bundle", f"bundles/{version_name(b1)}", b1_bytes),)
    assert not (ws.bundles / version_name(b1)).exists()
    assert sorted(os.listdir(ws.bundles)) == [version_name(read_output(ws, "a", "index_bundle").data_version)]


def test_leftovers_go_only_when_safe(ws: Workspace, base):
    _, _, _, first = base
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    chunks = ws.stage_dir("a", "chunks")
    old = time.time() - 7200
    made = {
        chunks / f".tmp-x-{dead_pid}-0000": "dir",  # dead publisher, old: removed
        chunks / f".tmp-y-{os.getpid()}-0000": "dir",  # live publisher: kept
        chunks / f".tmp-z-{dead_pid}-1111": "young",  # dead but young (maybe another machine): kept
        chunks / ".tmp-not-ours": "dir",  # not a ragpipe temp name: kept
        chunks / ".trash-q-1-aaaa": "dir",  # a crashed removal: removed
        ws.bundles / f".tmp-{'0' * 64}-{dead_pid}-beef": "dir",
        ws.bundles / "notes": "dir",  # not ours: kept
    }
    for path, how in made.items():
        path.mkdir()
        (path / "f").write_bytes(b"12345")
        if how != "young":
            os.utime(path, (old, old))
    report = collect_garbage(ws, dry_run=True)
    leftovers = [r for r in report.removed if r.kind in ("trash", "temp")]
    assert leftovers == [
        Removal("trash", "work/a/chunks/.trash-q-1-aaaa", 5),
        Removal("temp", f"bundles/.tmp-{'0' * 64}-{dead_pid}-beef", 5),
        Removal("temp", f"work/a/chunks/.tmp-x-{dead_pid}-0000", 5),
    ]
    collect_garbage(ws)
    assert {p: p.exists() for p in made} == {
        chunks / f".tmp-x-{dead_pid}-0000": False,
        chunks / f".tmp-y-{os.getpid()}-0000": True,
        chunks / f".tmp-z-{dead_pid}-1111": True,
        chunks / ".tmp-not-ours": True,
        chunks / ".trash-q-1-aaaa": False,
        ws.bundles / f".tmp-{'0' * 64}-{dead_pid}-beef": False,
        ws.bundles / "notes": True,
    }
    assert collect_garbage(ws, tmp_min_age=0).removed == (Removal("temp", f"work/a/chunks/.tmp-z-{dead_pid}-1111", 5),)


def test_refuses_while_a_stage_runs_or_a_pointer_is_unreadable(ws: Workspace):
    before = tree(ws.home)
    with workspace_lock(ws):  # what every stage materialization holds
        with pytest.raises(GcError) as info:
            collect_garbage(ws)
    assert str(info.value) == (
        f"stage materializations are running in {ws.home} ({ws.locks / 'workspace.lock'} is held): "
        "run garbage collection when they have finished"
    )
    pointer = ws.stage_dir("b", "chunks") / POINTER
    pointer.write_text("{not json")
    with pytest.raises(GcError) as info:
        collect_garbage(ws)
    assert str(info.value).startswith(f"cannot read {pointer} ({pointer}: not a valid stage record (")
    assert str(info.value).endswith("): fix or remove it; nothing was removed")
    with pytest.raises(GcError) as info:
        collect_garbage(ws, extra_roots=frozenset({"release-1"}))
    assert str(info.value) == "extra root 'release-1' is not a bundle ID (sha256:<64 hex>)"
    pointer.unlink()
    assert {k: v for k, v in tree(ws.home).items() if not k.startswith("locks")} == {
        k: v for k, v in before.items() if k != pointer.relative_to(ws.home).as_posix() and not k.startswith("locks")
    }


GC_CRASH = """
import os, signal, sys
from pathlib import Path
from ragpipe.gc import collect_garbage
from ragpipe.kernel.workspace import Workspace

target = sys.argv[2]
def hook(step):
    if step == target:
        os.kill(os.getpid(), signal.SIGKILL)
collect_garbage(Workspace(Path(sys.argv[1])), on_step=hook)
"""


@pytest.mark.parametrize("step", ["trashed", "deleted"])
def test_sigkill_during_collection(base, ws: Workspace, step: str):
    _, spec, changed, first = base
    expected = expected_b_garbage(ws, first)
    proc = subprocess.run([sys.executable, "-c", GC_CRASH, str(ws.home), step], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    victim = ws.home / expected[0].path
    assert not victim.exists()  # gone from its name at once
    trash = [p.name for p in victim.parent.iterdir() if p.name.startswith(".trash-")]
    assert len(trash) == (1 if step == "trashed" else 0)
    for removal in expected[1:]:
        assert (ws.home / removal.path).is_dir()  # not reached yet
    for stage in STAGES:
        read_output(ws, "a", stage, spec)
        read_output(ws, "b", stage, changed)
    report = collect_garbage(ws)
    assert [r.path for r in report.removed] == [r.path for r in expected[1:]] + [
        f"{victim.parent.relative_to(ws.home).as_posix()}/{name}" for name in trash
    ]
    assert not [p for p in ws.work.rglob(".trash-*")]


def test_cli_gc_dry_run_then_collect(base, ws: Workspace, cli):
    _, _, _, first = base
    expected = expected_b_garbage(ws, first)

    def run(*args: str) -> subprocess.CompletedProcess:
        return cli("gc", *args, home=ws.home, timeout=120)

    dry = run("--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    import json

    data = json.loads(dry.stdout)
    assert data["dry_run"] is True and [r["path"] for r in data["removed"]] == [r.path for r in expected]
    assert all((ws.home / r.path).exists() for r in expected)
    real = run()
    assert real.returncode == 0, real.stderr
    assert f"removed stage_version {expected[0].path} ({expected[0].bytes:,} bytes)" in real.stdout
    assert (
        f"removed {len(expected)} item(s)" in real.stdout and "kept 14 stage version(s) and 2 bundle(s)" in real.stdout
    )
    assert not any((ws.home / r.path).exists() for r in expected)
