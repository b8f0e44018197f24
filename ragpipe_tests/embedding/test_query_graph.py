"""The query-graph cache: created once, reused without torch, refused when altered, rebuilt when its
manifest is not sealed with the home's key, crash-safe."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from ragpipe.embedding.embedder import SentenceTransformerEmbedder, model_directory
from ragpipe.embedding.onnx_query import PARITY_PROBES, PARITY_TOLERANCE, OnnxEncoder
from ragpipe.embedding.query_graph import (
    MANIFEST,
    MODEL,
    SEAL_DOMAIN,
    TOKENIZER,
    PublishOutcome,
    QueryGraphError,
    UntrustedManifest,
    create_entry,
    entry_dir,
    entry_key,
    export_graph,
    load_entry,
    publish_graph,
    query_encoder,
    sealing_key,
)
from ragpipe.kernel.publish import PUBLISH_STEPS
from ragpipe.kernel.seals import HOME_KEY, SealKey, sealed
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import load_pipeline_spec, own_spec_id
from ragpipe_tests.support.paths import SAMPLE
from ragpipe_tests.support.query_graphs import copy_entry, edit_manifest, read_manifest, write_manifest

TEXTS = [
    "Does aspirin prevent stroke?",
    "",
    "  padded with spaces  ",
    "COVID-19 vaccines: mRNA-1273 & BNT162b2 — efficacy ≥ 90 %",
    "Café crème, naïve résumé — 日本語のテキスト 🎉",
    "word " * 300,  # truncated at max_seq_length by both paths
]


@pytest.fixture(scope="module")
def spec():
    return load_pipeline_spec().embedder


@pytest.fixture(scope="module")
def st_embedder(spec):
    return SentenceTransformerEmbedder(spec, threads=2)


@pytest.fixture(scope="module")
def exported(st_embedder):
    return export_graph(st_embedder)


@pytest.fixture(scope="module")
def warm_root(tmp_path_factory: pytest.TempPathFactory, exported) -> Path:
    """A home's cache (``<home>/query_graphs``) holding the default embedder's entry, published
    from ``exported``."""
    root = Workspace(tmp_path_factory.mktemp("home")).query_graphs
    _, outcome = publish_graph(root, exported)
    assert outcome is PublishOutcome.published
    return root


@pytest.fixture
def entry_copy(warm_root: Path, spec, tmp_path: Path) -> Path:
    """A private copy of the warm entry in another home's cache (same folder name, manifest sealed
    with that home's key: trusted there), safe to alter."""
    return copy_entry(warm_root, spec, Workspace(tmp_path / "home").query_graphs)


def refusal(entry: Path, file: str | None, rule: str) -> str:
    where = entry / file if file else entry
    return f"query graph {where}: {rule}; remove {entry} to re-create it"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def forge(entry: Path, name: str, data: bytes, reseal: bool) -> None:
    """Replace ``name`` and record its size and digest, and the probe vectors the forged entry
    gives, in the manifest: a consistent forgery, sealed with the home's key when ``reseal`` (only
    a key holder could), else left with the old seal."""
    (entry / name).write_bytes(data)
    content = read_manifest(entry)
    content["files"][name] = {"bytes": len(data), "sha256": sha256(data)}
    forged = OnnxEncoder(load_pipeline_spec().embedder, (entry / MODEL).read_bytes(), (entry / TOKENIZER).read_text())
    for probe in content["probes"]:
        probe["vector"] = [float(x) for x in forged.embed_query(probe["text"])]
    seal = json.loads((entry / MANIFEST).read_text())["seal"]
    write_manifest(entry, content, reseal=reseal)
    if not reseal:  # the old seal kept beside the forged content
        (entry / MANIFEST).write_text(json.dumps({**content, "seal": seal}))


def untrusted(entry: Path, rule: str) -> str:
    return f"query graph {entry}/{MANIFEST}: {rule}"


# ---- creation and reuse ----------------------------------------------------------------------


