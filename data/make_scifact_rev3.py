"""Write data/scifact-sample/rev-3.jsonl and suite-additions.jsonl: a revision that only adds content.

Revision 3 is revision 2 plus the judged abstracts of 2 further SciFact test claims (each judging
exactly one abstract revision 2 lacks) and 3 distractor abstracts — nothing edited or removed.
``suite-additions.jsonl`` holds the cases of those 2 claims (canonical suite JSONL);
``make_stable_suite.py`` appends them to the stable suite, so the suite grows with the corpus:
revisions 1 and 2 skip them (their judged documents are missing), revision 3 evaluates them, and
the gate pairs revision 3 with revision 2 on the shared cases and lists these 2 as new coverage
(README, "make demo"). Deterministic (its own seed; revisions 1 and 2 are not touched):

    .venv/bin/python data/make_scifact_rev3.py [--source ../shared/datasets/scifact]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import random
from pathlib import Path

from ragpipe.evaluation.suite import Case, Suite, write_suite

HERE = Path(__file__).parent / "scifact-sample"
SEED = 20261207
CLAIMS, DISTRACTORS = 2, 3


def corpus_ids(path: Path) -> list[str]:
    return [json.loads(line)["_id"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=Path, default=Path(__file__).parent.parent.parent / "shared/datasets/scifact")
    args = ap.parse_args()
    with gzip.open(args.source / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        corpus = {d["_id"]: d for d in map(json.loads, fh)}
    queries = {q["_id"]: q for q in map(json.loads, (args.source / "queries.jsonl").open(encoding="utf-8"))}
    qrels: dict[str, set[str]] = {}
    with (args.source / "qrels" / "test.tsv").open() as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            qrels.setdefault(row["query-id"], set()).add(row["corpus-id"])
    rev2 = corpus_ids(HERE / "rev-2.jsonl")
    known = {json.loads(line)["_id"] for line in (HERE / "queries.jsonl").read_text(encoding="utf-8").splitlines()}
    rng = random.Random(SEED)
    fresh = sorted(
        (q for q, docs in qrels.items() if q not in known and len(docs) == 1 and not docs & set(rev2)), key=int
    )
    claims = sorted(rng.sample(fresh, CLAIMS), key=int)
    judged = sorted({d for q in claims for d in qrels[q]}, key=int)
    every_judged = set().union(*qrels.values())
    pool = sorted(set(corpus) - set(rev2) - every_judged, key=int)
    added = judged + sorted(rng.sample(pool, DISTRACTORS), key=int)
    docs = [json.loads(line) for line in (HERE / "rev-2.jsonl").read_text(encoding="utf-8").splitlines()]
    docs += [{"_id": d, "title": corpus[d]["title"], "text": corpus[d]["text"]} for d in added]
    with (HERE / "rev-3.jsonl").open("w", encoding="utf-8") as fh:
        for d in sorted(docs, key=lambda d: d["_id"]):
            fh.write(json.dumps({"_id": d["_id"], "title": d["title"], "text": d["text"]}, ensure_ascii=False) + "\n")
    cases = [
        Case(id=q, query=queries[q]["text"], target_level="document", judgments={d: 1 for d in sorted(qrels[q])})
        for q in claims
    ]
    write_suite(Suite.of(cases, "suite-additions.jsonl"), HERE / "suite-additions.jsonl")
    print(
        f"rev-3: {len(docs)} documents, added {', '.join(added)}; cases {', '.join(claims)} judge {', '.join(judged)}"
    )


if __name__ == "__main__":
    main()
