"""Query embedding through onnxruntime: the only module that imports onnxruntime.

One short query through sentence-transformers costs ~6-7 ms on 2 cores, most of it torch's
per-operator overhead; the same network run by onnxruntime costs ~3 ms. ``OnnxQueryEncoder``
exports the *already loaded and digest-checked* sentence-transformers model (transformer, mean
pooling, L2 normalisation) with torch's own ONNX exporter, in memory, and refuses to serve unless
its vectors match the sentence-transformers vectors on a fixed probe set to within
``PARITY_TOLERANCE`` per component — so the query is embedded with the bundle's embedder spec
(same weights, prefix, truncation, pooling, normalisation), by a faster runtime. Which runtime
embeds queries is a query-plan field, so it is part of the plan ID.
"""

from __future__ import annotations

import io
import threading
import warnings

import numpy as np

from ragpipe.embedding.embedder import EmbedderError, SentenceTransformerEmbedder, check_vectors

PARITY_TOLERANCE = 1e-5
# Short and long, prefix-free and punctuated, one beyond max_seq_length after tokenising.
PARITY_PROBES = (
    "aspirin",
    "Does low-dose aspirin reduce the risk of a first stroke in older adults?",
    "0-dimensional biomaterials show inductive properties.",
    "ß-catenin, TGF-β & IL-6: 3 pathways; 40% of cases (n=1,234).",
    " ".join(["long"] * 400),
)
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _export(st_embedder: SentenceTransformerEmbedder) -> bytes:
    import torch

    model = st_embedder.model
    kinds = [type(m).__name__ for m in model]
    if kinds[:2] != ["Transformer", "Pooling"] or set(kinds[2:]) - {"Normalize"}:
        raise EmbedderError(
            f"onnxruntime query runtime supports Transformer + Pooling (+ Normalize) models, not {kinds}"
        )
    pooling = model[1].get_config_dict().get("pooling_mode")
    if pooling != "mean":
        raise EmbedderError(f"onnxruntime query runtime supports mean pooling only, model uses {pooling!r}")
    normalize = st_embedder.spec.normalize or "Normalize" in kinds
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

    example = {k: torch.tensor(v) for k, v in _tokenize(st_embedder, "example query").items()}
    buffer = io.BytesIO()
    # The tracer's warnings are about shapes it treats as constants; the parity check (not the
    # warnings) is what proves the exported graph right.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            MeanPooled().eval(),
            tuple(example[k] for k in _INPUTS),
            buffer,
            input_names=list(_INPUTS),
            output_names=["embedding"],
            dynamic_axes={k: {0: "batch", 1: "tokens"} for k in _INPUTS},
            opset_version=17,
            dynamo=False,
        )
    return buffer.getvalue()


# A Hugging Face fast tokenizer is not safe to call from several threads at once: a call may
# reconfigure its truncation/padding (a mutable borrow of the Rust tokenizer) while another thread
# encodes ("Already borrowed"). Tokenizing one query takes ~0.1 ms, so one lock costs little.
_TOKENIZER_LOCK = threading.Lock()


def _tokenize(st_embedder: SentenceTransformerEmbedder, text: str) -> dict[str, np.ndarray]:
    model = st_embedder.model
    with _TOKENIZER_LOCK:
        encoded = model.tokenizer([text], truncation=True, max_length=model.max_seq_length, return_tensors="np")
    return {k: np.asarray(encoded[k], dtype=np.int64) for k in _INPUTS}


class OnnxQueryEncoder:
    """``embed_query`` with the vectors of ``st_embedder.embed_query``, computed by onnxruntime.

    ``threads``: onnxruntime intra-op threads (operational: never changes a vector beyond the
    parity tolerance). Workers spin between operators within a run (waking sleeping workers per
    operator is slower) but stop spinning as soon as a run ends, so they do not steal the cores
    lancedb needs right after (docs/retrieval.md, Threads).

    Thread-safe: onnxruntime sessions accept concurrent ``run`` calls, and tokenizing is locked."""

    thread_safe = True

    def __init__(self, st_embedder: SentenceTransformerEmbedder, threads: int = 2):
        import onnxruntime as ort

        self.spec = st_embedder.spec
        self.dimensions = st_embedder.dimensions
        self._st = st_embedder
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
        options.add_session_config_entry("session.force_spinning_stop", "1")
        options.log_severity_level = 3
        self.session = ort.InferenceSession(_export(st_embedder), options, providers=["CPUExecutionProvider"])
        self.max_difference = self._check_parity()

    def _check_parity(self) -> float:
        worst = 0.0
        for probe in PARITY_PROBES:
            difference = float(np.abs(self.embed_query(probe) - self._st.embed_query(probe)).max())
            if not difference <= PARITY_TOLERANCE:
                raise EmbedderError(
                    f"onnxruntime query vectors differ from sentence-transformers by {difference:.3g} "
                    f"(> {PARITY_TOLERANCE}) on probe {probe[:40]!r}; use query_embedding.runtime: sentence_transformers"
                )
            worst = max(worst, difference)
        return worst

    def embed_query(self, text: str) -> np.ndarray:
        (vectors,) = self.session.run(None, _tokenize(self._st, self.spec.query_prefix + text))
        return check_vectors(np.asarray(vectors), 1, self.dimensions)[0]
