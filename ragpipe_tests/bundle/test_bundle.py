"""Bundles: verification fails closed on any tampering; publication is atomic under SIGKILL."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragpipe.bundle.build import BUNDLE_PUBLISH_STEPS
from ragpipe.bundle.manifest import MANIFEST_NAME, bundle_id_of
from ragpipe.bundle.verify import BundleVerificationError, open_bundle
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import PipelineSpec, VectorIndexSpec
from ragpipe.stages import steps


def bundle_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def refusal(path: Path) -> str:
    with pytest.raises(BundleVerificationError) as info:
        open_bundle(path)
    return str(info.value)


def test_built_bundle_verifies_and_is_complete(built_workspace):
    ws, spec = built_workspace
    record = steps.read_stage_record(ws, "hb", "index_bundle", spec)
    bundle = open_bundle(ws.located(str(record.facts["bundle_path"])))
    counts = bundle.manifest.semantic.counts
    assert (counts.documents, counts.chunks, counts.representations, counts.vectors) == (3, 4, 8, 8)
    assert bundle.bundle_id == record.data_version == bundle_id_of(bundle.manifest.semantic)
    assert bundle.manifest.semantic.corpus_digest == steps.read_stage_record(ws, "hb", "source_snapshot").data_version
    listed = sorted(f.path for f in bundle.manifest.files)
    assert listed == [f for f in bundle_files(bundle.path) if f != MANIFEST_NAME]
    assert {"documents.parquet", "chunks.parquet", "representations.parquet"} <= set(listed)
    assert any(f.startswith("lexical/") for f in listed) and any(f.startswith("vector/") for f in listed)


def test_every_file_tampered_every_way_is_refused_by_name(bundle_copy: Path, tmp_path: Path):
    files = bundle_files(bundle_copy)
    assert len(files) >= 10
    pristine = tmp_path / "pristine"
    shutil.copytree(bundle_copy, pristine)
    cases = 0
    for rel in files:
        for how in ("flip", "truncate", "delete", "symlink"):
            shutil.rmtree(bundle_copy)
            shutil.copytree(pristine, bundle_copy)
            target = bundle_copy / rel
            data = target.read_bytes()
            if how == "flip":
                if not data:
                    continue
                target.write_bytes(bytes([data[0] ^ 0x01]) + data[1:])
            elif how == "truncate":
                if not data:
                    continue
                target.write_bytes(data[:-1])
            elif how == "delete":
                target.unlink()
            else:
                target.unlink()
                target.symlink_to(pristine / rel)
            message = refusal(bundle_copy)
            name = MANIFEST_NAME if rel == MANIFEST_NAME else rel
            assert name in message, (rel, how, message)
            cases += 1
    shutil.rmtree(bundle_copy)
    shutil.copytree(pristine, bundle_copy)
    (bundle_copy / "lexical" / "stray.bin").write_bytes(b"x")
    assert "lexical/stray.bin: extra file not listed in the manifest" in refusal(bundle_copy)
    empty = sum(1 for rel in files if (pristine / rel).stat().st_size == 0)  # tantivy lock files
    assert cases == 4 * len(files) - 2 * empty


def test_edited_manifest_is_refused(bundle_copy: Path):
    manifest = json.loads((bundle_copy / MANIFEST_NAME).read_text())
    manifest["semantic"]["counts"]["chunks"] += 1
    (bundle_copy / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    assert "bundle_id does not match the manifest's semantic fields (manifest edited)" in refusal(bundle_copy)
    (bundle_copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert "bytes are not the canonical rendering" in refusal(bundle_copy)


def test_consistently_forged_counts_are_refused(bundle_copy: Path, tmp_path: Path):
    """A manifest re-sealed after editing counts still fails the content checks."""
    from ragpipe.bundle.manifest import BundleManifest, make_manifest, manifest_bytes

    m = BundleManifest.model_validate_json((bundle_copy / MANIFEST_NAME).read_text())
    forged_sem = m.semantic.model_copy(update={"counts": m.semantic.counts.model_copy(update={"chunks": 5})})
    forged = make_manifest(forged_sem, m.material.embeddings_digest, m.files, None)
    target = tmp_path / forged.bundle_id.hex
    shutil.copytree(bundle_copy, target)
    (target / MANIFEST_NAME).write_bytes(manifest_bytes(forged))
    assert "chunks.parquet: chunk count 4 differs from manifest count 5" in refusal(target)


def test_symlinked_or_misnamed_bundle_is_refused(bundle_copy: Path, tmp_path: Path):
    link = tmp_path / "link"
    link.symlink_to(bundle_copy)
    assert "bundle path is a symlink" in refusal(link)
    renamed = tmp_path / "renamed"
    shutil.copytree(bundle_copy, renamed)
    assert "directory name 'renamed' is not the bundle ID hex" in refusal(renamed)
    assert "not a bundle directory" in refusal(tmp_path / "missing")


def copy_workspace(src: Workspace, dst: Path) -> Workspace:
    shutil.copytree(src.home, dst, ignore=shutil.ignore_patterns("bundles"))
    return Workspace(dst)


def test_rebuild_reuses_existing_bundle_byte_for_byte(built_workspace, tmp_path: Path):
    ws, spec = built_workspace
    bundle_dir = ws.located(str(steps.read_stage_record(ws, "hb", "index_bundle").facts["bundle_path"]))
    before = {f: (bundle_dir / f).read_bytes() for f in bundle_files(bundle_dir)}
    inode = bundle_dir.stat().st_ino
    # Re-materialize the indexes (new, non-byte-identical tantivy/lance files), then the bundle.
    steps.run_lexical_index(ws, "hb", spec)
    steps.run_vector_index(ws, "hb", spec)
    result = steps.run_index_bundle(ws, "hb", spec)
    assert result.metadata["publication"] == "existing"
    assert result.data_version == open_bundle(bundle_dir).bundle_id
    assert bundle_dir.stat().st_ino == inode
    assert {f: (bundle_dir / f).read_bytes() for f in bundle_files(bundle_dir)} == before


def test_lexical_only_bundle_is_valid(built_workspace, tmp_path: Path):
    ws, spec = built_workspace
    lex_spec = PipelineSpec.model_validate(
        {**spec.model_dump(by_alias=True), "vector_index": VectorIndexSpec(enabled=False).model_dump()}
    )
    ws2 = copy_workspace(ws, tmp_path / "home")
    for run in steps.BUILD_STEPS:
        run(ws2, "hb", lex_spec)
    record = steps.read_stage_record(ws2, "hb", "embeddings", lex_spec)
    assert record.facts == {"enabled": False}
    bundle = open_bundle(ws2.located(str(steps.read_stage_record(ws2, "hb", "index_bundle").facts["bundle_path"])))
    assert not bundle.manifest.semantic.has_vector_index
    assert bundle.manifest.semantic.counts.vectors == 0
    assert sorted(bundle.manifest.semantic.specs) == ["chunks", "lexical_index", "representations", "source_snapshot"]
    assert not any(f.path.startswith("vector/") for f in bundle.manifest.files)


CRASH_SCRIPT = """
import os, signal, sys
from pathlib import Path
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages import steps
from ragpipe.kernel.workspace import Workspace

