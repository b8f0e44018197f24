"""What one `ragpipe` command costs a new process: wall time and the modules it imports.

    python -m benchmarks.cli_startup --home var/ragpipe --repeat 5 [--source DIR] -- query "aspirin" --k 3 --json
    python -m benchmarks.cli_startup --home var/ragpipe -- build data/scifact-sample/rev-1.jsonl -r scifact-1 --json

Each repeat starts a fresh interpreter that runs the `ragpipe` command's entry point exactly as the
console script does (``ragpipe.cli.main``) with the given arguments (default: ``query TEXT --k 3
--json`` against the home's active release), and reports, from inside that process at exit, how
many ``ragpipe`` modules and how many modules in all it imported, and which of the heavy libraries
(torch, transformers, sentence_transformers, onnxruntime, lancedb, tantivy). ``$DAGSTER_HOME`` is
passed on as set (a build needs it). ``--source DIR`` puts another checkout first on ``sys.path``
(to measure an earlier layout against the same home). One run before the measured ones warms the
page cache and, for a query, the home's query-graph cache (``query_graphs/``): it creates the
embedder's entry if there is none, so the measured runs are a warm machine's; the report says how
many entries there were before and after it, and how long it took. Prints one JSON object: wall
seconds per repeat (min and median), the module counts, the warm-up and the command's exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import atexit, json, sys
HEAVY = ("torch", "transformers", "sentence_transformers", "onnxruntime", "lancedb", "tantivy")
def report():
    names = sorted(sys.modules)
    ours = [n for n in names if n == "ragpipe" or n.startswith("ragpipe.")]
    counts = {"ragpipe": len(ours), "all": len(names), "source": sys.modules["ragpipe"].__file__,
              "heavy": [n for n in HEAVY if n in sys.modules]}
    sys.stderr.write("\\nMODULES " + json.dumps(counts) + "\\n")
atexit.register(report)
sys.argv = ["ragpipe", *sys.argv[1:]]
from ragpipe.cli import main
main()
"""


def run_once(home: Path, args: list[str], source: Path | None) -> tuple[float, dict[str, object], int]:
    env = {**os.environ, "RAGPIPE_HOME": str(home), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if source is not None:
        env["PYTHONPATH"] = str(source)
    started = time.perf_counter()
    # cwd outside any checkout: `python -c` puts the working directory first on sys.path
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tempfile.gettempdir(),
    )
    wall = time.perf_counter() - started
    line = next((ln for ln in done.stderr.splitlines() if ln.startswith("MODULES ")), None)
    if line is None:
        raise SystemExit(f"the query process reported no module counts (exit {done.returncode}): {done.stderr[-2000:]}")
    return wall, json.loads(line[len("MODULES ") :]), done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a $RAGPIPE_HOME with an active release")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("command", nargs="*", help="the ragpipe command line (after --)")
    parser.add_argument("--source", type=Path, default=None, help="a checkout to import ragpipe from instead")
    args = parser.parse_args()
    command = args.command or ["query", "Aspirin reduces the risk of cardiovascular events", "--k", "3", "--json"]
    home = args.home.resolve()
    entries_before = query_graph_entries(home)
    # warm the page cache (and create a missing query-graph entry): the figure is a warm machine's
    warmup, _, _ = run_once(home, command, args.source)
    runs = [run_once(home, command, args.source) for _ in range(args.repeat)]
    walls = [round(w, 3) for w, _, _ in runs]
    print(
        json.dumps(
            {
                "wall_seconds": walls,
                "min": min(walls),
                "median": statistics.median(walls),
                "modules": runs[-1][1],
                "exit_code": runs[-1][2],
                "command": command,
                "warmup": {
                    "wall_seconds": round(warmup, 3),
                    "query_graph_entries_before": entries_before,
                    "query_graph_entries_after": query_graph_entries(home),
                },
            }
        )
    )


def query_graph_entries(home: Path) -> int:
    """Published entries of the home's query-graph cache (temp and trash siblings not counted)."""
    folder = home / "query_graphs"
    return sum(1 for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else 0


if __name__ == "__main__":
    main()
