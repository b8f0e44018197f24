"""The nightly loop, timed: ten nights of a living corpus through Dagster's schedule and sensor.

    python -m benchmarks.nightly_loop [--root DIR] [--judged 24] [--unjudged 16]

The scenario of ``ragpipe_tests/defs/test_nightly_loop.py`` (``ragpipe_tests.support.nightly_loop``):
documents added, edited and deleted, the suite growing and shrinking with them, one night that
truncates half of the judged documents, one that changes the chunker. For each night it prints the
change kind, the outcome, what staging serves, the texts embedded (``embeddings`` stage:
``encoded``; the rest come from the cache) and the wall time from the schedule tick to the end of
the sensor's activation run (build, evaluation of both arms, gate, release, activation). Prints one
JSON object per night, then a summary line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pytest

from ragpipe_tests.support.nightly_loop import NightlyLoop, ten_nights


def run(root: Path, judged: int, unjudged: int) -> list[dict]:
    loop = NightlyLoop(root, base_judged=judged, base_unjudged=unjudged)
    with pytest.MonkeyPatch.context() as mp:
        ten_nights(loop, mp)
    loop.close()
    out = loop.nights
    return [
        {
            "night": n.number,
            "documents": n.documents,
            "cases": n.cases,
            "change": n.change,
            "eligible": n.eligible,
            "first_reason": n.reasons[0] if n.reasons else None,
            "new_coverage": len(n.new_coverage),
            "lost_coverage": len(n.lost_coverage),
            "live_on_staging": n.staging == n.release_id,
            "encoded": n.encoded,
            "seconds": round(n.seconds, 1),
        }
        for n in out
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=None)
    ap.add_argument("--judged", type=int, default=24)
    ap.add_argument("--unjudged", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(args.root or Path(tmp) / "loop", args.judged, args.unjudged)
    for row in rows:
        print(json.dumps(row))
    later = rows[1:]
    print(
        json.dumps(
            {
                "first_night_seconds": rows[0]["seconds"],
                "later_nights_mean_seconds": round(sum(r["seconds"] for r in later) / len(later), 1),
                "encoded_per_night": [r["encoded"] for r in rows],
            }
        )
    )


if __name__ == "__main__":
    main()
