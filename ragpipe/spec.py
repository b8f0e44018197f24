"""The pipeline spec: one checked-in YAML file, one pydantic model per stage.

Each stage's *spec ID* is the domain-separated hash of (stage name, implementation version, the
stage's own spec, and the spec IDs of its inputs). It is used as the asset's Dagster
``code_version``, so a change to a chunker parameter changes the IDs of ``chunks`` and everything
downstream, while the ``execution`` section (batch sizes, threads) and the ``dagster`` section
(owners and tags shown in the Dagster UI) enter no ID at all.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializationInfo,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from ragpipe.kernel.ids import SpecId, content_id
from ragpipe.kernel.settings import current_settings
from ragpipe.kernel.strict_load import StrictLoadError, load_yaml
from ragpipe.work.disclosure import DisclosurePolicy, endpoint_identity
from ragpipe.work.policy import ExecutionPolicy

DEFAULT_SPEC_PATH = Path(__file__).parent / "specs" / "pipeline.yaml"

# Implementation versions: bump when a stage's code changes its output for the same spec.
IMPLEMENTATION_VERSIONS = {
    "source_snapshot": 1,
    "chunks": 1,
    "representations": 1,
    "embeddings": 1,
    "lexical_index": 3,
    "vector_index": 2,
    "index_bundle": 2,
}

STAGE_INPUTS: dict[str, tuple[str, ...]] = {
    "source_snapshot": (),
    "chunks": ("source_snapshot",),
    "representations": ("chunks",),
    "embeddings": ("representations",),
    "lexical_index": ("representations",),
    "vector_index": ("embeddings",),
    "index_bundle": ("lexical_index", "vector_index"),
}


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def endpoint_base(value: str | None, key_variable: str) -> str | None:
    """An ``api_base`` that enters a spec ID: an http(s) base URL, kept as its endpoint identity
    (scheme and host lower-cased, no trailing ``/``). Credentials (they belong in ``key_variable``),
    a query or a fragment would be lost in that form (and a credential has no place in an ID):
    refused with ``ValueError``."""
    if value is None:
        return None
    parts = urlsplit(value.strip())
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"must not carry credentials (set {key_variable})")
    if parts.query or parts.fragment:
        raise ValueError(f"{value!r}: a query or fragment is not part of an endpoint")
    try:
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError as exc:
        raise ValueError(f"{value!r}: {exc}") from None
    return endpoint_identity("", value)


class SnapshotSpec(_Spec):
    normalization: Literal["utf8-nfc-lf/v1"] = "utf8-nfc-lf/v1"
    min_text_chars: int = Field(20, ge=1)


class ChunkerSpec(_Spec):
    kind: Literal["markdown_heading", "sliding_window"] = "markdown_heading"
    max_bytes: int = Field(1200, ge=64, le=1_000_000)
    overlap_bytes: int = Field(200, ge=0)

    def model_post_init(self, __context: object) -> None:
        if self.overlap_bytes >= self.max_bytes // 2:
            raise ValueError(
                f"chunker.overlap_bytes ({self.overlap_bytes}) must be < max_bytes/2 ({self.max_bytes // 2})"
            )


DERIVED_KINDS = ("raw", "title_breadcrumb")  # pure functions of the chunk: verified by re-deriving
GeneratedKind = Literal["questions", "summary"]
RepresentationKind = Literal["raw", "title_breadcrumb", "questions", "summary"]
# The output contract of each generated kind: its version names the reply format and the checks a
# reply must pass (ragpipe.representations.generate); a change to either bumps it.
GENERATION_CONTRACTS: dict[str, str] = {"questions": "ragpipe.questions/v1", "summary": "ragpipe.summary/v1"}
DEFAULT_PROMPTS = Path(__file__).parent / "specs" / "prompts"
# The serialization context of a spec's identity dump: what enters its spec ID and a bundle manifest.
SEMANTIC = {"semantic": True}
# The validation context of a spec read back from such a record: prompts by digest only.
RECORDED = {"recorded": True}


class GeneratedKindSpec(_Spec):
    """How one generated kind is asked for: model, prompt, parameters, output contract — all
    semantic. The prompt enters the spec ID by the digest of its text, never by its path; a spec
    read back from a record (a bundle manifest) carries only the digest."""

    model: str = Field(min_length=1)
    prompt: Path | None = None  # None: ragpipe/specs/prompts/<kind>.txt; never in an ID
    prompt_text: str | None = Field(None, exclude=True, repr=False)
    prompt_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    n: int = Field(3, ge=1, le=20)  # questions per chunk (a summary is one: its default n is 1)
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(200, ge=1, le=32768)
    seed: int | None = 0
    max_chars: int = Field(300, ge=1, le=20_000)  # the longest one question or summary may be
    contract: str
    # Derived by the pipeline spec, never written: which endpoint computes this kind
    # (``ragpipe.work.disclosure.endpoint_identity``) and the scopes whose chunks it may be sent
    # (``["*"]``: every scope). Both enter the spec ID — another endpoint or disclosure is another
    # plan. None: a spec recorded before they existed (its ID stays what it was).
    endpoint: str | None = None
    send_scopes: tuple[str, ...] | None = None

    def may_send(self, scopes: tuple[str, ...]) -> bool:
        """Whether a chunk of a document with ``scopes`` may be sent to this kind's endpoint."""
        if self.send_scopes is None or "*" in self.send_scopes:
            return True
        return any(s in self.send_scopes for s in scopes)


