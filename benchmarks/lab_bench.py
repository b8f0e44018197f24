"""The lab's pages: time to interactive in a real browser and server time per view.

    python -m benchmarks.lab_bench [--home var/ragpipe] [--requests 200] [--loads 10] [--port 8792]

State: with ``--home`` (e.g. the ``make demo`` home), a copy of its ``evaluations``, ``bundles``,
``revisions`` and ``work`` folders in a temporary home (the source is only read); without it, the
lab tests' home (``ragpipe_tests.support.lab_state``: two handbook revisions, three runs with
answers). A fresh reviewer key goes into a temporary ``serve.yaml`` (no rate limit), and
``ragpipe serve`` runs as a subprocess on 127.0.0.1. The views: runs list, the newest run, its
ledger, its first case's trace, the comparison of the two newest runs, the first revision's corpus,
and the review queue (``review``: ``/lab/review/{dataset}``, the dataset's first pending case;
``review_all``: ``/lab/review``, every dataset's pending cases then the disputed answers).

Review state: the copied home gets dataset ``bench-drafts`` (target ``staging``) holding one
provisional, model-drafted case per case of ``--review-suite`` (default the demo's
``data/scifact-sample/suite-stable.jsonl``, 101 cases): the suite case's query, its judged
documents as the expected sources (so the page shows their titles and text from the home's
bundles), ``provenance`` ``{author: model}``, ``review: provisional`` — added through
``ragpipe.evaluation.datasets`` as ``ragpipe dataset draft`` adds its drafts, without the model
calls. The lab tests' home gets ``ragpipe_tests.support.review_state`` (two drafts, one person's
case, one disputed answer).

* ``server``: per view, the first request (the run's verification: chain, traces, every metric
  recomputed — then remembered by ledger head) and ``--requests`` more, one at a time over one
  keep-alive httpx connection: p50/p95 ms of each request's round trip on the loopback (the
  server's time plus well under a millisecond of client and socket);
* ``browser``: per view, ``--loads`` navigations in Chromium (Playwright, ``/usr/bin/chromium``,
  the test flags, the session cookie set), each to ``load``; from the Navigation Timing entry, the
  median ``domInteractive`` (time to interactive: the page is parsed and ``lab.js`` may run),
  ``domContentLoadedEventEnd`` and ``loadEventEnd`` (style sheet and script fetched), ms from
  navigation start; and ``keyboard_ms``, the median time at which ``lab.js`` attached its
  ``keydown`` listener to the document (recorded by an init script that wraps
  ``addEventListener`` before any page script runs): on the review pages the queue's shortcuts
  (a, e, r, j, k) work from then on. Once per review view, after the timed loads, pressing ``a``
  without an approver key must set ``#status`` to ``no_key: …`` (the review handler, not another,
  is bound); the run fails otherwise.

Prints one JSON object with the machine (``lscpu`` model, avx2/avx512f) and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx

REPO = Path(__file__).resolve().parent.parent
COPIED = ("evaluations", "bundles", "revisions", "work")
REVIEW_DATASET = "bench-drafts"
REVIEW_SUITE = REPO / "data/scifact-sample/suite-stable.jsonl"
DRAFTED_BY = {"author": "model", "by": "lab-bench", "at": "2026-12-08T00:00:00Z", "model_spec_id": "sha256:" + "b" * 64}


def machine() -> dict[str, object]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = re.search(r"^Model name:\s*(.+)$", lscpu, re.M)
    flags = re.search(r"^Flags:\s*(.+)$", lscpu, re.M)
    have = set(flags.group(1).split()) if flags else set()
    return {
        "cpu": model.group(1).strip() if model else None,
        "cores": os.cpu_count(),
        "avx2": "avx2" in have,
        "avx512f": "avx512f" in have,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def prepare(root: Path, source: Path | None, suite: Path) -> tuple[Path, str]:
    """The home the server reads and the dataset of its review queue: a copy of ``source``'s state
    with ``suite``'s cases as provisional drafts, or the lab tests' home with the review tests'
    state, built here."""
    if source is None:
        from ragpipe_tests.support.lab_state import build_lab_state
        from ragpipe_tests.support.review_state import add_review_state

        state = add_review_state(build_lab_state(root), root / "review", REVIEW_DATASET)
        return state.home, state.dataset
    home = root / "home"
    for name in COPIED:
        if (source / name).is_dir():
            shutil.copytree(source / name, home / name, symlinks=True)
    add_drafts(home, suite, REVIEW_DATASET)
    return home, REVIEW_DATASET


def drafts(suite: Path) -> list:
    """One provisional, model-drafted case per case of ``suite``: its query, its judged documents
    (grade > 0) as the expected sources."""
    from ragpipe.evaluation.suite import Case
    from ragpipe.evaluation.suite_load import load_suite

    out = []
    for case in load_suite(suite).cases:
        expected = tuple(sorted(t for t, grade in case.judgments.items() if grade > 0))
        if not expected:
            continue
        out.append(
            Case(
                id=f"draft-{case.id}",
                query=case.query,
                target_level="document",
                expected=expected,
                provenance=DRAFTED_BY,
                review="provisional",
            )
        )
    return out


def add_drafts(home: Path, suite: Path, name: str) -> int:
    """Dataset ``name`` of target ``staging`` in ``home`` with ``drafts(suite)`` pending; their count."""
    from ragpipe.evaluation.datasets import add_cases, create_dataset

    create_dataset(home, name, "staging", {"dev": 0.5, "holdout": 0.5})
    return add_cases(home, name, drafts(suite))


def views(base: str, client: httpx.Client, home: Path, dataset: str) -> dict[str, str]:
    """The URL of each view: runs from the runs list, the case from the run's ledger (read here, so
    the first request of each page is the server's first look at the run: ``first_ms``)."""
    runs = client.get(f"{base}/lab/runs").text
    ids = re.findall(r'<a href="/lab/runs/([^"/#]+)"><code>', runs)
    created = json.loads((home / "evaluations" / ids[0] / "ledger.jsonl").read_text(encoding="utf-8").splitlines()[0])
    cell = created["payload"]["cells"][0]
    revision = re.search(r'href="(/lab/corpus/[^"]+)"', client.get(f"{base}/lab/corpus").text)
    found = {
        "runs": "/lab/runs",
        "run": f"/lab/runs/{ids[0]}",
        "ledger": f"/lab/runs/{ids[0]}/ledger",
        "trace": f"/lab/runs/{ids[0]}/cases/{quote(cell['case'], safe='')}/{cell['repeat']}",
    }
    if len(ids) > 1:
        found["compare"] = f"/lab/compare?incumbent={ids[1]}&challenger={ids[0]}"
    if revision:
        found["corpus"] = revision.group(1)
    found["review"] = f"/lab/review/{quote(dataset, safe='')}"
    found["review_all"] = "/lab/review"
    return found


