"""Which engine serves a bundle's vectors, and what a second process on the same host needs.

The first retriever over a bundle calibrates the in-memory engine against lancedb and records the
outcome; a new process then serves from ``vectors.arrow`` with the recorded outcome and never
imports lancedb — with exactly the hits lancedb gives."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ragpipe.index.engine_calibration import Calibration, CalibrationRecords, calibration_key
from ragpipe.index.vector import VectorSearcher
from ragpipe.index.vector_file import VECTORS_FILE, read_vectors_file
from ragpipe.index.vector_memory import MemoryVectorSearcher
from ragpipe.retrieval.vector_engine import (
    ENGINE_VARIABLE,
    VectorEngine,
    VectorEngineSettingError,
    vector_engine_setting,
)

CHILD = """
import json, sys
from pathlib import Path
import numpy as np
import pytest
from ragpipe.bundle.verify import open_bundle
from ragpipe.retrieval.retriever import Retriever
bundle = open_bundle(Path(sys.argv[1]), defer_vector_table=True)
r = Retriever(bundle, calibration_dir=Path(sys.argv[2]), vector_engine="auto")
probe = np.asarray(json.loads(sys.argv[3]), dtype=np.float32)
hits = r.vector.search(probe, 8, ("public", "staff"))
print(json.dumps({
    "engine": r.vector.engine,
    "lancedb": "lancedb" in sys.modules,
    "table_checked": bundle.vector_table_checked,
    "hits": [[h.representation_id, h.score] for h in hits],
}))
"""


def _child(bundle: Path, calibrations: Path, probe: np.ndarray) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(bundle), str(calibrations), json.dumps(probe.tolist())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_second_process_follows_the_first_ones_calibration(scoped_bundles, tmp_path: Path):
    """The first retriever calibrates against lancedb and records the outcome; a second process
    finds the record and serves with the same engine and hits — without importing lancedb when
    memory serves. Which engine that is depends on this host's lance kernels; that the record
    decides, and that memory serves lancedb's own hits when it does, does not."""
    full, _ = scoped_bundles
    bundle = tmp_path / full.name
    shutil.copytree(full, bundle)
    calibrations = tmp_path / "calibrations"
    _, matrix = read_vectors_file((bundle / VECTORS_FILE).read_bytes())
    probe = (matrix[0] + matrix[1]).astype(np.float32)

    first = _child(bundle, calibrations, probe)
    assert first["lancedb"] is True  # it calibrated against lancedb
    [record] = calibrations.iterdir()
    problem = json.loads(record.read_text())["value"]["problem"]
    assert first["engine"] == ("memory" if problem is None else "lancedb")
    second = _child(bundle, calibrations, probe)
    assert (second["engine"], second["hits"]) == (first["engine"], first["hits"])
    assert second["lancedb"] is (first["engine"] == "lancedb")

    rows = [tuple(r) for r in json.loads(_rows_json(bundle))]
    lance = VectorSearcher(bundle / "vector", "cosine", rows)
    expected = [[h.representation_id, h.score] for h in lance.search(probe, 8, ("public", "staff"))]
    lance.close()
    if first["engine"] == "memory":
        assert second["hits"] == expected
    else:
        assert [h[0] for h in second["hits"]] == [h[0] for h in expected]


def test_a_recorded_calibration_serves_from_memory_without_lancedb(scoped_bundles, tmp_path: Path):
    """A record saying memory reproduces lancedb (as a host with lance's AVX-512 kernels writes it)
    is enough: the process serves the verified ``vectors.arrow`` from memory, never imports
    lancedb, never checks the deferred lance table, and returns the in-memory engine's hits."""
    from ragpipe.bundle.verify import open_bundle

    full, _ = scoped_bundles
    bundle = tmp_path / full.name
    shutil.copytree(full, bundle)
    manifest = open_bundle(bundle).manifest
    CalibrationRecords(tmp_path / "calibrations").put(
        calibration_key(manifest.material_digest, "cosine", False), Calibration(problem=None)
    )
    _, matrix = read_vectors_file((bundle / VECTORS_FILE).read_bytes())
    probe = (matrix[0] + matrix[1]).astype(np.float32)
    served = _child(bundle, tmp_path / "calibrations", probe)
    rows = [tuple(r) for r in json.loads(_rows_json(bundle))]
    scopes = [tuple(s) for s in json.loads(_scopes_json(bundle))]
    memory = MemoryVectorSearcher("cosine", rows, scopes, matrix, False)
    expected = [[h.representation_id, h.score] for h in memory.search(probe, 8, ("public", "staff"))]
    assert served == {"engine": "memory", "lancedb": False, "table_checked": False, "hits": expected}


