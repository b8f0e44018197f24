"""The query-graph cache: an embedder's ONNX graph, exported once, verified on every load.

Every local embedder's entry serves queries (plan ``query_embedding.runtime: onnxruntime``); an
embedder whose *documents* run on onnxruntime (``embedder.runtime: onnxruntime``, its own spec ID)
gets an entry of its own whose graph is fused (``graph_kind``: torch's export with eager attention,
then onnxruntime's BERT operator fusions, and with ``quantization: int8`` int8 weights) and whose
manifest records document probes as well. An fp32 graph's probes are torch's vectors, checked to
``PARITY_TOLERANCE`` at creation and by loads (below: where they have not passed yet). An int8
graph cannot be within that of torch (it is another model, judged by the gate on the suite): its
probes are its own vectors at creation — at least ``INT8_MIN_COSINE`` from torch's, or creation is
refused — and a load elsewhere must reproduce them to ``PARITY_TOLERANCE``, so a host whose
kernels compute it differently is refused, never used. Which int8 graph is meant is the spec's: ``graph_sha256`` pins the graph
file's bytes (``pin_graph`` makes this host's and returns the spec pinning it); creation refuses to
publish another graph (``check_pin``) and a load refuses an entry holding another.

Exporting the query model to ONNX needs torch and sentence-transformers (seconds of imports, a
second of tracing); running it needs only onnxruntime and ``tokenizers``. One cache entry per
embedder holds what the fast path needs::

    <root>/<key hex>/model.onnx       the graph: transformer, mean pooling, L2 normalisation
    <root>/<key hex>/tokenizer.json   the model folder's tokenizer file, byte for byte
    <root>/<key hex>/manifest.json    written last: key, embedder spec ID, weights digest, format
                                      version, size and sha256 of both files, max_seq_length, query
                                      prefix, the sentence-transformers vector of every parity
                                      probe, the worst parity difference, and (execution facts,
                                      in no ID) the library versions that created it and where
                                      its probes passed (``runtime_host``); sealed

``key = content_id("query_graph", 1, {format_version, embedder_spec_id, weights_sha256})``: the
embedder spec ID covers the model, prefix, truncation and normalisation, the weights digest (a
model folder's ``files_sha256``, ``model_digest``) the exact weights the graph was exported from (checked by ``weights_digest`` when the model is loaded
for export), and ``FORMAT_VERSION`` what the exporter writes (bump it when the export, the entry
layout or the probes change). Nothing operational — threads, paths, library versions — enters it.

Creation (``create_entry``, only when the entry is missing) loads the sentence-transformers model,
exports it with torch, then runs the *standalone* path — ``OnnxEncoder`` over the files just
written, exactly what a load uses — on every probe and refuses (``QueryGraphError``, one line
naming the probe and the difference) unless its token IDs equal sentence-transformers' and its
vectors are within ``PARITY_TOLERANCE``. The entry is published atomically
(``ragpipe.kernel.publish.publish_directory``) after the loader's own checks passed on the temp
folder; a concurrent creator that loses the race uses the winner's entry.

**Sealed.** The manifest carries a ``seal`` (HMAC-SHA256 of its canonical form, domain
``SEAL_DOMAIN``; ``ragpipe.kernel.seals``) made with the configured key, else with the home key of
the home that holds the cache (``<home>/verified/home.key``, ``home_sealing_key``: ``root`` is
``<home>/query_graphs``). Digests and probes anyone can recompute; the seal only a key holder can
make, so someone who can write ``query_graphs/`` but not the key cannot make this home trust
another graph, tokenizer or probe vector. A manifest that does not vouch for its entry — missing,
not a regular file, larger than ``MAX_MANIFEST_BYTES``, not UTF-8, not JSON (strictly read:
duplicate keys, nesting beyond 64 levels and NaN refused), not an object, not sealed, sealed with
another key, edited after sealing, not a manifest, or sealed for another entry (key, spec ID,
format, probes) — is ``UntrustedManifest``: nothing it says is believed, and ``query_encoder`` logs
one warning line and **rebuilds** the entry (removed, then created as if missing; seconds, with
torch; under the entry's lock, so concurrent rebuilders make it once). That is also how entries written before manifests were sealed, or under another key, are
replaced. An int8 entry being rebuilt keeps its graph if it is the pinned one (its bytes are what
the spec means, whoever copied them there): an entry copied from a home whose onnxruntime made the
pinned graph is adopted, its probes computed here.

Loading (``load_entry``) reads and unseals the manifest, checks that it is this embedder's entry,
checks the size and sha256 of every file (and that no other file is there) and, for an int8 graph,
that it is the pinned one, and builds the session from the verified bytes. The probes are re-run
through it against the stored vectors only where they have not passed: the sealed manifest
records ``probes_passed_on`` (onnxruntime and tokenizers versions, machine, CPU flags:
``onnx_query.runtime_host``) at creation, and a load that finds the same trusts that record for
the bytes it has just hashed (the probes cost 55 ms on 2 free cores, ~180 ms with one busy;
hashing the 90 MB graph costs ~50 ms and is kept: it binds the bytes to the record and catches a
damaged file). Another onnxruntime, tokenizers or CPU — an upgrade, a home on shared storage — runs them
on every load, as an entry of a manifest without the field does. An entry whose trusted manifest
its files do not match (a truncated, flipped or replaced file, a stray file, probes that no
longer reproduce) is refused and **never re-created automatically**: a published entry that fails verification was altered or
damaged after it passed every check, which is worth an operator's attention, not a silent
10-second repair on the serving path. The message names the file and the rule and says to remove
the entry folder, after which the next query re-creates it.

torch is imported only by ``_export`` (lazily), sentence-transformers only through
``ragpipe.embedding.embedder`` on the creation path; onnxruntime only by
``ragpipe.embedding.onnx_query``. A warm load imports none of torch, transformers or
sentence_transformers.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

import numpy as np

from ragpipe.embedding.embedder import EmbedderError, SentenceTransformerEmbedder, model_directory
from ragpipe.embedding.onnx_query import (
    INPUTS,
    PARITY_PROBES,
    PARITY_TOLERANCE,
    OnnxEncoder,
    fuse_bert,
    quantize_int8,
    runtime_host,
)
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.models import FrozenModel
from ragpipe.kernel.publish import PublishOutcome, StepHook, discard, publish_directory
from ragpipe.kernel.seals import SEAL, SealKey, SealKeyError, home_sealing_key, sealed, unsealed
from ragpipe.kernel.strict_load import StrictLoadError, load_json
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import EmbedderSpec, own_spec_id

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MODEL = "model.onnx"
TOKENIZER = "tokenizer.json"
MANIFEST = "manifest.json"
PAYLOAD = (MODEL, TOKENIZER)
MANIFEST_KIND = "ragpipe.query_graph"
SEAL_DOMAIN = "query-graph-manifest"
MAX_MANIFEST_BYTES = 16 << 20  # ten probe vectors of up to 65,536 components, as JSON
MAX_GRAPH_BYTES = 1 << 32
# builds the one-line refusal of an entry: (file in the entry or None, the rule broken)
Refuse = Callable[[str | None, str], "QueryGraphError"]
# Which graph an entry holds (``graph_kind``): torch's plain export (queries only), or for an
# embedder whose documents run on onnxruntime the export with BERT operator fusions, fp32 or with
# int8 weights.
GraphKind = Literal["exported", "fused", "fused_int8"]
# An int8 graph is another model (its quality is the gate's to judge), but one whose vectors point
# nowhere near torch's is a broken quantisation, refused before any build uses it: int8
# MiniLM's probes sit above 0.99 (docs/embedders.md).
INT8_MIN_COSINE = 0.95


class QueryGraphError(EmbedderError):
    """A query graph that cannot be created, or a cache entry that is refused."""


class UntrustedManifest(QueryGraphError):
    """An entry whose manifest does not vouch for it: missing, unreadable, malformed, not sealed
    with this home's key, or sealed for another entry. Nothing it says is believed;
    ``query_encoder`` rebuilds the entry."""


class EntryFile(FrozenModel):
    bytes: int
    sha256: str


class Probe(FrozenModel):
    text: str
    vector: tuple[float, ...]  # sentence-transformers' vector, float32 values


class QueryGraphManifest(FrozenModel):
    """``probes``: query probes; ``document_probes`` (fused graphs only): the same texts with the
    document prefix. Their vectors are torch's, except in an int8 entry, where they are the int8
    graph's own at creation (``min_cosine_to_torch`` records how near torch's they were)."""

    kind: Literal["ragpipe.query_graph"]
    format_version: int
    key: str
    embedder_spec_id: str
    weights_sha256: str
    dimensions: int
    max_seq_length: int
    query_prefix: str
    files: dict[str, EntryFile]
    probes: tuple[Probe, ...]
    parity_tolerance: float
    max_difference: float
    created_with: dict[str, str]
    graph: GraphKind = "exported"  # entries written before fused graphs existed hold the plain export
    document_probes: tuple[Probe, ...] = ()
    min_cosine_to_torch: float | None = None
    # where the probes passed when the entry was created (``runtime_host``): a load there skips them
    probes_passed_on: dict[str, str] | None = None


@dataclass(frozen=True)
class ExportedGraph:
    """What creation publishes: the graph (``graph_kind`` of the spec), the tokenizer file, and the
    sentence-transformers side of every probe (vector and token IDs, query prefix included; for a
    fused graph the document-prefixed probes too)."""

    spec: EmbedderSpec
    graph: bytes
    tokenizer: bytes
    reference_vectors: tuple[np.ndarray, ...]
    reference_tokens: tuple[tuple[int, ...], ...]
    created_with: dict[str, str]
    document_vectors: tuple[np.ndarray, ...] = ()
    document_tokens: tuple[tuple[int, ...], ...] = ()


def graph_kind(spec: EmbedderSpec) -> GraphKind:
    """The graph ``spec``'s entry holds: fused (fp32 or int8) when its documents run on onnxruntime."""
    if spec.runtime != "onnxruntime":
        return "exported"
    return "fused_int8" if spec.quantization == "int8" else "fused"


