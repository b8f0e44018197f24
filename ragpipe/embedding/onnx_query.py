"""Embedding through onnxruntime: the only module that imports onnxruntime.

One short query through sentence-transformers costs ~6-7 ms on 2 cores, most of it torch's
per-operator overhead; the same network run by onnxruntime costs ~3 ms. ``OnnxEncoder`` runs
the query-side graph of the bundle's sentence-transformers model (transformer, mean pooling, L2
normalisation) and tokenizes with that model's own ``tokenizer.json`` through the ``tokenizers``
library: no torch, transformers or sentence-transformers is imported. The graph and tokenizer
come from a verified query-graph cache entry (``ragpipe.embedding.query_graph``), which exports
the graph once with torch and proves that *this* code path reproduces the sentence-transformers
vectors on ``PARITY_PROBES`` to within ``PARITY_TOLERANCE`` per component — so the query is
embedded with the bundle's embedder spec (same weights, prefix, truncation, pooling,
normalisation), by a faster runtime. Which runtime embeds queries is a query-plan field, so it is
part of the plan ID.

An embedder spec with ``runtime: onnxruntime`` also encodes its *documents* here (``embed``), from
its own entry, whose graph carries BERT operator fusions (``query_graph``), one text per run:
no padding, so a text's vector never depends on which texts it was batched with — a cached vector
is the vector that text gets in any build — and the parity probes check exactly the computation
documents get. Length-sorted padded batches of 8 or 16 were no faster in a probe run
(docs/benchmarks.md, "Document encoding"), so nothing is given up for that independence.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import numpy as np

from ragpipe.embedding.embedder import check_vectors
from ragpipe.spec import EmbedderSpec

PARITY_TOLERANCE = 1e-5
# Short and long, prefix-free and punctuated, one beyond max_seq_length after tokenising.
PARITY_PROBES = (
    "aspirin",
    "Does low-dose aspirin reduce the risk of a first stroke in older adults?",
    "0-dimensional biomaterials show inductive properties.",
    "ß-catenin, TGF-β & IL-6: 3 pathways; 40% of cases (n=1,234).",
    " ".join(["long"] * 400),
)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class OnnxEncoder:
    """``embed_query`` (and ``embed``, documents) with the vectors of sentence-transformers' for ``spec``,
    computed by onnxruntime from ``graph`` (the serialized ONNX model) and tokenized by
    ``tokenizer_json`` (the model's ``tokenizer.json`` text), truncated to ``spec.max_seq_length``
    tokens and never padded. It checks nothing itself: build it through
    ``ragpipe.embedding.query_graph`` (``query_encoder``), which verifies the bytes and the vectors.

    ``threads``: onnxruntime intra-op threads (operational: never changes a vector beyond the
    parity tolerance). Workers spin between operators within a run (waking sleeping workers per
    operator is slower) but stop spinning as soon as a run ends, so they do not steal the cores
    lancedb needs right after (docs/retrieval.md, Threads).

    Thread-safe: onnxruntime sessions accept concurrent ``run`` calls, and the tokenizer is
    configured once here and only read afterwards (``encode`` takes no mutable borrow)."""

    thread_safe = True
    entry: Path | None = None  # the cache entry it was loaded from (set by query_graph)
    max_difference: float | None = None  # worst probe difference (at load, or recorded if the probes were skipped)
    probes_run: bool = False  # whether the load ran the probes (query_graph: skipped where they passed)
    min_cosine_to_torch: float | None = None  # an int8 graph's: its probes' least cosine to torch's, at creation

    def __init__(self, spec: EmbedderSpec, graph: bytes, tokenizer_json: str, threads: int = 2):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.spec = spec
        self.dimensions = spec.dimensions
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
        options.add_session_config_entry("session.force_spinning_stop", "1")
        options.log_severity_level = 3
        self.session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_str(tokenizer_json)
        # A tokenizer.json may carry its own truncation and padding (this model's pads to 128):
        # sentence-transformers truncates at max_seq_length and pads a single text not at all.
        tokenizer.no_padding()
        tokenizer.enable_truncation(spec.max_seq_length)
        self._tokenizer = tokenizer

    def token_ids(self, text: str) -> list[int]:
        """The token IDs the graph is given for ``text`` (no query prefix added)."""
        return self._tokenizer.encode(text).ids

    def _inputs(self, text: str) -> dict[str, np.ndarray]:
        encoded = self._tokenizer.encode(text)
        columns = (encoded.ids, encoded.attention_mask, encoded.type_ids)
        return {name: np.asarray([column], dtype=np.int64) for name, column in zip(INPUTS, columns)}

    def _vector(self, text: str) -> np.ndarray:
        (vectors,) = self.session.run(None, self._inputs(text))
        return check_vectors(np.asarray(vectors), 1, self.dimensions)[0]

    def embed_query(self, text: str) -> np.ndarray:
        """The float32 vector of ``spec.query_prefix + text``."""
        return self._vector(self.spec.query_prefix + text)

    def embed_document(self, text: str) -> np.ndarray:
        """The float32 vector of ``spec.document_prefix + text``."""
        return self._vector(self.spec.document_prefix + text)

    def embed(self, texts: list[str]) -> np.ndarray:
        """The documents' vectors, one row per text (each text run alone: see the module docstring)."""
        if not texts:
            return np.zeros((0, self.dimensions), np.float32)
        return np.stack([self.embed_document(text) for text in texts])


def runtime_host() -> dict[str, str]:
    """What decides the vectors a graph gives here besides its bytes: the onnxruntime and
    tokenizers versions, and the CPU — its architecture and instruction-set flags, which select
    onnxruntime's kernels (AVX2, AVX-512, VNNI int8 dot products …): ``cpu`` is a digest of the
    sorted flags (``/proc/cpuinfo``, else the processor's name). The query-graph cache records it
    where an entry's probes passed, and skips them on a load that finds the same."""
    return dict(_runtime_host())


@cache
def _runtime_host() -> tuple[tuple[str, str], ...]:
    import onnxruntime
    import tokenizers

    return (
        ("onnxruntime", onnxruntime.__version__),
        ("tokenizers", tokenizers.__version__),
        ("machine", platform.machine()),
        ("cpu", "sha256:" + hashlib.sha256(_cpu_flags().encode()).hexdigest()[:16]),
    )


def _cpu_flags() -> str:
    """The CPU's instruction-set flags, sorted (the first processor's ``flags``, or ``Features``
    on ARM, in ``/proc/cpuinfo``); the processor's name where there is no such file."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    return " ".join(sorted(value.split()))
    except OSError:
        pass
    return platform.processor() or "unknown"


def fuse_bert(graph: bytes, num_heads: int, hidden_size: int) -> bytes:
    """``graph`` with onnxruntime's BERT operator fusions applied offline (attention, embedding and
    skip layer normalisation, bias GELU): what makes the document runtime faster than torch (an
    unfused export is not). The result is checked against torch on the probes by the caller."""
    import onnx
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(
        onnx.load_from_string(graph), model_type="bert", num_heads=num_heads, hidden_size=hidden_size, opt_level=0
    )
    with tempfile.TemporaryDirectory() as folder:
        # saving sorts the nodes and declares the com.microsoft opset the fused operators need
        path = Path(folder) / "fused.onnx"
        fused.save_model_to_file(str(path))
        return path.read_bytes()


def quantize_int8(graph: bytes) -> bytes:
    """``graph`` with its MatMul weights quantized to int8 per channel, activations quantized per
    run (onnxruntime's dynamic quantization). Weights use 7 bits (``reduce_range``): a u8×s8 product
    pair then never saturates the 16-bit intermediate of AVX2 kernels, so hosts with and without
    VNNI compute the same integer sums."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as folder, _without_preprocessing_advice():
        source, target = Path(folder) / "fused.onnx", Path(folder) / "int8.onnx"
        source.write_bytes(graph)
        quantize_dynamic(
            source,
            target,
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=True,
            # fused operators (com.microsoft) defeat shape inference: their outputs are float32
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        return target.read_bytes()


@contextmanager
def _without_preprocessing_advice() -> Iterator[None]:
    """Drop the quantizer's advice to pre-process the model (logged on the root logger, so it would
    reach a build's stderr): shape pre-processing is for static quantization; the parity checks, not
    that advice, decide whether the graph is used."""

    def drop(record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()

    root = logging.getLogger()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)
