"""What a cell's custody costs on its own: the evaluation overhead, taken apart in one process.

    python -m benchmarks.custody_floor --bundle PATH [--scifact ../shared/datasets/scifact]
        [--mode hybrid] [--k 1000] [--warmup 300] [--limit N] [--file-bytes 167000]

After a warm-up of bare queries (``--warmup``, default every test claim: the retriever builds each
hit's evidence once, so no variant pays for that when it happens to run first on a claim), for each
SciFact test claim, in a seeded random order (so a drift in machine speed, and the
collector and writeback work one variant leaves behind, fall on every variant alike), under the collector setting the runner's cells run under (``long_lived_heap_frozen``):

* ``bare`` — ``Retriever.query(text, k, mode)``, what the evaluation benchmark divides by;
* ``rankings`` — the same query keeping its rankings (``rankings=True``), which the trace needs;
* ``durable`` — what the ledger's custody requires of every cell before the next starts, and nothing else: a
  fsynced ``CellStarted`` append (head rewritten), the query with its rankings kept, a fsynced
  ``CellCompleted`` append of a real record's size;
* ``durable+file`` — plus publishing ``--file-bytes`` of random bytes (a trace's size; different
  bytes for every claim) as a new file, as a trace is published (``write_file_atomic``: write,
  fsync, rename, folder fsync), nothing built or encoded: what custody costs with one durable
  file per cell, whatever the file's format;
* ``durable+trace`` — plus the required trace instead: the hits collapsed to the case's target level, the
  trace table (per-channel hits, fused, final, collapsed) and its atomic Parquet write;
* ``cell`` — the runner's own cell (``run_cell``: the above plus metrics through ir_measures and the
  safety metric) between the two appends.

Appends go through the kernel ledger with the evaluation run's hash domain — the code path of
``evaluation.ledger.Ledger.append`` without its state-machine check (a few microseconds). Prints
one JSON object: milliseconds per claim and each variant's ratio to ``bare``. The ratio of
``durable+trace`` is the least a run keeping traces in today's format can reach on this machine,
that of ``durable+file`` the custody cost of one durable file per cell before anything is built
or encoded (no metrics, no reducer; docs/benchmarks.md, "Custody floor"). Each variant writes its own trace files, so none replaces
another's (the runner never replaces a trace).
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.eval_bench import scifact_arguments, scifact_evaluation
from ragpipe.evaluation.cell import run_cell
from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import DOMAIN
from ragpipe.evaluation.metrics import collapse
from ragpipe.evaluation.run_state import cell_dict
from ragpipe.evaluation.runner import long_lived_heap_frozen
from ragpipe.evaluation.suite import Case
from ragpipe.evaluation.traces import TRACES, hit_table, trace_name, write_trace
from ragpipe.kernel.ids import bytes_digest
from ragpipe.kernel.ledger import Ledger
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever

Variant = Callable[[Case, int], None]


def variants(
    retriever: Retriever, spec: EvaluationSpec, run: Path, ledger: Ledger, payloads: Sequence[bytes]
) -> dict[str, Variant]:
    """The six variants of the module docstring, each a function of (case, position);
    ``durable+file`` publishes ``payloads[position]``."""
    body = spec.body
    subject = Subject.default()

    def closing(case: Case, trace: dict[str, object]) -> dict[str, object]:
        # a CellCompleted payload of the real record's shape and size
        metrics = {m.name: 0.123456789 for m in body.ranking_metrics()} | {"unauthorized_disclosures": 0}
        return {
            "cell": cell_dict((case.id, 0, body.arm)),
            "outcome": "success",
            "metrics": metrics,
            "latency_ms": 40.123,
            "hits": body.k,
            "trace": trace,
        }

    def bare(case: Case, _position: int) -> None:
        retriever.query(case.query, subject, k=body.k, mode=body.mode)

    def kept(case: Case, _position: int) -> None:
        retriever.query(case.query, subject, k=body.k, mode=body.mode, rankings=True)

    def durable(case: Case, position: int, keep_trace: bool = False) -> None:
        cell = cell_dict((case.id, 0, body.arm))
        ledger.append("CellStarted", {"cell": cell})
        result = retriever.query(case.query, subject, k=body.k, mode=body.mode, rankings=True)
        trace: dict[str, object] = {
            "file": trace_name(position),
            "digest": "sha256:" + "0" * 64,
            "rows": 4806,
            "bytes": 170000,
        }
        if keep_trace:
            if result.rankings is None:
                raise RuntimeError("the retriever returned no rankings")
            targets = collapse([(str(h["document_id"]), str(h["chunk_id"])) for h in result.hits], case.target_level)
            table = hit_table(cell, result.rankings, result.hits, targets)
            trace = write_trace(run, f"{TRACES}/durable-{position:06d}.parquet", table, closing(case, trace))
        ledger.append("CellCompleted", closing(case, trace))

    def with_trace(case: Case, position: int) -> None:
        durable(case, position, keep_trace=True)

    def with_file(case: Case, position: int) -> None:
        cell = cell_dict((case.id, 0, body.arm))
        ledger.append("CellStarted", {"cell": cell})
        retriever.query(case.query, subject, k=body.k, mode=body.mode, rankings=True)
        name, payload = f"{TRACES}/file-{position:06d}.parquet", payloads[position]
        write_file_atomic(run / name, payload)
        ledger.append(
            "CellCompleted",
            closing(case, {"file": name, "digest": bytes_digest(payload), "rows": 4806, "bytes": len(payload)}),
        )

    def cell(case: Case, position: int) -> None:
        key = (case.id, 0, body.arm)
        ledger.append("CellStarted", {"cell": cell_dict(key)})
        _kind, payload = run_cell(retriever, body, case, key, position, run)  # traces/cell-<position>
        ledger.append("CellCompleted", payload)

    return {
        "bare": bare,
        "rankings": kept,
        "durable": durable,
        "durable+file": with_file,
        "durable+trace": with_trace,
        "cell": cell,
    }


def main() -> None:
    ap = scifact_arguments(warmup=300)
    ap.add_argument(
        "--file-bytes",
        type=int,
        default=167_000,
        help="size of the durable+file variant's file (a SciFact trace at k = 1000: ~167 KB)",
    )
    args = ap.parse_args()
    suite, _plan, retriever, spec = scifact_evaluation(args)
    work = Path(tempfile.mkdtemp(prefix="custody-floor-"))
    (work / TRACES).mkdir()
    ledger = Ledger.create(work / "ledger.jsonl", DOMAIN)
    # one payload per claim, made before timing: no two files share bytes, and no variant pays for them
    payloads = [os.urandom(args.file_bytes) for _ in range(len(suite.cases) + 1)]
    run = variants(retriever, spec, work, ledger, payloads)
    names = list(run)
    for case in suite.cases[: args.warmup]:
        run["bare"](case, 0)
    seconds = dict.fromkeys(names, 0.0)
    load_at_start = os.getloadavg()
    with long_lived_heap_frozen():
        order = random.Random(0)
        for i, case in enumerate(suite.cases):
            for name in order.sample(names, len(names)):
                started = time.perf_counter()
                run[name](case, i + 1)
                seconds[name] += time.perf_counter() - started
    ledger.close()
    retriever.close()
    shutil.rmtree(work)
    n = len(suite.cases)
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
                "bundle_id": retriever.bundle_id,
                "mode": args.mode,
                "k": args.k,
                "cases": n,
                "file_bytes": args.file_bytes,
                "ms_per_case": {name: round(s * 1000 / n, 2) for name, s in seconds.items()},
                "ratio_to_bare": {name: round(s / seconds["bare"], 3) for name, s in seconds.items()},
                "load_average": {
                    "start": [round(x, 2) for x in load_at_start],
                    "end": [round(x, 2) for x in os.getloadavg()],
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