def model_digest(spec: EmbedderSpec) -> str | None:
    """The digest that pins the model's bytes: the packaged weights', or a model folder's files'
    (``ragpipe.embedding.model_folder``; the manifest's ``weights_sha256`` field holds either).
    None for a remote embedder, which has no local model (no entry is ever created for it)."""
    return spec.weights_sha256 or spec.files_sha256


def entry_key(spec: EmbedderSpec) -> str:
    """The cache key of ``spec``'s query graph (``sha256:<hex>``); see the module docstring."""
    return content_id(
        "query_graph",
        1,
        {
            "format_version": FORMAT_VERSION,
            "embedder_spec_id": own_spec_id("embeddings", spec),
            "weights_sha256": model_digest(spec),
        },
    )


def entry_dir(root: Path, spec: EmbedderSpec) -> Path:
    """The folder of ``spec``'s entry under ``root`` (it may not exist)."""
    return Path(root) / entry_key(spec).removeprefix("sha256:")


def query_encoder(root: Path, spec: EmbedderSpec, threads: int = 2) -> OnnxEncoder:
    """The verified ``OnnxEncoder`` of ``spec`` from the cache under ``root``, creating the
    entry first if it does not exist (slow: torch and sentence-transformers are loaded then).
    Raises ``QueryGraphError`` when creation is refused or the existing entry does not verify."""
    path = entry_dir(root, spec)
    if path.exists() or path.is_symlink():
        try:
            return load_entry(root, spec, threads=threads)
        except UntrustedManifest as exc:
            log.warning("%s; the entry is rebuilt", exc)
        except QueryGraphError:
            if path.exists() or path.is_symlink():
                raise  # a refusal of the entry that is there
            # gone meanwhile: another process is rebuilding it; its lock below makes us wait for it
    return _rebuilt(root, spec, threads)


