"""Regenerate data/scifact-sample from ../shared/datasets/scifact (deterministic, seed fixed).

Revision 1: 300 SciFact abstracts — the judged documents of 100 test claims plus distractors —
ingested with a defect: 24 judged abstracts were cut after their first sentence.
Revision 2: revision 1 with those 24 abstracts repaired (full text), 9 documents edited (wording and
figure corrections, appended notes, one retitled), 9 removed and 9 added (including the judged
documents of 4 further claims). The repair is what a corpus refresh is for: the gate measures
whether revision 2 answers the stable suite better than revision 1 (see README, "make demo").
Judgments are written per revision; a removed document's judgments are dropped with it.

    python data/make_scifact_sample.py [--source ../shared/datasets/scifact]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import random
import re
from pathlib import Path

HERE = Path(__file__).parent / "scifact-sample"
SEED = 20261129
REPAIRED = 24  # judged abstracts truncated in revision 1 and repaired in revision 2

EDITS = [
    ("replace", " significantly ", " substantially "),
    ("replace", " patients ", " participants "),
    ("replace", " increased ", " raised "),
    ("append", "", " These findings were confirmed in a follow-up analysis of the same cohort."),
    ("append", "", " Correction: the sample size reported in an earlier version of this abstract was misstated."),
    ("replace", " we ", " the authors "),
    ("append", "", " Data and code are available from the corresponding author on request."),
    ("replace", " associated with ", " linked to "),
    ("title", "", " (revised)"),
]


def load(source: Path):
    with gzip.open(source / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        corpus = {d["_id"]: d for d in map(json.loads, fh)}
    queries = {q["_id"]: q for q in map(json.loads, (source / "queries.jsonl").open(encoding="utf-8"))}
    qrels: dict[str, set[str]] = {}
    with (source / "qrels" / "test.tsv").open() as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            qrels.setdefault(row["query-id"], set()).add(row["corpus-id"])
    return corpus, queries, qrels


def edit(doc: dict, rule: tuple[str, str, str]) -> dict:
    kind, old, new = rule
    doc = dict(doc)
    if kind == "title":
        doc["title"] = doc["title"].rstrip(".") + new
    elif kind == "append":
        doc["text"] = doc["text"] + new
    else:
        if old not in doc["text"]:
            doc["text"] = doc["text"] + " (Revised for clarity.)"
        else:
            doc["text"] = doc["text"].replace(old, new, 1)
    return doc


def first_sentence(doc: dict) -> dict:
    """``doc`` with its text cut after the first sentence (". " followed by a capital letter)."""
    match = re.search(r"\. (?=[A-Z])", doc["text"])
    return dict(doc, text=doc["text"][: match.start() + 1]) if match else doc


def write_corpus(path: Path, docs: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for d in sorted(docs, key=lambda d: d["_id"]):
            fh.write(json.dumps({"_id": d["_id"], "title": d["title"], "text": d["text"]}, ensure_ascii=False) + "\n")


def write_qrels(path: Path, qrels: dict[str, set[str]], present: set[str]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for qid in sorted(qrels, key=int):
            for did in sorted(qrels[qid] & present, key=int):
                fh.write(f"{qid}\t{did}\t1\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=Path, default=Path(__file__).parent.parent.parent / "shared/datasets/scifact")
    args = ap.parse_args()
    corpus, queries, qrels = load(args.source)
    rng = random.Random(SEED)
    test_ids = sorted(qrels, key=int)
    chosen = sorted(rng.sample(test_ids, 104), key=int)
    q1, q2_extra = chosen[:100], chosen[100:]
    judged1 = set().union(*(qrels[q] for q in q1))
    pool = sorted(set(corpus) - judged1 - set().union(*(qrels[q] for q in test_ids)), key=int)
    distractors = rng.sample(pool, 300 - len(judged1))
    rev1_ids = sorted(judged1 | set(distractors), key=int)
    rev1 = {i: corpus[i] for i in rev1_ids}

    removable = sorted(set(distractors), key=int)
    removed = set(rng.sample(removable, 8)) | {sorted(judged1, key=int)[0]}
    editable = sorted(set(rev1_ids) - removed, key=int)
    edited = rng.sample(editable, len(EDITS))
    judged2_extra = set().union(*(qrels[q] for q in q2_extra)) - set(rev1_ids)
    added_pool = sorted(set(pool) - set(distractors), key=int)
    added = sorted(judged2_extra, key=int)[:9]
    added += rng.sample(added_pool, 9 - len(added))
    rev2 = {i: d for i, d in rev1.items() if i not in removed}
    for doc_id, rule in zip(edited, EDITS):
        rev2[doc_id] = edit(rev2[doc_id], rule)
    for doc_id in added:
        rev2[doc_id] = corpus[doc_id]
    # Drawn from a generator of its own so every choice above stays what it was before the repair
    # existed: revision 2 is byte-identical; only revision 1's copies of these abstracts change.
    truncatable = sorted(judged1 - removed - set(edited) - set().union(*(qrels[q] for q in q2_extra)), key=int)
    repaired = sorted(random.Random(SEED + 1).sample(truncatable, REPAIRED), key=int)
    for doc_id in repaired:
        rev1[doc_id] = first_sentence(rev1[doc_id])

    HERE.mkdir(exist_ok=True)
    (HERE / "qrels").mkdir(exist_ok=True)
    write_corpus(HERE / "rev-1.jsonl", list(rev1.values()))
    write_corpus(HERE / "rev-2.jsonl", list(rev2.values()))
    all_q = sorted(set(q1) | set(q2_extra), key=int)
    with (HERE / "queries.jsonl").open("w", encoding="utf-8") as fh:
        for qid in all_q:
            fh.write(json.dumps({"_id": qid, "text": queries[qid]["text"]}, ensure_ascii=False) + "\n")
    judged = {q: qrels[q] for q in all_q}
    write_qrels(HERE / "qrels" / "rev-1.tsv", judged, set(rev1))
    write_qrels(HERE / "qrels" / "rev-2.tsv", judged, set(rev2))
    changes = {
        "edited": sorted(edited, key=int),
        "removed": sorted(removed, key=int),
        "added": sorted(added, key=int),
        "repaired": repaired,
    }
    (HERE / "changes.json").write_text(json.dumps(changes, indent=2) + "\n", encoding="utf-8")
    print(f"rev-1: {len(rev1)} documents; rev-2: {len(rev2)} documents; {changes}")


if __name__ == "__main__":
    main()