def test_entry_is_created_once_then_reused(spec, tmp_path: Path):
    root = tmp_path / "query_graphs"
    first = query_encoder(root, spec)  # creates: loads sentence-transformers and exports
    entry = entry_dir(root, spec)
    assert os.listdir(root) == [entry_key(spec).removeprefix("sha256:")]
    assert sorted(os.listdir(entry)) == sorted([MANIFEST, MODEL, TOKENIZER])
    before = {name: os.stat(entry / name) for name in os.listdir(entry)}
    again = query_encoder(root, spec)  # reuses: nothing written
    assert create_entry(root, spec) == (entry, PublishOutcome.existing)
    after = {name: os.stat(entry / name) for name in os.listdir(entry)}
    assert {n: (s.st_ino, s.st_mtime_ns) for n, s in before.items()} == {
        n: (s.st_ino, s.st_mtime_ns) for n, s in after.items()
    }
    assert type(first) is type(again) is OnnxEncoder and again.entry == entry
    assert np.array_equal(first.embed_query("aspirin stroke"), again.embed_query("aspirin stroke"))


def test_manifest_records_key_digests_and_probe_vectors(warm_root: Path, spec, st_embedder):
    entry = entry_dir(warm_root, spec)
    document = json.loads((entry / MANIFEST).read_text())
    home_key = SealKey((warm_root.parent / "verified" / HOME_KEY).read_bytes())
    manifest = read_manifest(entry)
    # sealed with the home's key (HMAC-SHA256 of its canonical form), and nothing but the seal added
    assert document == sealed(manifest, SEAL_DOMAIN, home_key)
    assert manifest["key"] == entry_key(spec) and entry.name == entry_key(spec).removeprefix("sha256:")
    assert manifest["embedder_spec_id"] == own_spec_id("embeddings", spec)
    assert manifest["weights_sha256"] == spec.weights_sha256
    assert (manifest["max_seq_length"], manifest["query_prefix"]) == (spec.max_seq_length, spec.query_prefix)
    for name in (MODEL, TOKENIZER):
        data = (entry / name).read_bytes()
        assert manifest["files"][name] == {"bytes": len(data), "sha256": sha256(data)}
    # the tokenizer file is the model folder's, byte for byte
    assert (entry / TOKENIZER).read_bytes() == (model_directory(spec) / TOKENIZER).read_bytes()
    assert [p["text"] for p in manifest["probes"]] == list(PARITY_PROBES)
    for probe in manifest["probes"]:
        assert np.array_equal(np.asarray(probe["vector"], dtype=np.float32), st_embedder.embed_query(probe["text"]))
    assert 0 <= manifest["max_difference"] <= PARITY_TOLERANCE


def test_the_key_is_the_spec_and_weights_only(spec):
    assert entry_key(spec) == entry_key(spec.model_copy())
    assert entry_key(spec.model_copy(update={"query_prefix": "query: "})) != entry_key(spec)
    assert entry_key(spec.model_copy(update={"max_seq_length": 128})) != entry_key(spec)
    assert entry_key(spec.model_copy(update={"weights_sha256": "sha256:" + "0" * 64})) != entry_key(spec)


def test_cached_vectors_equal_sentence_transformers(warm_root: Path, spec, st_embedder):
    encoder = load_entry(warm_root, spec)
    assert (encoder.spec, encoder.dimensions, encoder.thread_safe) == (spec, 384, True)
    assert encoder.max_difference <= PARITY_TOLERANCE
    for text in (*TEXTS, *PARITY_PROBES):
        got, expected = encoder.embed_query(text), st_embedder.embed_query(text)
        assert got.shape == (384,) and got.dtype == np.float32
        assert float(np.abs(got - expected).max()) <= PARITY_TOLERANCE, text[:20]


def test_tokenizer_splits_like_sentence_transformers(warm_root: Path, spec, st_embedder):
    """The ``tokenizers`` tokenizer of the entry gives the IDs sentence-transformers' own encode
    path gives, on the sample corpus (titles and abstracts, many beyond max_seq_length)."""
    encoder = load_entry(warm_root, spec)
    docs = [json.loads(line) for line in (SAMPLE / "rev-1.jsonl").read_text().splitlines()[:150]]
    texts = [*TEXTS, *PARITY_PROBES, *(d["title"] for d in docs), *(d["text"] for d in docs)]
    tokenize = getattr(st_embedder.model, "preprocess", None) or st_embedder.model.tokenize
    for text in texts:
        expected = [int(i) for i in np.asarray(tokenize([text])["input_ids"])[0]]
        assert encoder.token_ids(text) == expected, text[:40]
    assert len(encoder.token_ids(" ".join(["long"] * 400))) == spec.max_seq_length