def _with_prompt(kind: str, entry: object, base: Path, recorded: bool = False) -> object:
    """A ``generated`` entry with its prompt read and digested, its contract (and a summary's
    ``n: 1``) filled in. An entry
    that carries a digest and no prompt is a recorded spec and is left as it is."""
    if not isinstance(entry, Mapping):
        return entry
    entry = dict(entry)
    expected = GENERATION_CONTRACTS.get(kind)
    if expected is None:
        return entry  # pydantic refuses the key itself
    if entry.setdefault("contract", expected) != expected:
        raise ValueError(f"generated.{kind}.contract: must be {expected!r}")
    if kind == "summary":
        entry.setdefault("n", 1)  # a summary is one text: the questions' default of 3 cannot apply
    if recorded:
        # a spec read back from a record (a bundle manifest) names its prompt by digest only: a
        # path there would make a verifier read files a manifest chose
        if entry.get("prompt") is not None or entry.get("prompt_text") is not None:
            raise ValueError(f"generated.{kind}: a recorded spec carries prompt_digest only, not prompt or prompt_text")
        return entry
    if "prompt_digest" in entry and entry.get("prompt") is None and entry.get("prompt_text") is None:
        return entry
    if not isinstance(entry.get("prompt"), (str, Path, type(None))):
        raise ValueError(f"generated.{kind}.prompt: must be a path to a text file")
    if not isinstance(entry.get("prompt_text"), (str, type(None))):
        raise ValueError(f"generated.{kind}.prompt_text: must be a string")
    if entry.get("prompt_text") is None:
        path = Path(entry["prompt"]) if entry.get("prompt") is not None else DEFAULT_PROMPTS / f"{kind}.txt"
        path = path if path.is_absolute() else base / path
        try:
            entry["prompt_text"] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"generated.{kind}.prompt: cannot read {path}: {read_error_text(exc)}") from None
        entry["prompt"] = path
    digest = content_digest_of(entry["prompt_text"])
    if entry.setdefault("prompt_digest", digest) != digest:
        raise ValueError(f"generated.{kind}.prompt_digest: does not match the prompt's text ({digest})")
    return entry


DERIVED_GENERATION = ("endpoint", "send_scopes")


def _with_generation_identity(data: object) -> object:
    """Pipeline spec data with each generated kind's derived ``endpoint`` and ``send_scopes`` filled
    in from its model, ``execution.generation.api_base`` and ``disclosure``; refused when written."""
    if not isinstance(data, Mapping):
        return data
    reps = data.get("representations")
    generated = reps.get("generated") if isinstance(reps, Mapping) else getattr(reps, "generated", None)
    if not isinstance(generated, Mapping) or not generated:
        return data
    try:
        execution = ExecutionSettings.model_validate(data.get("execution") or {})
        disclosure = DisclosurePolicy.model_validate(data.get("disclosure") or {})
    except ValidationError:
        return data  # reported where it belongs by the fields' own validation
    api_base = execution.generation.api_base
    filled = {}
    for kind, entry in generated.items():
        if isinstance(entry, GeneratedKindSpec):
            entry = entry.model_dump(exclude=set(DERIVED_GENERATION)) | {"prompt_text": entry.prompt_text}
        elif isinstance(entry, Mapping):
            written = [f for f in DERIVED_GENERATION if f in entry]
            if written:
                raise ValueError(
                    f"representations.generated.{kind}.{written[0]}: derived from the kind's model, "
                    "execution.generation.api_base and disclosure; do not set it"
                )
        if isinstance(entry, Mapping) and isinstance(entry.get("model"), str):
            endpoint = endpoint_identity(entry["model"], api_base)
            entry = {**entry, "endpoint": endpoint, "send_scopes": disclosure.identity_part(endpoint)}
        filled[kind] = entry
    reps = reps.model_dump() | {"kinds": reps.kinds} if isinstance(reps, RepresentationSpec) else dict(reps)
    return {**data, "representations": {**reps, "generated": filled}}