def _rebuilt(root: Path, spec: EmbedderSpec, threads: int) -> OnnxEncoder:
    """``spec``'s entry created — first, or again in place of one whose manifest is not trusted —
    under the entry's lock (``<home>/locks/query-graph-<key hex>.lock``): a process that finds the
    entry trusted by then (created or rebuilt by another) uses it instead of removing it."""
    path = entry_dir(root, spec)
    with file_lock(Workspace(Path(root).parent).locks / f"query-graph-{path.name}.lock", exclusive=True):
        adopted = None
        if path.is_dir() and not path.is_symlink():
            try:
                return load_entry(root, spec, threads=threads)
            except UntrustedManifest:
                adopted = _pinned_graph(path, spec)
            try:
                discard(path)
            except FileNotFoundError:
                pass  # removed by hand meanwhile
            except OSError as exc:
                raise QueryGraphError(
                    f"query graph {path}: cannot be removed to rebuild it ({exc.strerror or exc})"
                ) from None
        create_entry(root, spec, threads=threads, graph=adopted)
    return load_entry(root, spec, threads=threads)


def _pinned_graph(folder: Path, spec: EmbedderSpec) -> bytes | None:
    """The graph file of an entry being rebuilt, if it is the int8 graph ``spec`` pins: its bytes
    are what the spec means whoever wrote the entry, so the rebuild publishes them (a graph copied
    from a home whose onnxruntime made the pinned bytes) instead of quantising again."""
    if graph_kind(spec) != "fused_int8":
        return None
    try:
        data = read_regular(folder / MODEL, MAX_GRAPH_BYTES)
    except OSError:
        return None
    return data if graph_digest(data) == spec.graph_sha256 else None


def load_entry(root: Path, spec: EmbedderSpec, threads: int = 2) -> OnnxEncoder:
    """The encoder of ``spec``'s existing entry, after every check of the module docstring;
    ``QueryGraphError`` (one line: file, rule, what to do) when it is missing or refused."""
    path = entry_dir(root, spec)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise QueryGraphError(f"query graph {path}: is not an entry folder; remove {path} to re-create it")
    if not path.is_dir():
        raise QueryGraphError(f"query graph {path}: no such entry (query_encoder creates it)")
    return _verified(path, spec, threads, sealing_key(root, create=False))


