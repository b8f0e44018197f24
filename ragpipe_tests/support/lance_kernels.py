"""Whether this host's lancedb computes the float32 distances the in-memory engine reproduces.

``ragpipe.index.vector_memory`` reproduces, bit for bit, the kernels lance picks on an AVX-512 host;
on other CPUs lance picks others for some metrics (on an AVX2 host here: cosine flat scans and every
IVF_FLAT table differ, dot and l2 flat scans agree). The laws "memory searches exactly as lancedb"
hold only where the kernels agree, so they ask ``require_lance_kernels(metric, indexed)`` first:
it runs the engine's own calibration (``calibration_problem``) on real lance tables of the law's
kind — 32, 48 and 384 dimensions, fixed seeds — once per process, and skips the law with the host's
reason where any of them differs on a CPU without AVX-512. On a CPU with AVX-512 nothing is
skipped: there the law must hold, so a regression of the engine fails it instead of hiding. Everything else about the in-memory engine is host-independent
numpy arithmetic and is tested on every host.
"""

from __future__ import annotations

import re
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from ragpipe.index.engine_calibration import cpu_flags
from ragpipe.index.ivf import IVF_MIN_ROWS
from ragpipe.index.rows import IndexRow
from ragpipe.index.vector import VectorSearcher, build_vector_index
from ragpipe.index.vector_memory import MemoryVectorSearcher, calibration_problem

DIMENSIONS = (32, 48, 384)


@cache
def lance_kernel_problem(metric: str, indexed: bool) -> str | None:
    """Why lancedb's distances differ from the in-memory engine's on this host for ``metric``
    tables with (``indexed``) or without an IVF_FLAT index (None: they are bitwise equal)."""
    n = IVF_MIN_ROWS + 16 if indexed else 300
    rng = np.random.default_rng(20261206)
    rows = [IndexRow(f"r{i}", f"c{i}", f"d{i}", "raw", "", ("public",), "primary") for i in range(n)]
    ids = [(r.representation_id, r.chunk_id, r.document_id) for r in rows]
    with tempfile.TemporaryDirectory() as tmp:
        for dim in DIMENSIONS:
            vectors = rng.standard_normal((n, dim)).astype(np.float32)
            build_vector_index(Path(tmp) / str(dim), rows, vectors, metric)
            lance = VectorSearcher(Path(tmp) / str(dim), metric, ids)
            try:
                memory = MemoryVectorSearcher(metric, ids, [r.access_scopes for r in rows], vectors, lance.indexed)
                problem = calibration_problem(memory, lance, [r.access_scopes for r in rows])
            finally:
                lance.close()
            if problem is not None:
                return f"{dim} dimensions: {problem}"
    return None


def require_lance_kernels(metric: str, indexed: bool) -> None:
    """Skip the calling law, with this host's reason, where lancedb's kernels for ``metric``
    (``indexed``: IVF_FLAT, else flat scans) are not the ones the in-memory engine reproduces."""
    if "avx512f" in cpu_flags():
        return  # the kernels the engine reproduces: the law must hold here, and fails if it does not
    problem = lance_kernel_problem(metric, indexed)
    if problem is not None:
        pytest.skip(
            f"lance's {metric} {'IVF_FLAT' if indexed else 'flat-scan'} kernels on this CPU (without AVX-512) "
            f"are not the ones the in-memory engine reproduces: {problem}"
        )


# The one warning a host may print where its lance kernels are not the in-memory engine's
# (``ragpipe.index.vector_memory``): legitimate on such a host, so no stderr check of a test about
# something else may fail on it. The summary, ``bundle inspect`` and ``/readyz`` say it in words.
HOST_ENGINE_WARNING = re.compile(
    r"vector search of \S+ served by lancedb, not from memory: probe \d+: lance's distances differ from the "
    r"in-memory kernels \(another lance build or CPU\)"
)


def without_host_engine_warning(stderr: str) -> list[str]:
    """The lines of ``stderr`` but the host engine warning."""
    return [line for line in stderr.splitlines() if not HOST_ENGINE_WARNING.fullmatch(line)]


def main() -> int:
    """``python -m ragpipe_tests.support.lance_kernels``: exit 0 when the in-memory engine serves
    the project's cosine bundles on this host (so ``make test`` must run the vector tests again
    with lancedb forced, to prove that path here too), 3 when lancedb serves them already (the
    suite's first pass took that path); one line on stdout says which."""
    problem = lance_kernel_problem("cosine", indexed=False)
    if problem is None:
        print("this host's lance kernels are the in-memory engine's: the vector tests run again with lancedb forced")
        return 0
    print(f"lancedb already served the suite's vectors on this host (its lance kernels differ: {problem})")
    return 3


if __name__ == "__main__":
    raise SystemExit(main())