def content_digest_of(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


class RepresentationSpec(_Spec):
    """Which representation kinds a chunk gets. ``generated`` configures the generated kinds
    (``questions``, ``summary``); only the entries of listed kinds enter the spec ID, so a spec
    that lists ``[raw]`` has one ID whatever it keeps configured for later."""

    kinds: tuple[RepresentationKind, ...] = DERIVED_KINDS
    generated: dict[GeneratedKind, GeneratedKindSpec] = {}

    @model_validator(mode="before")
    @classmethod
    def _read_prompts(cls, data: object, info: ValidationInfo) -> object:
        if not isinstance(data, Mapping) or not isinstance(data.get("generated"), Mapping):
            return data
        context = info.context or {}
        base, recorded = Path(context.get("base", Path.cwd())), bool(context.get("recorded"))
        generated = {k: _with_prompt(k, v, base, recorded) for k, v in data["generated"].items()}
        return {**data, "generated": generated}

    @model_validator(mode="after")
    def _kinds_configured(self) -> RepresentationSpec:
        if not self.kinds:
            raise ValueError("kinds: at least one kind is needed")
        if len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"kinds: {list(self.kinds)} lists a kind twice")
        for kind in self.kinds:
            if kind in GENERATION_CONTRACTS and kind not in self.generated:
                raise ValueError(f"kinds: {kind!r} is generated: configure it under representations.generated.{kind}")
        if "summary" in self.generated and self.generated["summary"].n != 1:
            raise ValueError("generated.summary.n: a summary is one text (n: 1)")
        return self

    @model_serializer(mode="wrap")
    def _semantic(self, handler, info: SerializationInfo) -> dict:
        """A dump keeps the prompt's path (so it loads again); the semantic dump (context
        ``{"semantic": True}``: spec IDs, bundle manifests) drops it and every entry of an unlisted kind."""
        out = handler(self)
        semantic = bool((info.context or {}).get("semantic"))
        # the derived fields are the pipeline spec's to fill: a plain dump (a spec file) leaves them out
        dropped = {"prompt"} if semantic else {"endpoint", "send_scopes"}
        used = {
            k: {f: x for f, x in v.items() if f not in dropped and not (f in DERIVED_GENERATION and x is None)}
            for k, v in (out.get("generated") or {}).items()
            if k in self.kinds or not semantic
        }
        if used:
            out["generated"] = used
        else:
            out.pop("generated", None)  # a spec without generated kinds keeps its former ID
        return out

    def __hash__(self) -> int:  # generated is a dict
        return hash((self.kinds, tuple(sorted(self.generated.items()))))

    @property
    def generated_kinds(self) -> tuple[str, ...]:
        return tuple(k for k in self.kinds if k in GENERATION_CONTRACTS)


_DIGEST = r"^sha256:[0-9a-f]{64}$"