def sealing_key(root: Path, create: bool) -> SealKey | None:
    """The key that seals the manifests of the cache ``root``: the configured key, else the home
    key of the home that holds the cache (``root`` is ``<home>/query_graphs``;
    ``ragpipe.kernel.seals.home_sealing_key``), created when ``create``. A key that cannot be read
    or made is a ``QueryGraphError``."""
    try:
        return home_sealing_key(Workspace(Path(root).parent), create=create)
    except (OSError, SealKeyError) as exc:
        raise QueryGraphError(f"query graph {root}: no usable sealing key: {exc}") from None


def create_entry(
    root: Path,
    spec: EmbedderSpec,
    st_embedder: SentenceTransformerEmbedder | None = None,
    threads: int = 2,
    on_step: StepHook | None = None,
    graph: bytes | None = None,
) -> tuple[Path, PublishOutcome]:
    """Export ``spec``'s query graph and publish it under ``root``; ``existing`` (nothing loaded,
    nothing written) when the entry is already there — the caller verifies it by loading.
    ``st_embedder``: the model, already loaded (loaded here when None); ``graph``: the int8 graph
    to publish instead of quantising here (``export_graph``)."""
    path = entry_dir(root, spec)
    if path.exists() or path.is_symlink():
        return path, PublishOutcome.existing
    st = st_embedder or SentenceTransformerEmbedder(spec, threads=threads)
    if st.spec != spec:
        raise ValueError(
            f"the sentence-transformers model is of spec {own_spec_id('embeddings', st.spec)}, not of {own_spec_id('embeddings', spec)}"
        )
    return publish_graph(root, export_graph(st, graph=graph), threads=threads, on_step=on_step)


def export_graph(
    st: SentenceTransformerEmbedder, spec: EmbedderSpec | None = None, graph: bytes | None = None
) -> ExportedGraph:
    """The graph and tokenizer of ``spec``'s entry (default ``st.spec``; another runtime or
    quantisation of ``st``'s model) with torch's probe vectors and token IDs. ``graph``: the int8
    graph to publish, made already (``pin_graph``) or adopted from an entry being rebuilt, instead
    of quantising here."""
    spec = spec or st.spec
    if _model_fields(spec) != _model_fields(st.spec):
        raise ValueError(f"the sentence-transformers model is not the model of {own_spec_id('embeddings', spec)}")
    folder = getattr(st, "model_dir", None) or model_directory(st.spec)  # verified when st was loaded
    tokenizer = folder / TOKENIZER
    if not tokenizer.is_file():
        raise QueryGraphError(
            f"{tokenizer.parent} has no {TOKENIZER}: the onnxruntime runtime tokenizes with the "
            f"model's fast-tokenizer file; {_fallback(spec)}"
        )
    texts = [spec.query_prefix + probe for probe in PARITY_PROBES]
    kind = graph_kind(spec)
    documents = () if kind == "exported" else PARITY_PROBES
    return ExportedGraph(
        spec=spec,
        graph=graph if graph is not None and kind == "fused_int8" else _graph(st, kind),
        tokenizer=tokenizer.read_bytes(),
        reference_vectors=tuple(st.embed_query(probe) for probe in PARITY_PROBES),
        reference_tokens=tuple(_st_token_ids(st, text) for text in texts),
        created_with=_versions("torch", "sentence-transformers", "onnxruntime", "onnx", "tokenizers"),
        document_vectors=tuple(st.embed([probe])[0] for probe in documents),
        document_tokens=tuple(_st_token_ids(st, spec.document_prefix + probe) for probe in documents),
    )


def _model_fields(spec: EmbedderSpec) -> dict:
    """What a sentence-transformers model loaded for ``spec`` computes: the spec without its
    document runtime, quantisation and graph pin."""
    return spec.model_dump(exclude={"runtime", "quantization", "graph_sha256"})


def _graph(st: SentenceTransformerEmbedder, kind: GraphKind) -> bytes:
    """The graph of ``kind``: fused graphs are exported with eager attention, whose operator
    pattern (unlike SDPA's) onnxruntime's attention fusion recognises."""
    if kind == "exported":
        return _export(st)
    config = st.model[0].auto_model.config
    fused = fuse_bert(_export(st, attention="eager"), config.num_attention_heads, config.hidden_size)
    return quantize_int8(fused) if kind == "fused_int8" else fused


def graph_digest(graph: bytes) -> str:
    """``sha256:<hex>`` of a graph file's bytes: what ``graph_sha256`` pins."""
    return "sha256:" + hashlib.sha256(graph).hexdigest()