def test_warm_load_imports_no_torch(scoped_bundles, warm_root: Path, st_embedder):
    """A new process that builds a Retriever over a warm cache and runs a vector query imports
    none of torch, transformers, sentence_transformers, and finds what sentence-transformers finds."""
    from ragpipe.retrieval.plan import load_plan
    from ragpipe.retrieval.retriever import Retriever

    full, _ = scoped_bundles
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from ragpipe.retrieval.retriever import Retriever\n"
        "r = Retriever(Path(sys.argv[1]), query_graph_dir=Path(sys.argv[2]))\n"
        "hits = r.query('aspirin stroke', mode='vector', k=3).hits\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'sentence_transformers') if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'embedder': type(r.embedder()).__name__,\n"
        "                  'hits': [[h['chunk_id'], h['score']] for h in hits]}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(full), str(warm_root)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["heavy"] == [] and seen["embedder"] == "OnnxEncoder"
    plan = load_plan()
    torch_plan = plan.model_copy(
        update={"query_embedding": plan.query_embedding.model_copy(update={"runtime": "sentence_transformers"})}
    )
    reference = Retriever(full, plan=torch_plan, embedder=st_embedder)
    expected = reference.query("aspirin stroke", mode="vector", k=3).hits
    reference.close()
    assert [c for c, _ in seen["hits"]] == [h["chunk_id"] for h in expected]
    assert max(abs(s - h["score"]) for (_, s), h in zip(seen["hits"], expected)) <= 1e-5


CLI_CHILD = """
import atexit, json, sys
def report():
    heavy = sorted(m for m in ("torch", "transformers", "sentence_transformers") if m in sys.modules)
    sys.stderr.write("\\nHEAVY " + json.dumps(heavy) + "\\n")
atexit.register(report)
sys.argv = ["ragpipe", *sys.argv[1:]]
from ragpipe.cli import main
main()
"""