def server_times(base: str, client: httpx.Client, paths: dict[str, str], n: int) -> dict[str, dict[str, float]]:
    result = {}
    for name, path in paths.items():
        started = time.perf_counter()
        first = client.get(base + path)
        cold = (time.perf_counter() - started) * 1000
        assert first.status_code == 200, (path, first.status_code)
        took = []
        for _ in range(n):
            started = time.perf_counter()
            client.get(base + path)
            took.append((time.perf_counter() - started) * 1000)
        took.sort()
        result[name] = {
            "first_ms": round(cold, 2),
            "p50_ms": round(statistics.median(took), 2),
            "p95_ms": round(took[max(0, int(0.95 * len(took)) - 1)], 2),
            "bytes": len(first.content),
        }
    return result


NAVIGATION = """() => { const e = performance.getEntriesByType('navigation')[0];
  return [e.domInteractive, e.domContentLoadedEventEnd, e.loadEventEnd, window.__keydown_ms ?? null]; }"""
# Before any page script: remember when the first keydown listener is attached to the document.
KEYDOWN_MARK = """(() => { const add = EventTarget.prototype.addEventListener;
  EventTarget.prototype.addEventListener = function (type, ...rest) {
    if (type === "keydown" && this === document && window.__keydown_ms === undefined) window.__keydown_ms = performance.now();
    return add.call(this, type, ...rest);
  }; })();"""
TIMINGS = ("interactive_ms", "dom_content_loaded_ms", "load_ms", "keyboard_ms")


def check_review_keys(page) -> None:
    """Pressing ``a`` with no approver key loaded answers ``no_key`` in ``#status``: the queue's
    keyboard handler is bound."""
    page.keyboard.press("a")
    page.wait_for_function("() => document.getElementById('status').textContent.startsWith('no_key:')", timeout=10000)


def browser_times(base: str, cookie: str, paths: dict[str, str], loads: int, profile: Path) -> dict[str, dict]:
    from playwright.sync_api import sync_playwright

    from ragpipe_tests.support.browser import CHROMIUM, FLAGS

    result = {}
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=list(FLAGS)
        )
        context.add_cookies([{"name": "ragpipe_lab", "value": cookie, "url": f"{base}/lab/"}])
        context.add_init_script(KEYDOWN_MARK)
        page = context.new_page()
        for name, path in paths.items():
            page.goto(base + path, wait_until="load")  # a first load fills the cache, as a reviewer's would
            marks = []
            for _ in range(loads):
                page.goto(base + path, wait_until="load")
                marks.append(page.evaluate(NAVIGATION))
            result[name] = {
                key: None if any(m[i] is None for m in marks) else round(statistics.median(m[i] for m in marks), 1)
                for i, key in enumerate(TIMINGS)
            }
            if name.startswith("review"):
                check_review_keys(page)
        context.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", type=Path, help="a ragpipe home to copy (default: build the lab tests' home)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--loads", type=int, default=10)
    parser.add_argument("--port", type=int, default=8792)
    parser.add_argument("--review-suite", type=Path, default=REVIEW_SUITE, help="cases drafted into the review queue")
    args = parser.parse_args()
    from ragpipe.server.keys import new_key

    base = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        home, dataset = prepare(root, args.home.resolve() if args.home else None, args.review_suite)
        key, digest = new_key("bench")
        config = root / "serve.yaml"
        config.write_text(
            json.dumps(
                {
                    "keys": [
                        {
                            "id": "bench",
                            "hash": digest,
                            "subject": "bench",
                            "scopes": ["public", "staff"],
                            "roles": ["reviewer"],
                        }
                    ],
                    "limits": {"requests_per_minute": 0},
                }
            ),
            encoding="utf-8",
        )
        env = {**os.environ, "RAGPIPE_HOME": str(home), "PYTHONPATH": str(REPO)}
        server = subprocess.Popen(
            [sys.executable, "-m", "ragpipe.cli", "serve", "--target", "staging", "--port", str(args.port), "--config", str(config)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{base}/healthz", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not start")
                time.sleep(0.05)
            with httpx.Client(timeout=120) as client:
                login = client.post(f"{base}/lab/login", data={"key": key})
                assert login.status_code == 303, login.text
                paths = views(base, client, home, dataset)
                result = {
                    "machine": machine(),
                    "load_average": os.getloadavg(),
                    "state": str(args.home) if args.home else "lab tests' home",
                    "server": server_times(base, client, paths, args.requests),
                }
                cookie = client.cookies["ragpipe_lab"]
            result["browser"] = browser_times(base, cookie, paths, args.loads, root / "profile")
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