class EmbedderSpec(_Spec):
    """The embedder: one of three forms, every field semantic except ``model_path``.

    * a packaged sentence-transformers model: ``model_name``, ``package`` (the installed Python
      package whose folder holds the model), ``weights_sha256`` (the weights' digest), and
      ``max_seq_length``;
    * a sentence-transformers model folder on disk: ``model_name``, ``model_path`` (operational:
      where the folder is, never in an ID; relative to the spec file), ``files_sha256`` (one digest
      over every file the model loads from: ``ragpipe.embedding.model_folder``) and
      ``max_seq_length``;
    * a remote embedder, ``provider: litellm``: ``model`` (a litellm model string,
      ``openai/text-embedding-3-small``, ``ollama/nomic-embed-text``), ``api_base`` (kept as its
      endpoint identity, ``ragpipe.work.disclosure.endpoint_identity``; None: the provider's
      default endpoint) and ``send_dimensions`` (ask the provider for ``dimensions``-long vectors,
      as OpenAI's text-embedding-3 models allow).

    A local model (either of the first two forms) encodes documents with ``runtime``:
    ``sentence_transformers`` (torch, the default) or ``onnxruntime`` (the model's ONNX graph with
    BERT operator fusions, one text per run: ``ragpipe.embedding.query_graph``). The two give
    vectors that differ in the last bits, so the runtime is part of the spec's identity and a
    bundle never mixes them; the onnxruntime graph is proved within ``PARITY_TOLERANCE`` of torch
    on probes when it is created and every time it is loaded. ``quantization: int8`` (onnxruntime
    only) runs that graph with int8 weights: another model in effect, faster and less exact, whose
    quality the gate judges on the suite like any experiment (docs/embedders.md). Quantising can
    give other bytes under another onnxruntime or on another host, so an int8 embedder pins its
    graph as ``weights_sha256`` pins weights: ``graph_sha256``, the SHA-256 of the int8 graph file
    (``ragpipe embedder pin-graph`` makes this host's graph and prints it); required with int8,
    refused without.

    Every form has ``dimensions``, ``normalize`` and the two prefixes. A field a form does not use
    is refused, and a field at its default is left out of the dump, so a packaged-model spec has
    exactly the identity it had before the other forms existed (docs/embedders.md).
    """

    model_name: str | None = Field(None, min_length=1)
    package: str | None = Field(None, min_length=1)
    weights_sha256: str | None = Field(None, pattern=_DIGEST)
    dimensions: int = Field(ge=1, le=65536)
    normalize: bool
    max_seq_length: int | None = Field(None, ge=1)
    document_prefix: str = ""
    query_prefix: str = ""
    provider: Literal["sentence_transformers", "litellm"] = "sentence_transformers"
    model_path: Path | None = None  # operational: never in an ID (files_sha256 is)
    files_sha256: str | None = Field(None, pattern=_DIGEST)
    model: str | None = Field(None, min_length=1)
    api_base: str | None = None
    send_dimensions: bool = False
    runtime: Literal["sentence_transformers", "onnxruntime"] = "sentence_transformers"
    quantization: Literal["none", "int8"] = "none"
    graph_sha256: str | None = Field(None, pattern=_DIGEST)

    @model_validator(mode="before")
    @classmethod
    def _resolve_model_path(cls, data: object, info: ValidationInfo) -> object:
        """A spec file's relative ``model_path`` is relative to the spec file's folder; a spec file
        (validation context ``base``) that pins a folder must say where it is."""
        context = info.context or {}
        if not isinstance(data, Mapping) or "base" not in context or context.get("recorded"):
            return data
        if data.get("files_sha256") is not None and data.get("model_path") is None:
            raise ValueError("model_path: a model folder pinned by files_sha256 needs its model_path")
        path = data.get("model_path")
        if isinstance(path, (str, Path)) and not Path(path).is_absolute():
            data = {**data, "model_path": Path(context["base"]) / path}
        return data

    @field_validator("api_base")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return endpoint_base(value, "RAGPIPE_EMBEDDER_API_KEY")

    @model_validator(mode="after")
    def _one_form(self) -> EmbedderSpec:
        def refuse(fields: dict[str, object], form: str) -> None:
            for name, default in fields.items():
                if getattr(self, name) != default:
                    raise ValueError(f"{name}: not used by {form}")

        if self.provider == "litellm":
            if self.model is None:
                raise ValueError("model: a litellm embedder names its model (e.g. openai/text-embedding-3-small)")
            fields = dict.fromkeys(("model_name", "package", "weights_sha256", "max_seq_length"))
            refuse(
                {
                    **fields,
                    "model_path": None,
                    "files_sha256": None,
                    "runtime": "sentence_transformers",
                    "quantization": "none",
                    "graph_sha256": None,
                },
                "a litellm embedder",
            )
            return self
        refuse({"model": None, "api_base": None, "send_dimensions": False}, "a sentence_transformers embedder")
        if self.model_name is None:
            raise ValueError("model_name: a sentence_transformers embedder names its model")
        if self.quantization != "none" and self.runtime != "onnxruntime":
            raise ValueError("quantization: int8 weights run on runtime: onnxruntime only")
        if self.quantization == "int8" and self.graph_sha256 is None:
            raise ValueError(
                "graph_sha256: an int8 embedder pins its int8 graph's digest "
                "(`ragpipe embedder pin-graph` makes this host's graph and prints it)"
            )
        if self.quantization != "int8" and self.graph_sha256 is not None:
            raise ValueError("graph_sha256: pins an int8 graph; not used without quantization: int8")
        if self.max_seq_length is None:
            raise ValueError("max_seq_length: a sentence_transformers embedder declares it")
        packaged = self.package is not None or self.weights_sha256 is not None
        folder = self.files_sha256 is not None or self.model_path is not None
        if packaged and folder:
            raise ValueError(
                "either a packaged model (package, weights_sha256) or a model folder (model_path, files_sha256), not both"
            )
        if folder and self.files_sha256 is None:
            raise ValueError(
                "files_sha256: a model folder is pinned by the digest of its files (ragpipe embedder pin PATH)"
            )
        if not folder and (self.package is None or self.weights_sha256 is None):
            missing = "package" if self.package is None else "weights_sha256"
            raise ValueError(f"{missing}: a packaged model names its package and pins its weights_sha256")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler, info: SerializationInfo) -> dict:
        """Fields at their defaults are left out (a packaged-model spec dumps as it always did);
        the semantic dump (spec IDs, bundle manifests) leaves out ``model_path`` too."""
        out = handler(self)
        for name, default in _EMBEDDER_DEFAULTS.items():
            if name in out and out[name] == default:
                del out[name]
        if (info.context or {}).get("semantic"):
            out.pop("model_path", None)
        return out

    @property
    def remote(self) -> bool:
        return self.provider == "litellm"

    @property
    def label(self) -> str:
        """The model's name for people: ``model_name``, or a litellm embedder's ``model``."""
        return self.model or self.model_name or ""

    @property
    def endpoint(self) -> str | None:
        """A litellm embedder's endpoint identity (``openai:default`` for the provider's own)."""
        return endpoint_identity(self.model, self.api_base) if self.model is not None else None


# Left out of a dump at these values (EmbedderSpec._dump). The two prefixes are not: a packaged
# spec has always written them.
_EMBEDDER_DEFAULTS: dict[str, object] = {
    "model_name": None,
    "package": None,
    "weights_sha256": None,
    "max_seq_length": None,
    "provider": "sentence_transformers",
    "model_path": None,
    "files_sha256": None,
    "model": None,
    "api_base": None,
    "send_dimensions": False,
    "runtime": "sentence_transformers",
    "quantization": "none",
    "graph_sha256": None,
}