def pin_graph(
    root: Path, spec: EmbedderSpec, threads: int = 2, st_embedder: SentenceTransformerEmbedder | None = None
) -> tuple[EmbedderSpec, OnnxEncoder]:
    """This host's int8 graph of ``spec``'s model (its runtime, quantisation and pin are ignored),
    published under ``root`` as the entry of the embedder spec that pins it, and that spec with
    the verified encoder: ``ragpipe embedder pin-graph``. Creation's checks apply (token IDs,
    cosine to torch at least ``INT8_MIN_COSINE``). The graph is made every time (its digest names
    the entry); an entry already there is loaded, not published again."""
    data = {**_model_fields(spec), "runtime": "onnxruntime"}
    model = EmbedderSpec.model_validate(data)
    st = st_embedder or SentenceTransformerEmbedder(model, threads=threads)
    graph = _graph(st, "fused_int8")
    pinned = EmbedderSpec.model_validate({**data, "quantization": "int8", "graph_sha256": graph_digest(graph)})
    if not entry_dir(root, pinned).exists():
        publish_graph(root, export_graph(st, pinned, graph), threads=threads)
    return pinned, query_encoder(root, pinned, threads=threads)


def check_pin(spec: EmbedderSpec, graph: bytes) -> None:
    """``QueryGraphError`` unless ``graph`` is the int8 graph ``spec`` pins (nothing to check for
    other graphs): one line with both digests and what to do."""
    if graph_kind(spec) != "fused_int8":
        return
    made = graph_digest(graph)
    if made != spec.graph_sha256:
        key = entry_key(spec).removeprefix("sha256:")
        raise QueryGraphError(
            f"embedder graph_sha256: the int8 graph of {spec.label} made here is {made}, the spec pins "
            f"{spec.graph_sha256} (onnxruntime {_versions('onnxruntime')['onnxruntime']} quantises it otherwise than "
            f"where it was pinned); copy query_graphs/{key}/ from a home that has the pinned graph, or pin {made} "
            "(`ragpipe embedder pin-graph`: another embedder, whose documents are embedded again)"
        )


def publish_graph(
    root: Path, exported: ExportedGraph, threads: int = 2, on_step: StepHook | None = None
) -> tuple[Path, PublishOutcome]:
    """Publish ``exported`` as its spec's entry under ``root`` (no torch needed): the standalone
    path must reproduce the reference on every probe, and the temp entry must pass the loader's
    checks, before it becomes visible."""
    spec = exported.spec
    final = entry_dir(root, spec)
    check_pin(spec, exported.graph)
    key = sealing_key(root, create=True)

    def write_data(tmp: Path) -> None:
        (tmp / MODEL).write_bytes(exported.graph)
        (tmp / TOKENIZER).write_bytes(exported.tokenizer)

    def write_manifest(tmp: Path) -> None:
        # the standalone path over the files as written, exactly what a load runs
        encoder = OnnxEncoder(spec, (tmp / MODEL).read_bytes(), (tmp / TOKENIZER).read_text("utf-8"), threads)
        _check_tokens(encoder, exported)
        if graph_kind(spec) == "fused_int8":
            recorded, cosine = _own_probes(encoder, exported)
            (tmp / MANIFEST).write_bytes(_manifest_bytes(tmp, exported, recorded, 0.0, cosine, key))
        else:
            worst = _check_parity(encoder, exported)
            recorded = (exported.reference_vectors, exported.document_vectors)
            (tmp / MANIFEST).write_bytes(_manifest_bytes(tmp, exported, recorded, worst, None, key))

    outcome = publish_directory(
        final, write_data, write_manifest, on_step=on_step, validate=lambda tmp: _verified(tmp, spec, threads, key)
    )
    return final, outcome


def _check_tokens(encoder: OnnxEncoder, exported: ExportedGraph) -> None:
    """``QueryGraphError`` at the first probe the model's tokenizer file tokenizes otherwise than
    sentence-transformers does (query prefix, and document prefix for a fused graph)."""
    spec = exported.spec
    expected = [(spec.query_prefix + p, t) for p, t in zip(PARITY_PROBES, exported.reference_tokens)]
    expected += [(spec.document_prefix + p, t) for p, t in zip(PARITY_PROBES, exported.document_tokens)]
    for text, tokens in expected:
        got = tuple(encoder.token_ids(text))
        if got != tokens:
            raise QueryGraphError(
                f"the model's {TOKENIZER} tokenizes probe {text[:40]!r} into other token IDs than sentence-transformers "
                f"({len(got)} vs {len(tokens)} tokens); {_fallback(spec)}"
            )


def _probe_vectors(encoder: OnnxEncoder, documents: bool) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """``encoder``'s query vectors of the probes, and its document vectors when ``documents``."""
    queries = tuple(encoder.embed_query(probe) for probe in PARITY_PROBES)
    return queries, tuple(encoder.embed_document(probe) for probe in PARITY_PROBES) if documents else ()


