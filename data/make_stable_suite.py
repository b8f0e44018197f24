"""Regenerate data/scifact-sample/suite-stable.jsonl: the cases of suite.jsonl evaluable in both revisions.

``suite.jsonl`` judges documents that exist in only one sample revision for five claims (1379,
1385, 1389 and 1395 judge documents added in revision 2; 1137 judges a document revision 2
removed), so each revision skips some cases and a gate pairing revision 2 with revision 1 would
refuse (skipped cases must be identical on both sides). The stable suite keeps exactly the cases
whose judged documents are all present in rev-1.jsonl *and* rev-2.jsonl, in the canonical suite
encoding (``ragpipe.evaluation.suite.write_suite``), so the pipeline spec's ``evaluation:``
section can gate revision 2 against revision 1 on identical cases. Then it appends the cases of
``suite-additions.jsonl`` (``make_scifact_rev3.py``: claims judging documents revision 3 adds),
so the suite grows with the corpus: revisions 1 and 2 skip those cases, revision 3 evaluates
them, and the gate lists them as new coverage. Deterministic:

    .venv/bin/python data/make_stable_suite.py
"""

from __future__ import annotations

import json
from pathlib import Path

from ragpipe.evaluation.suite import Suite, write_suite
from ragpipe.evaluation.suite_load import load_suite

HERE = Path(__file__).parent / "scifact-sample"


def document_ids(path: Path) -> set[str]:
    return {json.loads(line)["_id"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}


def stable_suite(suite: Suite, *revisions: set[str]) -> Suite:
    """The cases of ``suite`` whose judged documents exist in every one of ``revisions``."""
    common = set.intersection(*revisions)
    return Suite.of((c for c in suite.cases if set(c.judgments) <= common), "suite-stable.jsonl")


def main() -> None:
    suite = load_suite(HERE / "suite.jsonl")
    stable = stable_suite(suite, document_ids(HERE / "rev-1.jsonl"), document_ids(HERE / "rev-2.jsonl"))
    additions = load_suite(HERE / "suite-additions.jsonl").cases
    write_suite(Suite.of([*stable.cases, *additions], "suite-stable.jsonl"), HERE / "suite-stable.jsonl")
    dropped = sorted({c.id for c in suite.cases} - {c.id for c in stable.cases}, key=int)
    print(
        f"{len(stable.cases)} of {len(suite.cases)} cases kept; dropped {', '.join(dropped)}; "
        f"added {', '.join(c.id for c in additions)} (revision 3)"
    )


if __name__ == "__main__":
    main()