class LexicalIndexSpec(_Spec):
    tokenizer: Literal["en_stem", "default"] = "en_stem"
    # tantivy's BM25 is fixed at k1=1.2, b=0.75; they are declared so the spec says what it does.
    bm25_k1: Literal[1.2] = 1.2
    bm25_b: Literal[0.75] = 0.75


class HnswSqIndex(_Spec):
    """lancedb's IVF_HNSW_SQ index: IVF partitions (k-means), one HNSW graph per partition over
    8-bit scalar-quantised vectors. ``num_partitions``: IVF partitions (lance recommends few: one
    graph per partition); ``m``: graph edges per node; ``ef_construction``: candidates kept while
    the graph is built. lancedb's own defaults for the last two."""

    kind: Literal["ivf_hnsw_sq"]
    num_partitions: int = Field(1, ge=1, le=65_536)
    m: int = Field(20, ge=2, le=512)
    ef_construction: int = Field(300, ge=1, le=100_000)


class PqIndex(_Spec):
    """lancedb's IVF_PQ index: IVF partitions (k-means) over product-quantised vectors, each split
    into ``num_sub_vectors`` sub-vectors (which must divide the embedder's dimensions) encoded in
    ``num_bits`` bits (4 or 8; 8-bit codebooks train on at least 256 rows)."""

    kind: Literal["ivf_pq"]
    num_partitions: int = Field(ge=1, le=65_536)
    num_sub_vectors: int = Field(ge=1, le=65_536)
    num_bits: Literal[4, 8] = 8


# Which approximate-nearest-neighbour index a vector table carries, by ``kind``.
AnnIndex = Annotated[HnswSqIndex | PqIndex, Field(discriminator="kind")]
ANN_KINDS = ("ivf_hnsw_sq", "ivf_pq")


class VectorIndexSpec(_Spec):
    # enabled: false builds lexical-only bundles (embeddings are then not computed at all).
    enabled: bool = True
    metric: Literal["cosine", "dot", "l2"] = "cosine"
    # An approximate-nearest-neighbour index built into the lance table (docs/retrieval.md,
    # "Approximate vector search"). It changes which rows an approximate query plan can find, so it
    # is semantic; left out of the dump when None, so a spec without one keeps its ID.
    ann: AnnIndex | None = None

    @model_serializer(mode="wrap")
    def _without_ann(self, handler) -> dict:
        out = handler(self)
        if out.get("ann", 0) is None:
            del out["ann"]
        return out


def ann_dimension_problem(ann: HnswSqIndex | PqIndex | None, dimensions: int) -> str | None:
    """Why ``ann`` cannot index vectors of ``dimensions`` (None: it can): a product quantiser
    splits each vector into ``num_sub_vectors`` equal parts."""
    if isinstance(ann, PqIndex) and dimensions % ann.num_sub_vectors:
        return f"{ann.num_sub_vectors} does not divide the embedder's {dimensions} dimensions (embedder.dimensions)"
    return None


class GenerationExecution(ExecutionPolicy):
    """How generated representations are computed: the step policy (``ragpipe.work.policy``), where
    the model is reached and how many invalid replies a build tolerates."""

    concurrency: int = Field(4, ge=1, le=64)
    # None: litellm's default for the model's provider. Which endpoint computes a kind enters its
    # spec ID and cache key (``GeneratedKindSpec.endpoint``): where it is reached is not operational.
    api_base: str | None = None
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    # More invalid replies than this fraction of the chunks sent fails the stage (nothing published).
    max_invalid_fraction: float = Field(0.05, ge=0, le=1)


class EmbeddingExecution(ExecutionPolicy):
    """How a remote embedder (``embedder.provider: litellm``) is called: the step policy
    (``ragpipe.work.policy``; ``batch_size`` texts per request) plus the request timeout.
    Operational: the endpoint and everything that can change a vector are in the embedder spec."""

    concurrency: int = Field(2, ge=1, le=64)
    batch_size: int = Field(64, ge=1, le=2048)
    timeout_seconds: float = Field(60.0, gt=0, le=3600)


class ExecutionSettings(_Spec):
    """Operational settings: they change speed, never results, and enter no ID."""

    embed_batch_size: int = Field(64, ge=1)
    torch_threads: int = Field(2, ge=1)
    index_writer_heap_mb: int = Field(128, ge=16)
    generation: GenerationExecution = GenerationExecution()
    embedding: EmbeddingExecution = EmbeddingExecution()


# Dagster's own rules for owners and tags (dagster/_core/utils.py is_valid_email,
# dagster/_utils/tags.py): checked here so a bad spec fails when it is loaded, naming the file.
_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Z|a-z]{2,7}\b")
_TAG_KEY = re.compile(r"^([A-Za-z0-9_.-]{1,63}/)?[A-Za-z0-9_.-]{1,63}$")
_TAG_VALUE = re.compile(r"^[A-Za-z0-9_.-]{0,63}$")


