"""What serves a bundle's vectors, what a new process needs, and that it scores the same everywhere.

A process opening a bundle serves the verified ``vectors.arrow`` with the exact engine: it never
imports lancedb nor reads the (deferred) lance table, and it returns the same hits, score bits
included, with numpy's SIMD dispatch restricted to its baseline as with every kernel this host has.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from ragpipe.index.prefilter import Prefilter
from ragpipe.index.vector_file import VECTORS_FILE, read_vectors_file
from ragpipe.retrieval.vector_engine import VectorEngine

CHILD = """
import json, sys
from pathlib import Path
import numpy as np
from ragpipe.bundle.verify import open_bundle
from ragpipe.retrieval.retriever import Retriever
from ragpipe.index.prefilter import Prefilter
bundle = open_bundle(Path(sys.argv[1]), defer_vector_table=True)
r = Retriever(bundle)
probe = np.asarray(json.loads(sys.argv[2]), dtype=np.float32)
hits = r.vector.search(probe, 8, Prefilter(("public", "staff")))
print(json.dumps({
    "engine": r.vector.engine,
    "lancedb": "lancedb" in sys.modules,
    "table_checked": bundle.vector_table_checked,
    "hits": [[h.representation_id, float(h.score).hex()] for h in hits],
}))
"""


def _child(bundle: Path, probe: np.ndarray, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(bundle), json.dumps(probe.tolist())],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_new_process_serves_vectors_arrow_without_lancedb_and_the_same_bits_on_any_dispatch(
    scoped_bundles, tmp_path: Path
):
    from numpy._core._multiarray_umath import __cpu_dispatch__

    from ragpipe.retrieval.retriever import Retriever

    full, _ = scoped_bundles
    bundle = tmp_path / full.name
    shutil.copytree(full, bundle)
    _, matrix = read_vectors_file((bundle / VECTORS_FILE).read_bytes())
    probe = (matrix[0] + matrix[1]).astype(np.float32)
    served = _child(bundle, probe)
    restricted = _child(bundle, probe, NPY_DISABLE_CPU_FEATURES=" ".join(__cpu_dispatch__))
    here = Retriever(bundle)
    expected = [
        [h.representation_id, float(h.score).hex()]
        for h in here.vector.search(probe, 8, Prefilter(("public", "staff")))
    ]
    here.close()
    assert served == {"engine": "memory", "lancedb": False, "table_checked": False, "hits": expected}
    assert restricted == served and len(expected) == 8


def test_the_engine_is_said_in_words(scoped_bundles):
    from ragpipe.retrieval.retriever import Retriever

    full, _ = scoped_bundles
    retriever = Retriever(full)
    rows = len(retriever.vector.rows)
    size = rows * 384 * 4
    assert retriever.vector_engine == VectorEngine(
        "memory",
        f"exact scores (float64_sequential/v1) in memory: {rows:,} vectors of 384 dimensions, {size:,} bytes"
        + (f" ({size / 2**20:.1f} MiB)" if size >= 2**20 else "")
        + ", read from vectors.arrow",
    )
    assert retriever.vector_engine.as_dict() == {"engine": "memory", "why": retriever.vector.why}
    retriever.close()