def _check_parity(encoder: OnnxEncoder, exported: ExportedGraph) -> float:
    """The worst component difference between ``encoder`` and the reference over the probes;
    ``QueryGraphError`` at the first probe beyond the tolerance."""
    queries, documents = _probe_vectors(encoder, bool(exported.document_vectors))
    pairs = zip((*queries, *documents), (*exported.reference_vectors, *exported.document_vectors))
    worst = 0.0
    for index, (got, expected) in enumerate(pairs):
        difference = float(np.abs(got - expected).max())
        if not difference <= PARITY_TOLERANCE:
            probe = PARITY_PROBES[index % len(PARITY_PROBES)]
            side = "query" if index < len(PARITY_PROBES) else "document"
            raise QueryGraphError(
                f"onnxruntime {side} vectors differ from sentence-transformers by {difference:.3g} "
                f"(> {PARITY_TOLERANCE}) on probe {probe[:40]!r}; {_fallback(exported.spec)}"
            )
        worst = max(worst, difference)
    return worst


def _own_probes(
    encoder: OnnxEncoder, exported: ExportedGraph
) -> tuple[tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]], float]:
    """An int8 graph's own probe vectors (what later loads must reproduce) and their least cosine
    to torch's; ``QueryGraphError`` below ``INT8_MIN_COSINE``."""
    queries, documents = _probe_vectors(encoder, True)
    references = (*exported.reference_vectors, *exported.document_vectors)
    cosine = min(
        float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
        for a, b in zip((*queries, *documents), references)
    )
    if not cosine >= INT8_MIN_COSINE:
        raise QueryGraphError(
            f"the int8 graph's probe vectors are at cosine {cosine:.4f} from torch's (< {INT8_MIN_COSINE}): "
            "the quantisation broke this model; use quantization: none"
        )
    return (queries, documents), cosine


def _fallback(spec: EmbedderSpec) -> str:
    """What to do when the onnxruntime graph of ``spec`` cannot be used."""
    if spec.runtime == "onnxruntime":
        return "use embedder runtime: sentence_transformers"
    return "use query_embedding.runtime: sentence_transformers"


def _probes(vectors: tuple[np.ndarray, ...]) -> tuple[Probe, ...]:
    return tuple(Probe(text=t, vector=tuple(float(x) for x in v)) for t, v in zip(PARITY_PROBES, vectors))


def _manifest_bytes(
    folder: Path,
    exported: ExportedGraph,
    recorded: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]],
    worst: float,
    cosine: float | None,
    key: SealKey,
) -> bytes:
    """The manifest, sealed with ``key`` (HMAC-SHA256 of its canonical form: ``SEAL_DOMAIN``)."""
    spec = exported.spec
    manifest = QueryGraphManifest(
        kind=MANIFEST_KIND,
        format_version=FORMAT_VERSION,
        key=entry_key(spec),
        embedder_spec_id=own_spec_id("embeddings", spec),
        weights_sha256=model_digest(spec),
        dimensions=spec.dimensions,
        max_seq_length=spec.max_seq_length,
        query_prefix=spec.query_prefix,
        files={name: _file_facts((folder / name).read_bytes()) for name in PAYLOAD},
        probes=_probes(recorded[0]),
        parity_tolerance=PARITY_TOLERANCE,
        max_difference=worst,
        created_with=exported.created_with,
        graph=graph_kind(spec),
        document_probes=_probes(recorded[1]),
        min_cosine_to_torch=cosine,
        probes_passed_on=runtime_host(),
    )
    document = sealed(manifest.model_dump(mode="json", exclude_defaults=True), SEAL_DOMAIN, key)
    return json.dumps(document, indent=1, sort_keys=True).encode() + b"\n"


def _file_facts(data: bytes) -> EntryFile:
    return EntryFile(bytes=len(data), sha256="sha256:" + hashlib.sha256(data).hexdigest())