def _tag_items(value: object) -> object:
    """Tags are written as a mapping; they are kept as sorted pairs so the spec stays hashable."""
    if not isinstance(value, Mapping):
        return value
    for k, v in value.items():
        if not isinstance(k, str) or not _TAG_KEY.match(k):
            raise ValueError(f"tag key {k!r} must match {_TAG_KEY.pattern}")
        if not isinstance(v, str) or not _TAG_VALUE.match(v):
            raise ValueError(f"tag {k!r}: value {v!r} must be a string matching {_TAG_VALUE.pattern}")
    return tuple(sorted(value.items()))


Tags = Annotated[tuple[tuple[str, str], ...], BeforeValidator(_tag_items)]


class DagsterOwnership(_Spec):
    """Owners (``team:<name>`` or an email) and tags Dagster shows on an asset."""

    owners: tuple[str, ...] = ()
    tags: Tags = ()

    @field_validator("owners")
    @classmethod
    def _owners_valid(cls, owners: tuple[str, ...]) -> tuple[str, ...]:
        for owner in owners:
            if not (_EMAIL.fullmatch(owner) or (owner.startswith("team:") and len(owner) > 5)):
                raise ValueError(f"owner {owner!r} must be an email address or 'team:<name>'")
        return owners


# The evaluation → gate → release chain downstream of ``index_bundle`` (present when the spec has
# an ``evaluation:`` section); their code versions come from ``ragpipe.stages.chain_plan``.
CHAIN_ASSETS = ("evaluation_run", "gate_decision", "release_manifest")


class DagsterSettings(DagsterOwnership):
    """Operational: how assets appear in Dagster. Enters no ID (like ``execution``).

    ``owners`` and ``tags`` apply to every asset (and ``owners`` to the jobs); an entry under
    ``assets`` adds owners and overrides or adds tags for that asset.
    """

    assets: dict[Literal[tuple(STAGE_INPUTS) + CHAIN_ASSETS], DagsterOwnership] = {}  # type: ignore[valid-type]

    def __hash__(self) -> int:  # the assets dict would make the frozen model unhashable
        return hash((self.owners, self.tags, tuple(sorted(self.assets.items()))))

    def owners_for(self, stage: str) -> list[str]:
        extra = self.assets[stage].owners if stage in self.assets else ()
        return list(dict.fromkeys([*self.owners, *extra]))

    def tags_for(self, stage: str) -> dict[str, str]:
        extra = self.assets[stage].tags if stage in self.assets else ()
        return dict(self.tags) | dict(extra)


class EvaluationSection(_Spec):
    """What ``evaluation_run`` evaluates each revision's bundle with, and the gate policy its
    ``gate_decision`` applies. Relative paths are relative to the spec file (resolved at load).

    Semantic: every field except the paths themselves reaches an ID through the content it names
    (suite digest, plan ID, policy ID, judge spec ID; see ``ragpipe.stages.chain_plan``),
    never the path string. ``judge`` (a judge spec file, ``ragpipe.evaluation.judge_spec``) judges
    the run's answers, so it implies ``answers``. Operational, in no ID: ``judge_budget_micros``
    (the most one step — ``evaluation_run``, or ``gate_decision`` re-evaluating the incumbent —
    may spend on judge calls; None: no bound) and ``judge_concurrency`` (judge calls in flight).
    """

    suite: Path
    split: str = Field("test", pattern=r"^[A-Za-z0-9_.-]{1,64}$")  # BEIR folder only
    mode: Literal["hybrid", "lexical", "vector"] = "hybrid"
    scopes: tuple[str, ...] = ("public",)
    k: int = Field(1000, ge=1, le=10_000)
    cutoffs: dict[str, int] | None = None
    repeats: int = Field(1, ge=1, le=100)
    answers: bool = False
    query_plan: Path | None = None  # None: the checked-in ragpipe/specs/query_plan.yaml
    gate_policy: Path | None = None  # None: the checked-in ragpipe/specs/gate_policy.yaml
    judge: Path | None = None  # None: answers are not judged
    judge_budget_micros: int | None = Field(None, ge=0)
    judge_concurrency: int = Field(4, ge=1, le=64)

    def __hash__(self) -> int:  # cutoffs is a dict
        return hash(
            (
                self.suite,
                self.split,
                self.mode,
                self.scopes,
                self.k,
                tuple(sorted((self.cutoffs or {}).items())),
                self.repeats,
                self.answers,
                self.query_plan,
                self.gate_policy,
                self.judge,
                self.judge_budget_micros,
                self.judge_concurrency,
            )
        )

    def resolved(self, base: Path) -> EvaluationSection:
        """This section with relative paths made absolute against ``base`` (the spec's folder)."""
        fix = {
            name: (base / p).resolve()
            for name in ("suite", "query_plan", "gate_policy", "judge")
            if (p := getattr(self, name)) is not None
        }
        return self.model_copy(update=fix)