target = sys.argv[2]
def hook(step):
    if step == target:
        os.kill(os.getpid(), signal.SIGKILL)
steps.run_index_bundle(Workspace(Path(sys.argv[1])), "hb", load_pipeline_spec(), on_step=hook)
"""


def visible_bundles(ws: Workspace) -> list[Path]:
    return [p for p in ws.bundles.iterdir() if not p.name.startswith(".")] if ws.bundles.exists() else []


@pytest.mark.parametrize("step", BUNDLE_PUBLISH_STEPS)
def test_sigkill_at_every_publication_step(built_workspace, tmp_path: Path, step: str):
    ws, spec = built_workspace
    ws2 = copy_workspace(ws, tmp_path / "home")
    shutil.rmtree(ws2.stage_dir("hb", "index_bundle"))
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(ws2.home), step], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    visible = visible_bundles(ws2)
    if BUNDLE_PUBLISH_STEPS.index(step) < BUNDLE_PUBLISH_STEPS.index("renamed"):
        assert visible == []
        assert [p.name.startswith(".tmp-") for p in ws2.bundles.iterdir()] == [True]  # the dead builder's temp
    else:
        (only,) = visible
        open_bundle(only)
    # A rerun succeeds, cleans the dead builder's temp and publishes (or reuses) one valid bundle.
    result = steps.run_index_bundle(ws2, "hb", spec)
    (only,) = visible_bundles(ws2)
    assert open_bundle(only).bundle_id == result.data_version
    assert [p.name for p in ws2.bundles.iterdir()] == [only.name]


def _race(home: str, barrier) -> str:
    from ragpipe.spec import load_pipeline_spec

    barrier.wait()
    return steps.run_index_bundle(Workspace(Path(home)), "hb", load_pipeline_spec()).metadata["publication"]


def test_racing_builders_leave_one_valid_bundle(built_workspace, tmp_path: Path):
    ws, _ = built_workspace
    ws2 = copy_workspace(ws, tmp_path / "home")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(2)
        with ctx.Pool(2) as pool:
            outcomes = pool.starmap(_race, [(str(ws2.home), barrier)] * 2)
    assert sorted(outcomes) == ["existing", "published"]
    (only,) = visible_bundles(ws2)
    open_bundle(only)
    assert [p.name for p in ws2.bundles.iterdir()] == [only.name]
    assert os.listdir(ws2.bundles) == [only.name]
