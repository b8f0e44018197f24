"""Build-side benchmark on SciFact (5,183 abstracts).

    python -m benchmarks.build_bench --scifact PATH [--out var/bench]

Measures, each in a fresh process:
1. bare ``model.encode`` of exactly the texts the pipeline encodes (same model, batch size, threads);
2. cold ``ragpipe build`` of the full corpus (fresh RAGPIPE_HOME and DAGSTER_HOME): wall time,
   ratio to (1), peak RSS;
3. incremental: in another fresh home, revision A = corpus minus 10 held-out documents (cold), then
   revision B = full corpus with 1% of documents edited: texts re-encoded vs. the exact number of
   new representation texts, and B's wall time as a share of the cold build (2);
4. verification of the cold bundle (``open_bundle``: files, recomputed payload, index cross-checks),
   three times in a fresh process each, imports excluded: wall time and its share of the cold build.
Prints one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.scifact import add_scifact_argument
from ragpipe.chunking.chunkers import chunk_documents, make_chunker
from ragpipe.corpus.connectors import read_beir
from ragpipe.corpus.snapshot import build_snapshot
from ragpipe.representations.derive import derive_representations
from ragpipe.spec import load_pipeline_spec

SEED = 7

BARE_ENCODE = """
import json, sys, time, torch
from sentence_transformers import SentenceTransformer
from ragpipe.embedding.embedder import model_directory
from ragpipe.spec import load_pipeline_spec
spec = load_pipeline_spec()
torch.set_num_threads(spec.execution.torch_threads)
texts = json.load(open(sys.argv[1]))
model = SentenceTransformer(str(model_directory(spec.embedder)), device="cpu", local_files_only=True)
model.max_seq_length = spec.embedder.max_seq_length
t0 = time.perf_counter()
model.encode(texts, batch_size=spec.execution.embed_batch_size, normalize_embeddings=True, convert_to_numpy=True)
print(json.dumps({"seconds": time.perf_counter() - t0, "texts": len(texts)}))
"""


VERIFY = """
import json, sys, time
from ragpipe.bundle.verify import open_bundle
import ragpipe.index.lexical, ragpipe.index.vector  # imports are not verification
t0 = time.perf_counter()
bundle = open_bundle(sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - t0, "bundle_id": bundle.bundle_id}))
"""


def representation_texts(path: Path) -> dict[str, str]:
    spec = load_pipeline_spec()
    docs, _ = build_snapshot(read_beir(path), "bench", "public", spec.snapshot)
    chunks = chunk_documents(docs, make_chunker(spec.chunker, spec.own_spec_ids["chunks"]))
    reps = derive_representations(docs, chunks, spec.representations.kinds, spec.own_spec_ids["representations"])
    return {r.digest: r.text for r in reps}


def run_measured(cmd: list[str], env: dict[str, str], logs: Path) -> tuple[str, float, float]:
    """Run ``cmd``; return (stdout, wall seconds, peak RSS MiB of exactly that process)."""
    logs.mkdir(parents=True, exist_ok=True)
    out_path, err_path = logs / "stdout", logs / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed:\n{err_path.read_text()[-4000:]}")
    return out_path.read_text(), wall, usage.ru_maxrss / 1024


def run_build(corpus: Path, revision: str, home: Path) -> dict:
    """``ragpipe build --json`` in a fresh process with its own RAGPIPE_HOME and DAGSTER_HOME."""
    env = {**os.environ, "RAGPIPE_HOME": str(home / "ragpipe"), "DAGSTER_HOME": str(home / "dagster")}
    (home / "dagster").mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "ragpipe.cli",
        "build",
        str(corpus),
        "--revision",
        revision,
        "--default-scope",
        "public",
        "--json",
    ]
    stdout, wall, rss = run_measured(cmd, env, home / f"logs-{revision}")
    return {**json.loads(stdout), "wall_seconds": round(wall, 2), "peak_rss_mib": round(rss, 1)}


def write_jsonl(path: Path, docs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return path


def edit(doc: dict, i: int) -> dict:
    doc = dict(doc)
    if i % 2:
        doc["text"] = doc["text"] + " An erratum to this abstract corrected one reported value."
    else:
        words = doc["text"].split(" ")
        mid = len(words) // 2
        words[mid] = words[mid] + ","
        doc["text"] = " ".join(words)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser()
    add_scifact_argument(ap)
    ap.add_argument("--out", type=Path, default=Path("var/bench"))
    args = ap.parse_args()
    out = args.out.resolve()
    if out.exists():
        raise SystemExit(f"{out} exists: remove it for a cold run")
    out.mkdir(parents=True)
    corpus_path = (args.scifact / "corpus.jsonl.gz").resolve()
    with gzip.open(corpus_path, "rt", encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh]
    rng = random.Random(SEED)
    held_out = set(rng.sample(range(len(docs)), 10))
    edited = set(rng.sample(sorted(set(range(len(docs))) - held_out), len(docs) // 100))
    rev_a = write_jsonl(out / "rev-a.jsonl", [d for i, d in enumerate(docs) if i not in held_out])
    rev_b = write_jsonl(out / "rev-b.jsonl", [edit(d, i) if i in edited else d for i, d in enumerate(docs)])

    texts = representation_texts(corpus_path)
    texts_file = out / "texts.json"
    texts_file.write_text(json.dumps([texts[d] for d in sorted(texts)]))
    stdout, _, bare_rss = run_measured(
        [sys.executable, "-c", BARE_ENCODE, str(texts_file)], dict(os.environ), out / "logs-bare"
    )
    bare = json.loads(stdout)
    cold = run_build(corpus_path, "scifact-full", out / "cold")
    inc_a = run_build(rev_a, "scifact-a", out / "incremental")
    inc_b = run_build(rev_b, "scifact-b", out / "incremental")
    new_texts = set(representation_texts(rev_b)) - set(representation_texts(rev_a))
    verify_runs = [
        json.loads(
            run_measured(
                [sys.executable, "-c", VERIFY, cold["bundle_path"]], dict(os.environ), out / f"logs-verify-{i}"
            )[0]
        )["seconds"]
        for i in range(3)
    ]
    verify_seconds = sorted(verify_runs)[1]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        "bare_encode_seconds": round(bare["seconds"], 2),
        "texts_encoded_bare": bare["texts"],
        "bare_peak_rss_mib": round(bare_rss, 1),
        "cold": cold,
        "cold_over_bare": round(cold["wall_seconds"] / bare["seconds"], 3),
        "incremental_a": inc_a,
        "incremental_b": inc_b,
        "edited_documents": len(edited),
        "added_documents": len(held_out),
        "expected_new_texts": len(new_texts),
        "incremental_share_of_cold": round(inc_b["wall_seconds"] / cold["wall_seconds"], 4),
        "verify_seconds_runs": [round(v, 2) for v in verify_runs],
        "verify_seconds_median": round(verify_seconds, 2),
        "verify_share_of_cold": round(verify_seconds / cold["wall_seconds"], 4),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