class PipelineSpec(_Spec):
    spec_schema: Literal["ragpipe.pipeline/v1"] = Field("ragpipe.pipeline/v1", alias="schema")
    snapshot: SnapshotSpec = SnapshotSpec()
    chunker: ChunkerSpec = ChunkerSpec()
    representations: RepresentationSpec = RepresentationSpec()
    embedder: EmbedderSpec
    lexical_index: LexicalIndexSpec = LexicalIndexSpec()
    vector_index: VectorIndexSpec = VectorIndexSpec()
    execution: ExecutionSettings = ExecutionSettings()
    # Which scopes' chunk text may be sent to which endpoint while building (ragpipe.work.disclosure).
    disclosure: DisclosurePolicy = DisclosurePolicy()
    dagster: DagsterSettings = DagsterSettings()
    # None: the build_revision job stops at index_bundle. Enters no build-stage spec ID.
    evaluation: EvaluationSection | None = None

    @model_validator(mode="before")
    @classmethod
    def _generation_identity(cls, data: object) -> object:
        return _with_generation_identity(data)

    @model_validator(mode="after")
    def _ann_fits_the_embedder(self) -> PipelineSpec:
        """A product-quantised index needs sub-vectors that divide the embedder's dimensions
        (refused naming ``vector_index.ann.num_sub_vectors``)."""
        problem = ann_dimension_problem(self.vector_index.ann, self.embedder.dimensions)
        if problem is not None:
            detail = InitErrorDetails(
                type=PydanticCustomError("ann_dimensions", problem),
                loc=("vector_index", "ann", "num_sub_vectors"),
                input=self.vector_index.ann.num_sub_vectors,  # type: ignore[union-attr]
            )
            raise ValidationError.from_exception_data(type(self).__name__, [detail])
        return self

    def stage_spec(self, stage: str) -> _Spec | None:
        """The semantic spec owned by ``stage`` (``None`` for stages with no parameters)."""
        return {
            "source_snapshot": self.snapshot,
            "chunks": self.chunker,
            "representations": self.representations,
            "embeddings": self.embedder,
            "lexical_index": self.lexical_index,
            "vector_index": self.vector_index,
            "index_bundle": None,
        }[stage]

    @cached_property
    def own_spec_ids(self) -> dict[str, SpecId]:
        """Spec ID of each stage's own computation (stage, implementation version, own spec).

        Recorded on artifacts (``chunker_spec_id`` on chunks, the embedder spec ID keying the
        embedding cache): it does not depend on upstream stages, so the embedding cache survives a
        chunker change.
        """
        return {stage: own_spec_id(stage, self.stage_spec(stage)) for stage in STAGE_INPUTS}

    @cached_property
    def spec_ids(self) -> dict[str, SpecId]:
        """Cumulative spec ID per stage: its own spec ID plus its inputs' cumulative IDs.

        This is the asset ``code_version``: a change anywhere upstream changes it.
        """
        ids: dict[str, SpecId] = {}
        for stage, inputs in STAGE_INPUTS.items():
            ids[stage] = SpecId(
                content_id(
                    "stage-plan",
                    1,
                    {"own": self.own_spec_ids[stage], "inputs": {name: ids[name] for name in inputs}},
                )
            )
        return ids


def own_spec_id(stage: str, spec: _Spec | None) -> SpecId:
    """Spec ID of one stage's own computation: stage name, implementation version, own spec."""
    return SpecId(
        content_id(
            "stage-spec",
            1,
            {
                "stage": stage,
                "implementation": IMPLEMENTATION_VERSIONS[stage],
                "spec": spec.model_dump(mode="json", context=SEMANTIC) if spec is not None else None,
            },
        )
    )


class PipelineSpecError(ValueError):
    """A pipeline spec is refused; ``str(e)`` is one line naming the file, the field and the rule."""


# One-line renderings of the errors a YAML configuration file can raise, shared by every loader of
# one (pipeline spec, query plan, targets), so a configuration error is always one line.