def _verified(folder: Path, spec: EmbedderSpec, threads: int, key: SealKey | None) -> OnnxEncoder:
    """The encoder of the entry in ``folder`` (published, or the temp folder being published)
    once every load rule holds: ``UntrustedManifest`` unless its manifest is sealed with ``key``
    and describes this entry, ``QueryGraphError`` when the files are not what it describes."""

    def refuse(file: str | None, rule: str) -> QueryGraphError:
        where = f"{folder}/{file}" if file else str(folder)
        return QueryGraphError(f"query graph {where}: {rule}; remove {folder} to re-create it")

    def untrusted(_file: str | None, rule: str) -> QueryGraphError:
        return UntrustedManifest(f"query graph {folder}/{MANIFEST}: {rule}")

    manifest = _read_manifest(folder, key, untrusted)
    _check_identity(manifest, spec, untrusted)
    payload = _read_payload(folder, manifest, refuse)
    recorded = manifest.files[MODEL].sha256  # the bytes' digest: _read_payload checked it
    if manifest.graph == "fused_int8" and recorded != spec.graph_sha256:
        raise refuse(MODEL, f"sha256 {recorded} is not the graph the embedder pins (graph_sha256 {spec.graph_sha256})")
    try:
        encoder = OnnxEncoder(spec, payload[MODEL], payload[TOKENIZER].decode("utf-8"), threads)
    except Exception as exc:  # onnxruntime and tokenizers raise their own types for bytes they cannot parse
        raise refuse(None, f"cannot be loaded ({_first_line(exc)})") from None
    encoder.entry = Path(folder)
    encoder.min_cosine_to_torch = manifest.min_cosine_to_torch
    encoder.probes_run = manifest.probes_passed_on != runtime_host()
    # The sealed manifest says these exact bytes (hashed above) passed the probes under this
    # onnxruntime, tokenizers and CPU: running them again would only repeat that.
    encoder.max_difference = _probe(encoder, manifest, refuse) if encoder.probes_run else manifest.max_difference
    return encoder


def _probe(encoder: OnnxEncoder, manifest: QueryGraphManifest, refuse: Refuse) -> float:
    """The worst difference between ``encoder``'s probe vectors and the recorded ones; refused at
    the first beyond ``PARITY_TOLERANCE``."""
    worst = 0.0
    source = "its own recorded" if manifest.graph == "fused_int8" else "the recorded sentence-transformers"
    checks = [(probe, encoder.embed_query) for probe in manifest.probes]
    checks += [(probe, encoder.embed_document) for probe in manifest.document_probes]
    for probe, embed in checks:
        expected = np.asarray(probe.vector, dtype=np.float32)
        difference = float(np.abs(embed(probe.text) - expected).max())
        if not difference <= PARITY_TOLERANCE:
            side = "query" if embed == encoder.embed_query else "document"
            raise refuse(
                None,
                f"{MODEL} and {TOKENIZER} give {side} probe {probe.text[:40]!r} a vector {difference:.3g} away from "
                f"{source} vector (> {PARITY_TOLERANCE})",
            )
        worst = max(worst, difference)
    return worst


