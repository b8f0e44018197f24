"""The query plan: a checked-in, versioned file; its ID is the canonical hash of all of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    model_serializer,
)

from ragpipe.kernel.ids import content_id
from ragpipe.spec import read_yaml_file, validation_error_text

DEFAULT_PLAN_PATH = Path(__file__).resolve().parent.parent / "specs" / "query_plan.yaml"
ChannelName = Literal["lexical", "vector"]


class _Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ChannelPlan(_Plan):
    # The fewest distinct units (chunks or documents, per ``collapse``) the channel ranks for a
    # query; a query with a larger ``k`` asks for ``k`` (see DepthPolicy). Under score fusion it is
    # also the window whose scores normalise the channel, so normalisation does not vary with k.
    depth: int = Field(100, ge=1, le=10_000)
    weight: float = Field(1.0, gt=0)


class DepthPolicy(_Plan):
    """How a channel turns "``u`` distinct units" into backend requests of representation hits.

    ``u = max(channels.<c>.depth, k)``. The first request asks for ``request_multiple × u`` hits
    (representations per unit: two representation kinds per chunk by default). A request that comes
    back full is only trusted for the units whose best hit scores *strictly above* the lowest
    score returned (every such hit is certainly in the answer); while fewer than ``u`` units are
    settled so, the channel asks again, ``growth`` times deeper — or, at document level on a
    backend that can exclude documents, for the missing units only with the settled documents
    excluded, so a large document is never read in full. The channel stops when ``u`` units are
    settled or the backend has returned every hit it has. The top ``u`` units are then exactly
    those of the full collapsed ranking under the total order: request sizes and backend tie
    order never change a result."""

    kind: Literal["settled_units/v1"] = "settled_units/v1"
    request_multiple: int = Field(2, ge=1, le=64)
    growth: int = Field(2, ge=2, le=16)


class RrfFusionPlan(_Plan):
    """Weighted reciprocal-rank fusion: ``F(c) = Σ_a w_a / (k + rank_a(c))`` (``fusion/rrf.py``)."""

    kind: Literal["weighted_rrf"] = "weighted_rrf"
    k: float = Field(60.0, gt=0)


class ScoreFusionPlan(_Plan):
    """Convex combination of per-channel normalised scores, coefficients ``w_a / Σ w``; each
    channel's scores normalised per query over its first ``depth`` units (``fusion/convex.py``)."""

    kind: Literal["normalized_convex"]
    normalization: Literal["min_max", "z_score"]


class BoundedScoreFusionPlan(_Plan):
    """``normalized_convex`` where each channel has a say over its first ``depth`` units only: its
    window is ``depth`` scores (a channel with fewer hits fills it with its floor: 0 for the
    lexical channel, whose unreturned documents match no term), and an item below the window, or
    not returned, gets the floor (``fusion/convex.py``, "bounded").

    ``window``: ``eligible`` (the checked-in fusion) fills a window only up to the units the query
    could rank at all, when a channel shows how many there are (``fusion/convex.py``,
    ``population``): a corpus of 40 documents has 40 BM25 scores, not ``depth``. ``depth`` always
    fills it to ``depth`` — the first rule, which on a small living corpus made an add-only refresh
    fail non-inferiority (docs/retrieval.md); a plan without the field keeps it, and its ID."""

    kind: Literal["bounded_convex"]
    normalization: Literal["min_max", "z_score"]
    window: Literal["depth", "eligible"] = "depth"

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # the first rule's plans dump, hence hash, as they did before the field existed
        out = handler(self)
        if self.window == "depth":
            out.pop("window", None)
        return out


FUSION_KINDS = ("weighted_rrf", "normalized_convex", "bounded_convex")


def _kind(default: str) -> Callable[[object], object]:
    """The discriminator of a union selected by ``kind``; omitted, ``kind`` is ``default`` (the
    model the section had before the union existed)."""

    def kind(value: object) -> object:
        if isinstance(value, dict):
            return value.get("kind", default)
        return getattr(value, "kind", None)

    return kind


# An RRF plan's dump, hence the default plan's ID, is what it was before score fusion existed.
FusionPlan = Annotated[
    Annotated[RrfFusionPlan, Tag("weighted_rrf")]
    | Annotated[ScoreFusionPlan, Tag("normalized_convex")]
    | Annotated[BoundedScoreFusionPlan, Tag("bounded_convex")],
    Discriminator(
        _kind("weighted_rrf"),
        custom_error_type="fusion_kind",
        custom_error_message=(
            "Input should be a mapping whose kind is 'weighted_rrf', 'normalized_convex' or 'bounded_convex'"
        ),
    ),
]


class RerankerPlan(_Plan):
    """A cross-encoder over the top ``depth`` fused items. ``model_digest`` binds the model by
    content (``rerank.model_digest`` of the folder: every file's path and bytes), checked before it
    loads, so the plan ID — not a path string — says which weights rank; ``passage`` is what the
    model reads beside the query (the chunk's bundle text)."""

    kind: Literal["cross_encoder"] = "cross_encoder"
    model_path: str
    model_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    passage: Literal["chunk_text"] = "chunk_text"
    depth: int = Field(20, ge=1, le=1000)
    on_failure: Literal["fail", "keep_fused"] = "keep_fused"


class ContextPlan(_Plan):
    max_bytes: int = Field(6000, ge=1)
    max_chunks: int = Field(8, ge=1)


class GeneratorPlan(_Plan):
    kind: Literal["extractive", "litellm"] = "extractive"
    model: str | None = None
    api_base: str | None = None
    temperature: float = Field(0.0, ge=0, le=2)
    seed: int = 7
    max_tokens: int = Field(512, ge=1)
    timeout_seconds: float = Field(30.0, gt=0)