def test_release_query_loads_the_cached_graph_without_torch(
    built_workspace, warm_root: Path, spec, tmp_path: Path, accepting_fixture_policies
):
    """``retriever_for_release`` loads the release's cached query graph while it opens the
    retriever (no load left for the first query), and ``ragpipe query`` against the release, in a
    new process, imports none of torch, transformers, sentence_transformers."""
    from ragpipe.api import retriever_for_release
    from ragpipe.release.activation import activate
    from ragpipe_tests.support.release_fixtures import bundle_of, fresh_ws, publish

    bundle = bundle_of(built_workspace)
    ws = fresh_ws(tmp_path, bundle)
    activate(ws, publish(ws, bundle), None, by="test")
    copy_entry(warm_root, spec, ws.query_graphs)
    retriever = retriever_for_release(home=ws.home)
    try:
        assert type(retriever.embedder()) is OnnxEncoder
        assert retriever.embedder().entry == entry_dir(ws.query_graphs, spec)
        expected = retriever.query("signing keys", k=3, trace=True)
        assert set(expected.trace["timings_ms"]) == {"lexical", "vector"}  # no embedder_load: loaded already
    finally:
        retriever.close()
    env = {**os.environ, "RAGPIPE_HOME": str(ws.home)}
    done = subprocess.run(
        [sys.executable, "-c", CLI_CHILD, "query", "signing keys", "--k", "3", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (heavy,) = [line for line in done.stderr.splitlines() if line.startswith("HEAVY ")]
    assert json.loads(heavy.removeprefix("HEAVY ")) == []
    assert [h["chunk_id"] for h in json.loads(done.stdout)["hits"]] == [h["chunk_id"] for h in expected.hits]
    # a damaged entry: the command refuses with the one-line rule, and leaves the entry as it was
    entry = entry_dir(ws.query_graphs, spec)
    with open(entry / MODEL, "r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    refused = subprocess.run(
        [sys.executable, "-c", CLI_CHILD, "query", "signing keys", "--k", "3"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert refused.returncode == 1 and refused.stdout == ""
    message = " ".join(line for line in refused.stderr.splitlines() if not line.startswith("HEAVY "))
    assert re.fullmatch(
        re.escape(f"error: query graph {entry}/{MODEL}: sha256 ")
        + r"sha256:[0-9a-f]{64}"
        + re.escape(" does not match the manifest's ")
        + r"sha256:[0-9a-f]{64}"
        + re.escape(f"; remove {entry} to re-create it"),
        " ".join(message.split()),
    ), refused.stderr
    # the byte restored but the manifest not sealed (an entry of an older ragpipe, or anyone's
    # without the key): one warning line, the entry rebuilt (with torch), the query answered
    with open(entry / MODEL, "r+b") as fh:
        fh.seek(1000)
        fh.write(byte)
    write_manifest(entry, read_manifest(entry), reseal=False)
    rebuilt = subprocess.run(
        [sys.executable, "-c", CLI_CHILD, "query", "signing keys", "--k", "3", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    warning = [line for line in rebuilt.stderr.splitlines() if line.strip() and not line.startswith("HEAVY ")]
    assert warning == [
        f"query graph {entry}/{MANIFEST}: is not sealed (written before manifests were sealed, or by someone "
        "without the key); the entry is rebuilt"
    ], rebuilt.stderr
    assert [h["chunk_id"] for h in json.loads(rebuilt.stdout)["hits"]] == [h["chunk_id"] for h in expected.hits]
    load_entry(ws.query_graphs, spec)  # sealed with this home's key now


def test_retriever_defaults_to_the_workspace_cache(scoped_bundles, monkeypatch, tmp_path: Path):
    from ragpipe.retrieval.retriever import Retriever

    monkeypatch.setenv("RAGPIPE_HOME", str(tmp_path / "home"))
    retriever = Retriever(scoped_bundles[0])
    assert retriever.query_graph_dir == Workspace((tmp_path / "home").resolve()).query_graphs
    assert Retriever(scoped_bundles[0], query_graph_dir=tmp_path / "qg").query_graph_dir == tmp_path / "qg"
    assert not (tmp_path / "home").exists()  # nothing is created before a vector query needs it


def test_racing_creators_share_one_entry(exported, spec, tmp_path: Path):
    root = tmp_path / "query_graphs"
    barrier = threading.Barrier(2)
    outcomes: list[PublishOutcome] = []

    def create() -> None:
        barrier.wait()
        outcomes.append(publish_graph(root, exported)[1])

    threads = [threading.Thread(target=create) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.value for o in outcomes) == ["existing", "published"]
    assert os.listdir(root) == [entry_dir(root, spec).name]
    load_entry(root, spec)


def test_garbage_collection_leaves_the_cache_alone(entry_copy: Path, spec):
    from ragpipe.gc import collect_garbage

    ws = Workspace(entry_copy.parent.parent)
    assert ws.query_graphs == entry_copy.parent
    report = collect_garbage(ws)
    assert not [r for r in report.removed if r.path.startswith("query_graphs")]
    load_entry(ws.query_graphs, spec)


# ---- refusals --------------------------------------------------------------------------------


def test_missing_entry_is_reported_by_load(spec, tmp_path: Path):
    entry = entry_dir(tmp_path, spec)
    with pytest.raises(QueryGraphError) as info:
        load_entry(tmp_path, spec)
    assert str(info.value) == f"query graph {entry}: no such entry (query_encoder creates it)"


def test_a_file_in_place_of_the_entry_is_refused_not_replaced(spec, tmp_path: Path):
    entry = entry_dir(tmp_path, spec)
    entry.write_text("not an entry")
    for load in (load_entry, query_encoder):
        with pytest.raises(QueryGraphError) as info:
            load(tmp_path, spec)
        assert str(info.value) == f"query graph {entry}: is not an entry folder; remove {entry} to re-create it"
    assert entry.read_text() == "not an entry"


def test_truncated_graph_is_refused(entry_copy: Path, spec):
    data = (entry_copy / MODEL).read_bytes()
    (entry_copy / MODEL).write_bytes(data[: len(data) // 2])
    with pytest.raises(QueryGraphError) as info:
        load_entry(entry_copy.parent, spec)
    assert str(info.value) == refusal(
        entry_copy, MODEL, f"has {len(data) // 2} bytes, the manifest records {len(data)}"
    )


def test_flipped_byte_is_refused(entry_copy: Path, spec):
    data = bytearray((entry_copy / MODEL).read_bytes())
    recorded = sha256(bytes(data))
    data[len(data) // 2] ^= 0x01
    (entry_copy / MODEL).write_bytes(bytes(data))
    with pytest.raises(QueryGraphError) as info:
        load_entry(entry_copy.parent, spec)
    assert str(info.value) == refusal(
        entry_copy, MODEL, f"sha256 {sha256(bytes(data))} does not match the manifest's {recorded}"
    )


def _probe_refusal(entry: Path) -> str:
    return re.escape(refusal(entry, None, "@")).replace(
        "@",
        f"{MODEL} and {TOKENIZER} give query probe 'aspirin' a vector "
        + r"[0-9.e+-]+"
        + re.escape(f" away from the recorded sentence-transformers vector (> {PARITY_TOLERANCE})"),
    )


def forged_graph(entry: Path) -> bytes:
    """Another valid graph: every token's embedding shifted to the next token's."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load_from_string((entry / MODEL).read_bytes())
    (embeddings,) = [i for i in model.graph.initializer if "word_embeddings" in i.name]
    embeddings.CopyFrom(numpy_helper.from_array(np.roll(numpy_helper.to_array(embeddings), 1, axis=0), embeddings.name))
    return model.SerializeToString()


def forged_tokenizer(entry: Path) -> bytes:
    """Another valid tokenizer: every token's ID shifted by one."""
    tokenizer = json.loads((entry / TOKENIZER).read_text())
    vocab = tokenizer["model"]["vocab"]
    tokenizer["model"]["vocab"] = {t: (i + 1) % len(vocab) for t, i in vocab.items()}
    return json.dumps(tokenizer).encode()


@pytest.mark.parametrize(("name", "make"), [(MODEL, forged_graph), (TOKENIZER, forged_tokenizer)])
def test_a_forgery_with_every_digest_and_probe_recomputed_is_refused_then_rebuilt(
    entry_copy: Path, spec, warm_root: Path, caplog, name, make
):
    """A file replaced, its size, digest and the probe vectors it gives recorded in the manifest:
    every byte check and every probe would pass, but without the key the manifest's seal no longer
    matches. The entry is not used: the load refuses it, and ``query_encoder`` says so in one
    warning line and rebuilds it (the genuine files again)."""
    forge(entry_copy, name, make(entry_copy), reseal=False)
    rule = "the seal does not match the record (edited or forged)"
    with pytest.raises(UntrustedManifest) as info:
        load_entry(entry_copy.parent, spec)
    assert str(info.value) == untrusted(entry_copy, rule)
    with caplog.at_level(logging.WARNING, logger="ragpipe.embedding.query_graph"):
        encoder = query_encoder(entry_copy.parent, spec)
    assert [r.getMessage() for r in caplog.records] == [untrusted(entry_copy, rule) + "; the entry is rebuilt"]
    for genuine in (MODEL, TOKENIZER):
        assert (entry_copy / genuine).read_bytes() == (entry_dir(warm_root, spec) / genuine).read_bytes()
    assert encoder.entry == entry_copy and encoder.max_difference <= PARITY_TOLERANCE
    load_entry(entry_copy.parent, spec)  # trusted now


def test_a_load_where_the_probes_passed_skips_them(warm_root: Path, spec):
    """The sealed manifest records where the probes passed at creation (onnxruntime, tokenizers,
    CPU); a load there hashes the files and trusts that record instead of running them again."""
    from ragpipe.embedding.onnx_query import runtime_host

    manifest = read_manifest(entry_dir(warm_root, spec))
    assert manifest["probes_passed_on"] == runtime_host()
    assert set(runtime_host()) == {"onnxruntime", "tokenizers", "machine", "cpu"}
    encoder = load_entry(warm_root, spec)
    assert encoder.probes_run is False and encoder.max_difference == manifest["max_difference"]


ELSEWHERE = [
    pytest.param({"cpu": "sha256:" + "0" * 16}, id="another_cpu"),
    pytest.param({"onnxruntime": "0.0.1"}, id="another_onnxruntime"),
    pytest.param({"tokenizers": "0.0.1"}, id="another_tokenizers"),
    pytest.param(None, id="not_recorded"),
]


@pytest.mark.parametrize("elsewhere", ELSEWHERE)
def test_a_load_elsewhere_runs_the_probes(entry_copy: Path, spec, elsewhere):
    from ragpipe.embedding.onnx_query import runtime_host

    def moved(m: dict) -> None:
        if elsewhere is None:
            del m["probes_passed_on"]
        else:
            m["probes_passed_on"] |= elsewhere

    edit_manifest(entry_copy, moved, reseal=True)
    encoder = load_entry(entry_copy.parent, spec)
    assert encoder.probes_run is True and encoder.max_difference <= PARITY_TOLERANCE
    assert read_manifest(entry_copy).get("probes_passed_on") != runtime_host()  # not rewritten


@pytest.mark.parametrize(("name", "make"), [(MODEL, forged_graph), (TOKENIZER, forged_tokenizer)])
def test_a_file_whose_probes_do_not_reproduce_elsewhere_is_refused(entry_copy: Path, spec, name, make):
    """Another file behind recorded digests (a key holder's record) on a host where the probes
    did not pass yet: they run, and refuse it — as they refuse a graph this host's onnxruntime or
    CPU computes otherwise than where the entry was made."""
    (entry_copy / name).write_bytes(make(entry_copy))
    data = (entry_copy / name).read_bytes()

    def record(m: dict) -> None:
        m["files"][name] = {"bytes": len(data), "sha256": sha256(data)}
        m["probes_passed_on"]["cpu"] = "sha256:" + "0" * 16

    edit_manifest(entry_copy, record, reseal=True)
    with pytest.raises(QueryGraphError) as info:
        load_entry(entry_copy.parent, spec)
    assert re.fullmatch(_probe_refusal(entry_copy), str(info.value)), str(info.value)


def test_entry_of_another_key_is_not_trusted(entry_copy: Path, spec):
    """A sealed manifest in another entry's folder (renamed) vouches for that entry only."""
    other = spec.model_copy(update={"query_prefix": "query: "})
    moved = entry_dir(entry_copy.parent, other)
    entry_copy.rename(moved)
    with pytest.raises(UntrustedManifest) as info:
        load_entry(moved.parent, other)
    assert str(info.value) == untrusted(moved, f"key {entry_key(spec)} is not this embedder's key {entry_key(other)}")


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def edited_probe(document: dict) -> str:
    """``document`` (seal kept) with one probe component moved."""
    document["probes"][0]["vector"][0] += 1e-3
    return json.dumps(document, indent=1)


@pytest.mark.parametrize(
    ("damage", "rule"),
    [
        pytest.param(
            lambda e: write_manifest(e, read_manifest(e), reseal=False),
            "is not sealed (written before manifests were sealed, or by someone without the key)",
            id="unsealed",
        ),
        pytest.param(
            lambda e: (e / MANIFEST).write_text(
                json.dumps(sealed(read_manifest(e), SEAL_DOMAIN, SealKey(b"k" * 32)), indent=1)
            ),
            f"sealed with key {SealKey(b'k' * 32).key_id}, the configured key is @KEY",
            id="another_key",
        ),
        pytest.param(
            lambda e: (e / MANIFEST).write_text(edited_probe(json.loads((e / MANIFEST).read_text()))),
            "the seal does not match the record (edited or forged)",
            id="edited",
        ),
        pytest.param(
            lambda e: (e / MANIFEST).write_bytes((e / MANIFEST).read_bytes()[:-200]),
            "is not a sealed manifest (line @LINE: not valid JSON: @ANY)",
            id="truncated",
        ),
        pytest.param(
            lambda e: (e / MANIFEST).write_text("{not json"),
            "is not a sealed manifest (line 1: not valid JSON: @ANY)",
            id="not_json",
        ),
        pytest.param(
            lambda e: (e / MANIFEST).write_text(json.dumps([json.loads((e / MANIFEST).read_text())])),
            "is not a sealed manifest (a JSON list, not an object)",
            id="a_list",
        ),
        pytest.param(
            lambda e: (e / MANIFEST).write_text('{"kind": "ragpipe.query_graph", ' + (e / MANIFEST).read_text()[1:]),
            "is not a sealed manifest (line @LINE: kind: duplicate key (first at line 1))",
            id="duplicate_key",
        ),
        pytest.param(
            lambda e: (e / MANIFEST).write_bytes(deep(5000)),
            "is not a sealed manifest (line 1: nesting deeper than 64 levels (column 65))",
            id="5000_levels",
        ),
        pytest.param(
            lambda e: (e / MANIFEST).write_bytes(b'{"kind": "\xff"}'),
            "is not UTF-8 (byte 11)",
            id="not_utf8",
        ),
        pytest.param(lambda e: (e / MANIFEST).unlink(), "is missing", id="missing"),
        pytest.param(
            lambda e: ((e / MANIFEST).unlink(), (e / MANIFEST).symlink_to(e / TOKENIZER)),
            "cannot be read (a symbolic link (never followed))",
            id="symlink",
        ),
    ],
)
def test_a_manifest_that_does_not_vouch_for_its_entry_is_refused(entry_copy: Path, spec, damage, rule: str):
    """Every way a manifest can fail to be this home's sealed record of this entry: one line,
    never a traceback, and the entry is not used (``query_encoder`` rebuilds it: next test)."""
    damage(entry_copy)
    with pytest.raises(UntrustedManifest) as info:
        load_entry(entry_copy.parent, spec)
    key_id = sealing_key(entry_copy.parent, create=False).key_id
    pattern = re.escape(untrusted(entry_copy, rule.replace("@KEY", key_id)))
    pattern = pattern.replace("@LINE", r"\d+").replace("@ANY", ".+")
    assert re.fullmatch(pattern, str(info.value)), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("damage", ["unsealed", "another_key", "5000_levels"])
def test_query_encoder_rebuilds_an_entry_whose_manifest_is_not_trusted(
    entry_copy: Path, spec, warm_root: Path, caplog, damage: str
):
    content = read_manifest(entry_copy)
    if damage == "unsealed":
        write_manifest(entry_copy, content, reseal=False)
    elif damage == "another_key":
        (entry_copy / MANIFEST).write_text(json.dumps(sealed(content, SEAL_DOMAIN, SealKey(b"k" * 32))))
    else:
        (entry_copy / MANIFEST).write_bytes(deep(5000))
    with caplog.at_level(logging.WARNING, logger="ragpipe.embedding.query_graph"):
        encoder = query_encoder(entry_copy.parent, spec)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"query graph {entry_copy}/{MANIFEST}: ") and line.endswith("; the entry is rebuilt")
    assert encoder.entry == entry_copy and encoder.max_difference <= PARITY_TOLERANCE
    assert (entry_copy / MODEL).read_bytes() == (entry_dir(warm_root, spec) / MODEL).read_bytes()
    assert read_manifest(entry_copy)["files"] == content["files"]
    load_entry(entry_copy.parent, spec)


@pytest.mark.parametrize(
    ("edit", "rule"),
    [
        pytest.param(
            lambda m: m.update(max_seq_length=128), "max_seq_length 128 is not the embedder's 256", id="max_seq_length"
        ),
        pytest.param(lambda m: m.update(format_version=0), "format_version 0 is not the embedder's 1", id="format"),
        pytest.param(
            lambda m: m["probes"].pop(), "its probes are not the parity probes of this version", id="probe_dropped"
        ),
        pytest.param(
            lambda m: m.update(extra=1),
            "is not a query-graph manifest (extra: Extra inputs are not permitted)",
            id="unknown_field",
        ),
        pytest.param(
            lambda m: m["files"].pop(TOKENIZER),
            "lists files ['model.onnx'], not ['model.onnx', 'tokenizer.json']",
            id="file_unlisted",
        ),
    ],
)
def test_a_manifest_sealed_with_the_key_but_not_for_this_entry_is_refused(entry_copy: Path, spec, edit, rule: str):
    """A key holder's edit (sealed again) that does not describe this entry: not trusted (the
    entry is rebuilt); one that lists other files: the files are refused."""
    edit_manifest(entry_copy, edit, reseal=True)
    with pytest.raises(QueryGraphError) as info:
        load_entry(entry_copy.parent, spec)
    if rule.startswith("lists files"):
        assert type(info.value) is QueryGraphError and str(info.value) == refusal(entry_copy, MANIFEST, rule)
    else:
        assert type(info.value) is UntrustedManifest and str(info.value) == untrusted(entry_copy, rule)


def test_racing_rebuilders_rebuild_once_and_both_load(entry_copy: Path, spec, caplog):
    """Two loads find the manifest unsealed at once: the entry's lock lets one rebuild it, and the
    other loads that rebuilt entry instead of removing it."""
    write_manifest(entry_copy, read_manifest(entry_copy), reseal=False)
    barrier = threading.Barrier(2)
    loaded: list[OnnxEncoder] = []

    def load() -> None:
        barrier.wait()
        loaded.append(query_encoder(entry_copy.parent, spec))

    with caplog.at_level(logging.WARNING, logger="ragpipe.embedding.query_graph"):
        threads = [threading.Thread(target=load) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [e.entry for e in loaded] == [entry_copy, entry_copy]
    # each load that found the old manifest says so (the second may start after the rebuild)
    assert len(caplog.records) in (1, 2) and os.listdir(entry_copy.parent) == [entry_copy.name]
    assert load_entry(entry_copy.parent, spec).probes_run is False


def test_a_stray_file_is_refused(entry_copy: Path, spec):
    (entry_copy / "notes.txt").write_text("x")
    with pytest.raises(QueryGraphError) as info:
        load_entry(entry_copy.parent, spec)
    listed = sorted([MANIFEST, MODEL, "notes.txt", TOKENIZER])
    assert type(info.value) is QueryGraphError and str(info.value) == refusal(
        entry_copy, None, f"holds {listed}, not exactly {sorted([MANIFEST, MODEL, TOKENIZER])}"
    )


def test_a_refused_entry_is_not_re_created_until_removed(entry_copy: Path, spec):
    """Decided: a published entry that fails verification is refused every time (never silently
    repaired or replaced); removing the folder, as the message says, lets the next load re-create it."""
    root = entry_copy.parent
    data = bytearray((entry_copy / MODEL).read_bytes())
    data[-1] ^= 0xFF
    (entry_copy / MODEL).write_bytes(bytes(data))
    for _ in range(2):
        with pytest.raises(QueryGraphError, match=re.escape(f"; remove {entry_copy} to re-create it")):
            query_encoder(root, spec)
    assert (entry_copy / MODEL).read_bytes() == bytes(data)  # left as found, for whoever investigates
    shutil.rmtree(entry_copy)
    encoder = query_encoder(root, spec)
    assert encoder.entry == entry_copy and encoder.max_difference <= PARITY_TOLERANCE


# ---- crashes during publication --------------------------------------------------------------

CRASH_SCRIPT = """
import os, pickle, signal, sys
from pathlib import Path
from ragpipe.embedding.query_graph import publish_graph

exported = pickle.loads(Path(sys.argv[2]).read_bytes())
def hook(step):
    if step == sys.argv[3]:
        os.kill(os.getpid(), signal.SIGKILL)
publish_graph(Path(sys.argv[1]), exported, on_step=hook)
"""


@pytest.fixture(scope="module")
def exported_file(exported, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("exported") / "exported.pickle"
    path.write_bytes(pickle.dumps(exported))
    return path


@pytest.mark.parametrize("step", PUBLISH_STEPS)
def test_sigkill_at_every_publication_step(exported, exported_file: Path, spec, tmp_path: Path, step: str):
    root = tmp_path / "query_graphs"
    done = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(root), str(exported_file), step], capture_output=True, text=True
    )
    assert done.returncode == -9, done.stderr
    entry = entry_dir(root, spec)
    names = sorted(os.listdir(root))
    if PUBLISH_STEPS.index(step) < PUBLISH_STEPS.index("renamed"):
        assert len(names) == 1 and names[0].startswith(".tmp-")  # the dead creator's temp, no entry
        with pytest.raises(QueryGraphError, match="no such entry"):
            load_entry(root, spec)
    else:
        assert names == [entry.name]
        load_entry(root, spec)
    # a later creation succeeds, removes the dead creator's temp and leaves one valid entry
    _, outcome = publish_graph(root, exported)
    assert outcome is (PublishOutcome.published if entry.name not in names else PublishOutcome.existing)
    assert os.listdir(root) == [entry.name]
    assert load_entry(root, spec).max_difference <= PARITY_TOLERANCE