def _read_manifest(folder: Path, key: SealKey | None, refuse: Refuse) -> QueryGraphManifest:
    """The manifest, once it is read strictly (one descriptor, no link, at most
    ``MAX_MANIFEST_BYTES``; JSON without duplicate keys, within 64 levels) and its seal proves it
    was written with ``key``."""
    path = folder / MANIFEST
    try:
        data = read_regular(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise refuse(MANIFEST, "is missing") from None
    except OSError as exc:
        raise refuse(MANIFEST, f"cannot be read ({exc.strerror or exc})") from None
    try:
        document = load_json(data.decode("utf-8"), MANIFEST)
    except UnicodeDecodeError as exc:
        raise refuse(MANIFEST, f"is not UTF-8 (byte {exc.start + 1})") from None
    except StrictLoadError as exc:
        raise refuse(MANIFEST, f"is not a sealed manifest (line {exc.line}: {exc.rule})") from None
    if not isinstance(document, dict):
        raise refuse(MANIFEST, f"is not a sealed manifest (a JSON {type(document).__name__}, not an object)")
    if SEAL not in document:
        raise refuse(MANIFEST, "is not sealed (written before manifests were sealed, or by someone without the key)")
    if key is None:
        raise refuse(MANIFEST, "no verification key exists in this home: it cannot have been sealed here")
    try:
        content, problem = unsealed(document, SEAL_DOMAIN, key)
    except ValueError as exc:  # content without a canonical form (kernel.canonical): never sealed
        raise refuse(MANIFEST, f"is not a sealed manifest ({_first_line(exc)})") from None
    if problem is not None:
        raise refuse(MANIFEST, problem)
    try:
        return QueryGraphManifest.model_validate(content)
    except ValueError as exc:  # pydantic's ValidationError
        raise refuse(MANIFEST, f"is not a query-graph manifest ({_first_error(exc)})") from None


def _check_identity(manifest: QueryGraphManifest, spec: EmbedderSpec, refuse: Refuse) -> None:
    """The manifest describes ``spec``'s entry of this format, with this version's probes."""
    key = entry_key(spec)
    if manifest.key != key:
        raise refuse(MANIFEST, f"key {manifest.key} is not this embedder's key {key}")
    expected = {
        "format_version": FORMAT_VERSION,
        "embedder_spec_id": own_spec_id("embeddings", spec),
        "weights_sha256": model_digest(spec),
        "dimensions": spec.dimensions,
        "max_seq_length": spec.max_seq_length,
        "query_prefix": spec.query_prefix,
        "graph": graph_kind(spec),
    }
    for field, value in expected.items():
        if getattr(manifest, field) != value:
            raise refuse(MANIFEST, f"{field} {getattr(manifest, field)!r} is not the embedder's {value!r}")
    if tuple(p.text for p in manifest.probes) != PARITY_PROBES:
        raise refuse(MANIFEST, "its probes are not the parity probes of this version")
    documents = () if manifest.graph == "exported" else PARITY_PROBES
    if tuple(p.text for p in manifest.document_probes) != documents:
        raise refuse(MANIFEST, "its document probes are not the parity probes a fused graph records")
    if (manifest.min_cosine_to_torch is None) != (manifest.graph != "fused_int8"):
        raise refuse(MANIFEST, "min_cosine_to_torch is recorded for int8 graphs, and only for them")
    if any(len(p.vector) != spec.dimensions for p in (*manifest.probes, *manifest.document_probes)):
        raise refuse(MANIFEST, f"a probe vector does not have {spec.dimensions} components")


def _read_payload(folder: Path, manifest: QueryGraphManifest, refuse: Refuse) -> dict[str, bytes]:
    """Each payload file's bytes, once its size and sha256 match the manifest."""
    if sorted(manifest.files) != sorted(PAYLOAD):
        raise refuse(MANIFEST, f"lists files {sorted(manifest.files)}, not {sorted(PAYLOAD)}")
    present = sorted(entry.name for entry in os.scandir(folder))
    if present != sorted((*PAYLOAD, MANIFEST)):
        raise refuse(None, f"holds {present}, not exactly {sorted((*PAYLOAD, MANIFEST))}")
    payload = {}
    for name in PAYLOAD:
        recorded = manifest.files[name]
        path = folder / name
        if path.is_symlink() or not path.is_file():
            raise refuse(name, "is not a regular file")
        size = path.stat().st_size
        if size != recorded.bytes:  # a truncated file, told apart before hashing it
            raise refuse(name, f"has {size} bytes, the manifest records {recorded.bytes}")
        data = path.read_bytes()
        actual = _file_facts(data).sha256
        if actual != recorded.sha256:
            raise refuse(name, f"sha256 {actual} does not match the manifest's {recorded.sha256}")
        payload[name] = data
    return payload


def _export(st: SentenceTransformerEmbedder, attention: str | None = None) -> bytes:
    """The ONNX graph of ``st``'s model: transformer, mean pooling, L2 normalisation (per spec or
    model); ``attention``: the transformers attention implementation to trace (None: the model's)."""
    import torch

    model = st.model
    kinds = [type(m).__name__ for m in model]
    if kinds[:2] != ["Transformer", "Pooling"] or set(kinds[2:]) - {"Normalize"}:
        raise QueryGraphError(
            f"the onnxruntime runtime supports Transformer + Pooling (+ Normalize) models, not {kinds}"
        )
    pooling = model[1].get_config_dict().get("pooling_mode")
    if pooling != "mean":
        raise QueryGraphError(f"the onnxruntime runtime supports mean pooling only, model uses {pooling!r}")
    normalize = st.spec.normalize or "Normalize" in kinds
    transformer = model[0].auto_model.eval()

    class MeanPooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids, attention_mask, token_type_ids):
            tokens = self.transformer(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1) if normalize else pooled

    configured = transformer.config._attn_implementation
    if attention is not None:
        transformer.config._attn_implementation = attention
    try:
        return _traced(MeanPooled().eval(), model.tokenizer)
    finally:
        transformer.config._attn_implementation = configured


def _traced(module, tokenizer) -> bytes:
    """torch's ONNX export of ``module`` (inputs ``INPUTS``, dynamic batch and token axes)."""
    import torch

    encoded = tokenizer(["example query"], return_tensors="np")
    example = tuple(torch.tensor(np.asarray(encoded[k], dtype=np.int64)) for k in INPUTS)
    buffer = io.BytesIO()
    # The tracer's warnings are about shapes it treats as constants; the parity check (not the
    # warnings) is what proves the exported graph right.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            example,
            buffer,
            input_names=list(INPUTS),
            output_names=["embedding"],
            dynamic_axes={k: {0: "batch", 1: "tokens"} for k in INPUTS},
            opset_version=17,
            dynamo=False,
        )
    return buffer.getvalue()


def _st_token_ids(st: SentenceTransformerEmbedder, text: str) -> tuple[int, ...]:
    """The token IDs sentence-transformers' own encode path feeds its model for ``text``."""
    tokenize = getattr(st.model, "preprocess", None) or st.model.tokenize  # preprocess: sentence-transformers >= 6
    return tuple(int(i) for i in np.asarray(tokenize([text])["input_ids"])[0])


def _versions(*packages: str) -> dict[str, str]:
    return {name: metadata.version(name) for name in packages}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "document"
        return f"{where}: {first.get('msg')}"
    return _first_line(exc)