class AnswerPlan(_Plan):
    contract_version: Literal[1] = 1
    generator: GeneratorPlan = GeneratorPlan()


class QueryEmbeddingPlan(_Plan):
    # Which runtime embeds the query with the bundle's embedder (same weights, prefix, pooling,
    # normalisation): sentence-transformers on torch, or an in-memory ONNX export of that model on
    # onnxruntime (~2x faster for one query; checked at load to match within 1e-5 per component).
    # An int8 embedder (``embedder.quantization: int8``) is another model: its queries run on its
    # own onnxruntime graph only; sentence_transformers is refused for it.
    runtime: Literal["onnxruntime", "sentence_transformers"] = "onnxruntime"


class VectorSearchPlan(_Plan):
    """How the vector channel scores rows: exactly, by the project's own definition of a score
    (``ragpipe.index.vector_memory.EXACT_SCORES``: float64 products added in dimension order, the
    same bits on every CPU). Named here because a change to it changes results."""

    kind: Literal["exact"] = "exact"
    scores: Literal["float64_sequential/v1"] = "float64_sequential/v1"


class ApproximateVectorSearchPlan(_Plan):
    """Approximate vector search (``ragpipe.index.vector_ann``) on a bundle whose vector index has
    an ANN index: ``refine_factor × k`` candidates from that index — ``nprobes`` IVF partitions
    probed, ``ef`` HNSW candidates (raised to the request's size) — ranked by the same exact
    ``scores`` as exact search. Only which rows are candidates is approximate; a bundle without
    an ANN index refuses every query of this plan that searches vectors (a lexical query is served)."""

    kind: Literal["approximate"]
    nprobes: int = Field(20, ge=1, le=65_536)
    ef: int = Field(100, ge=1, le=1_000_000)
    refine_factor: int = Field(4, ge=1, le=1000)
    scores: Literal["float64_sequential/v1"] = "float64_sequential/v1"


VECTOR_SEARCH_KINDS = ("exact", "approximate")


# An exact plan's dump, hence the default plan's ID, is what it was before approximate search existed.
VectorSearch = Annotated[
    Annotated[VectorSearchPlan, Tag("exact")] | Annotated[ApproximateVectorSearchPlan, Tag("approximate")],
    Discriminator(
        _kind("exact"),
        custom_error_type="vector_search_kind",
        custom_error_message="Input should be a mapping whose kind is 'exact' or 'approximate'",
    ),
]


class QueryPlan(_Plan):
    plan_schema: Literal["ragpipe.query_plan/v1"] = Field("ragpipe.query_plan/v1", alias="schema")
    channels: dict[ChannelName, ChannelPlan] = Field(min_length=1)
    depth_policy: DepthPolicy = DepthPolicy()
    fusion: FusionPlan = RrfFusionPlan()
    collapse: Literal["chunk", "document"] = "chunk"
    vector_search: VectorSearch = VectorSearchPlan()
    query_embedding: QueryEmbeddingPlan = QueryEmbeddingPlan()
    reranker: RerankerPlan | None = None
    context: ContextPlan = ContextPlan()
    answer: AnswerPlan = AnswerPlan()

    @property
    def plan_id(self) -> str:
        return content_id("query-plan", 1, self.model_dump(mode="json", by_alias=True))

    @property
    def approximate(self) -> bool:
        """Whether the vector channel (if the plan has one) searches approximately."""
        return self.vector_search.kind == "approximate" and "vector" in self.channels

    def with_channels(self, names: tuple[str, ...]) -> QueryPlan:
        """The same plan restricted to ``names`` (``--mode``); its ID changes accordingly."""
        missing = [n for n in names if n not in self.channels]
        if missing:
            raise PlanError(f"query plan has no channel {missing[0]!r} (channels: {', '.join(self.channels)})")
        return self.model_copy(update={"channels": {n: self.channels[n] for n in names}})


class PlanError(ValueError):
    """A query plan is refused; ``str(e)`` is one line naming the file, the field and the rule."""


def parse_plan(raw: object, where: str) -> QueryPlan:
    """The plan ``raw`` holds, or ``PlanError``: ``<where>: invalid query plan: <field>: <rule>``
    (several problems joined with ``; ``, the first first)."""
    try:
        return QueryPlan.model_validate(raw)
    except ValidationError as exc:
        raise PlanError(f"{where}: invalid query plan: {validation_error_text(exc, _field_path)}") from None


def _field_path(loc: tuple) -> tuple:
    """The error location as the plan file spells it: pydantic puts the selected fusion (or
    vector search) kind into the path of a discriminated union (``fusion.weighted_rrf.k``); the
    file says ``fusion.k``."""
    if len(loc) >= 2 and (
        (loc[0] == "fusion" and loc[1] in FUSION_KINDS) or (loc[0] == "vector_search" and loc[1] in VECTOR_SEARCH_KINDS)
    ):
        return (loc[0], *loc[2:])
    return loc


def load_plan(path: Path | None = None) -> QueryPlan:
    """Read and validate a plan file (default: ``ragpipe/specs/query_plan.yaml``); an unreadable
    file is ``<file>: cannot read query plan: <OS reason or YAML problem with its line>``, a key
    given twice, nesting past the bound or an alias ``<file>:<line>: <rule>`` (``spec.read_yaml_file``)."""
    path = Path(path or DEFAULT_PLAN_PATH)
    return parse_plan(read_yaml_file(path, "query plan", PlanError), str(path))


def query_plan_id(plan: QueryPlan) -> str:
    """The content ID of the plan's retrieval half (everything but ``answer``): what a snapshot
    names as its ``query_plan`` asset, so an answer-only change leaves retrieval unchanged."""
    body = plan.model_dump(mode="json", by_alias=True)
    body.pop("answer")
    return content_id("query-plan-retrieval", 1, body)