def read_error_text(exc: OSError | UnicodeDecodeError) -> str:
    """Why a file could not be read: the OS reason (``No such file or directory``), or where the
    bytes stop being UTF-8."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not valid UTF-8 (byte {exc.start + 1})"
    return exc.strerror or str(exc)


def yaml_error_text(exc: yaml.YAMLError) -> str:
    """``invalid YAML at line L, column C: <problem>`` (one line; PyYAML's own text spans several)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "malformed"
        context = f" ({exc.context})" if exc.problem and exc.context else ""
        return f"invalid YAML{where}: {problem}{context}"
    return "invalid YAML: " + " ".join(str(exc).split())


def field_path(loc: tuple) -> str:
    """A pydantic error location as a dotted path: ``chunker.max_bytes``, ``kinds.0`` (an item),
    ``assets.chunk.[key]`` (a refused mapping key), ``(top)`` for the document itself."""
    return ".".join(map(str, loc)) or "(top)"


def validation_error_text(exc: ValidationError, path_of: Callable[[tuple], tuple] | None = None) -> str:
    """Every problem of ``exc`` as ``<field path>: <rule>``, in pydantic's order, joined with ``; ``
    (``path_of`` maps a location first, e.g. to drop a discriminated union's tag)."""
    problems = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        rule = " ".join(str(error["msg"]).split()).removeprefix("Value error, ")
        problems.append(f"{field_path(path_of(loc) if path_of else loc)}: {rule}")
    return "; ".join(problems)


def strict_yaml_error_text(exc: StrictLoadError, what: str) -> str:
    """The one line for a refused configuration file: a syntax error keeps its established
    wording, ``<file>: cannot read <what>: invalid YAML at line L, column C: <problem>``; what the
    strict reading adds (a duplicate key, nesting beyond the bound, an alias) is
    ``<file>:<line>: <rule>`` (``kernel/strict_load.py``)."""
    if isinstance(exc.original, yaml.YAMLError):
        return f"{exc.source}: cannot read {what}: {yaml_error_text(exc.original)}"
    return str(exc)


def read_yaml_file(path: Path, what: str, error: type[Exception]) -> object:
    """The YAML document in ``path``, read strictly (``kernel/strict_load.py``); ``error``, one
    line, when it cannot be read: ``<file>: cannot read <what>: <OS reason, where the bytes stop
    being UTF-8, or the YAML problem with its line>``, or ``<file>:<line>: <rule>`` for a key given
    twice, nesting deeper than the bound or an alias."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read {what}: {read_error_text(exc)}") from None
    try:
        return load_yaml(text, str(path))
    except StrictLoadError as exc:
        raise error(strict_yaml_error_text(exc, what)) from None


def _spec_path(loc: tuple) -> tuple:
    """The error location as the spec file spells it: pydantic puts the selected ANN kind into the
    path of the discriminated union (``vector_index.ann.ivf_pq.num_bits``); the file says
    ``vector_index.ann.num_bits``."""
    if loc[:2] == ("vector_index", "ann") and len(loc) > 2 and loc[2] in ANN_KINDS:
        return (*loc[:2], *loc[3:])
    return loc


def pipeline_spec_path(path: Path | None = None) -> Path:
    """The spec a build uses: ``path``, else ``$RAGPIPE_PIPELINE_SPEC``, else the checked-in one."""
    return Path(path or current_settings().pipeline_spec or DEFAULT_SPEC_PATH)


def load_pipeline_spec(path: Path | None = None) -> PipelineSpec:
    """Load the spec from ``path``, ``$RAGPIPE_PIPELINE_SPEC`` or the checked-in default.

    The paths of the ``evaluation:`` section are made absolute against the spec file's folder.
    Refused with ``PipelineSpecError``, one line: ``<file>: cannot read pipeline spec: <OS reason
    or YAML problem with its line>`` or ``<file>: invalid pipeline spec: <field path>: <rule>``
    (several problems joined with ``; ``, the first first)."""
    path = pipeline_spec_path(path)
    raw = read_yaml_file(path, "pipeline spec", PipelineSpecError)
    try:
        spec = PipelineSpec.model_validate(raw, context={"base": path.resolve().parent})
    except ValidationError as exc:
        raise PipelineSpecError(f"{path}: invalid pipeline spec: {validation_error_text(exc, _spec_path)}") from None
    for kind in spec.representations.generated_kinds:
        if spec.representations.generated[kind].prompt_text is None:  # type: ignore[index]
            raise PipelineSpecError(
                f"{path}: invalid pipeline spec: representations.generated.{kind}.prompt: a spec file names its "
                "prompt file (or neither prompt nor prompt_digest, for the default prompt)"
            )
    if spec.evaluation is not None:
        spec = spec.model_copy(update={"evaluation": spec.evaluation.resolved(path.resolve().parent)})
    return spec


def load_model_embedder(path: Path | None = None) -> EmbedderSpec:
    """The local model the pipeline spec file's embedder names, as the spec of its fused fp32
    onnxruntime graph (the file's ``runtime``, ``quantization`` and ``graph_sha256`` left out):
    what ``ragpipe embedder pin-graph`` quantises. Only the ``embedder`` section is read, so a file
    whose int8 embedder is not pinned yet — which ``load_pipeline_spec`` refuses — is read too.
    ``PipelineSpecError`` in one line, as ``load_pipeline_spec``'s."""
    path = pipeline_spec_path(path)
    raw = read_yaml_file(path, "pipeline spec", PipelineSpecError)
    embedder = raw.get("embedder") if isinstance(raw, Mapping) else None
    if not isinstance(embedder, Mapping):
        raise PipelineSpecError(f"{path}: invalid pipeline spec: embedder: a mapping is required")
    if embedder.get("provider") == "litellm":
        raise PipelineSpecError(f"{path}: embedder: a litellm embedder has no local model to quantise")
    fields = {k: v for k, v in embedder.items() if k not in ("runtime", "quantization", "graph_sha256")}
    try:
        return EmbedderSpec.model_validate(
            {**fields, "runtime": "onnxruntime"}, context={"base": path.resolve().parent}
        )
    except ValidationError as exc:
        raise PipelineSpecError(
            f"{path}: invalid pipeline spec: {validation_error_text(exc, lambda loc: ('embedder', *loc))}"
        ) from None