def test_a_recorded_refusal_sends_the_bundle_to_lancedb_after_its_table_checks(scoped_bundles, tmp_path: Path):
    """A record naming a problem sends the bundle to lancedb — and the deferred lance-table checks
    run first: the same bundle with its lance table's scopes forged (every digest recomputed) is
    refused, the untouched one serves lancedb's own hits."""
    from ragpipe.bundle.verify import BundleVerificationError, open_bundle
    from ragpipe.retrieval.retriever import Retriever
    from ragpipe_tests.bundle.test_forgery import forged_rows, reseal

    full, _ = scoped_bundles
    for forged in (False, True):
        bundle = tmp_path / str(forged) / full.name
        shutil.copytree(full, bundle)
        if forged:
            from ragpipe.index.vector import build_vector_index

            _, matrix = read_vectors_file((bundle / VECTORS_FILE).read_bytes())
            shutil.rmtree(bundle / "vector")
            build_vector_index(bundle / "vector", forged_rows(bundle), matrix)
            reseal(bundle)
        opened = open_bundle(bundle, key=None, defer_vector_table=True)
        records = CalibrationRecords(tmp_path / str(forged) / "calibrations")
        key = calibration_key(opened.manifest.material_digest, "cosine", False)
        records.put(key, Calibration(problem="probe 0: differs"))
        if forged:
            with pytest.raises(BundleVerificationError, match=r"access_scopes \('public',\) differs"):
                Retriever(opened, calibration_dir=tmp_path / str(forged) / "calibrations", vector_engine="auto")
            continue
        retriever = Retriever(opened, calibration_dir=tmp_path / str(forged) / "calibrations", vector_engine="auto")
        assert retriever.vector_engine == VectorEngine(
            "lancedb", "lancedb: this host's recorded calibration: probe 0: differs"
        )
        _, matrix = read_vectors_file((bundle / VECTORS_FILE).read_bytes())
        lance = VectorSearcher(bundle / "vector", "cosine", retriever.vector.rows)
        assert retriever.vector.search(matrix[2], 8, ("public",)) == lance.search(matrix[2], 8, ("public",))
        lance.close()
        retriever.close()


def _scopes_json(bundle: Path) -> str:
    from ragpipe.bundle.verify import open_bundle
    from ragpipe.index.rows import index_rows

    tables = open_bundle(bundle).tables
    return json.dumps([r.access_scopes for r in index_rows(tables.documents, tables.representations)])


def _rows_json(bundle: Path) -> str:
    from ragpipe.bundle.verify import open_bundle
    from ragpipe.index.rows import index_rows

    tables = open_bundle(bundle).tables
    return json.dumps(
        [[r.representation_id, r.chunk_id, r.document_id] for r in index_rows(tables.documents, tables.representations)]
    )


def test_the_environment_chooses_the_engine_of_every_retriever_not_told_otherwise(scoped_bundles, monkeypatch):
    """``RAGPIPE_VECTOR_ENGINE`` (configuration, read when a retriever opens): ``lancedb`` sends
    the vectors to lancedb with that reason, ``memory`` to memory; an explicit argument wins; a
    value that names no engine is refused in one line naming the variable."""
    from ragpipe.retrieval.retriever import Retriever

    full, _ = scoped_bundles
    monkeypatch.setenv(ENGINE_VARIABLE, "lancedb")
    r = Retriever(full)
    assert r.vector_engine == VectorEngine("lancedb", "lancedb, as the vector engine setting asks")
    explicit = Retriever(r.bundle, vector_engine="memory")
    assert explicit.vector_engine == VectorEngine(
        "memory", "in memory, as the vector engine setting asks (not compared with lancedb)"
    )
    monkeypatch.setenv(ENGINE_VARIABLE, "memory")
    assert Retriever(r.bundle).vector_engine == explicit.vector_engine
    for retriever in (r, explicit):
        retriever.close()
    monkeypatch.setenv(ENGINE_VARIABLE, "lancdb")
    with pytest.raises(VectorEngineSettingError) as err:
        Retriever(r.bundle)
    assert str(err.value) == (
        "RAGPIPE_VECTOR_ENGINE='lancdb' is not a vector engine (set it to one of auto, memory, lancedb, or unset it)"
    )
    assert vector_engine_setting({}) == vector_engine_setting({ENGINE_VARIABLE: " "}) == "auto"
