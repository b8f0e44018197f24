"""Snapshots: every asset that can change a result, each named by its content ID.

A snapshot maps asset names to content IDs:

* ``corpus_revision``: ``content_id("corpus-revision", 1, {source_digest, format, default_scope})``
  of the registry record (its path and key are operational: the same bytes under another key are
  the same corpus);
* one entry per pipeline stage (``source_snapshot``, ``chunks``, ``representations``,
  ``embeddings``, ``lexical_index``, ``vector_index``, ``index_bundle``): the stage's *own* spec ID
  (``PipelineSpec.own_spec_ids``), so a chunker change is one changed asset, not seven;
* ``query_plan``: the query plan without its ``answer`` section; ``answer_plan``: that section;
* ``suite``: the suite digest; ``gate_policy``: the policy ID; ``evaluator``: the content ID of
  the evaluator version plus the evaluation and comparison settings (``EvaluatorSettings``).

``suite``, ``gate_policy``, ``evaluator`` and ``corpus_revision`` are *locked*: a candidate never
changes them (a new corpus is a new revision, built and gated as such, not a candidate). The
snapshot ID is ``content_id("snapshot", 1, {schema, assets})``; the revision key a snapshot was
taken from travels with it (to find the bundle) but is not part of its ID.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_serializer

from ragpipe.answer.identity import answer_plan_id
from ragpipe.corpus.registry import RevisionRecord
from ragpipe.evaluation.eval_spec import EVALUATOR, MODES
from ragpipe.experiment.statistics import ComparisonSpec
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.models import FrozenModel
from ragpipe.retrieval.plan import QueryPlan, query_plan_id
from ragpipe.spec import STAGE_INPUTS, PipelineSpec

SNAPSHOT_SCHEMA = "ragpipe.snapshot/v1"
# Pipeline stage assets and the pipeline.yaml section each one's spec lives in (None: no section).
STAGE_SECTIONS: dict[str, str | None] = {
    "source_snapshot": "snapshot",
    "chunks": "chunker",
    "representations": "representations",
    "embeddings": "embedder",
    "lexical_index": "lexical_index",
    "vector_index": "vector_index",
    "index_bundle": None,
}
assert tuple(STAGE_SECTIONS) == tuple(STAGE_INPUTS)  # one asset per stage, in graph order
BUILD_ASSETS = tuple(STAGE_SECTIONS)
PLAN_ASSETS = ("query_plan", "answer_plan")
LOCKED = ("corpus_revision", "suite", "gate_policy", "evaluator")
ASSETS = ("corpus_revision", *BUILD_ASSETS, *PLAN_ASSETS, "suite", "gate_policy", "evaluator")


class SnapshotError(ValueError):
    """A snapshot cannot be taken or read; the message names the file, revision or asset."""


class EvaluatorSettings(FrozenModel):
    """How incumbent and challenger are measured and compared: locked for a candidate."""

    evaluator: str = EVALUATOR
    mode: Literal["hybrid", "lexical", "vector"] = "hybrid"
    scopes: tuple[str, ...] = ("public",)
    k: int = Field(1000, ge=1, le=10_000)
    repeats: int = Field(1, ge=1, le=100)
    comparison: ComparisonSpec = ComparisonSpec()
    # Set only by --allow-test-split: the candidate was made on a suite with test-split cases.
    test_split_allowed: bool = False

    @model_serializer(mode="wrap")
    def _without_default_test_split(self, handler):
        """``test_split_allowed`` is in the dump (hence the evaluator ID) only when set: settings
        that never allowed it keep the ID they had before the flag existed."""
        data = handler(self)
        if isinstance(data, dict) and data.get("test_split_allowed") is False:
            del data["test_split_allowed"]
        return data

    @property
    def evaluator_id(self) -> str:
        return content_id("evaluator", 1, self.model_dump(mode="json", by_alias=True))


assert EvaluatorSettings.model_fields["mode"].annotation.__args__ == MODES  # type: ignore[union-attr]


class Snapshot(FrozenModel):
    """``assets``: asset name -> content ID (every name of ``ASSETS``, nothing else)."""

    snapshot_schema: Literal["ragpipe.snapshot/v1"] = Field(SNAPSHOT_SCHEMA, alias="schema")
    revision: str
    assets: dict[str, str]

    @property
    def snapshot_id(self) -> str:
        return snapshot_id(self.assets)

    def as_json(self) -> dict[str, object]:
        return {"snapshot_id": self.snapshot_id, **self.model_dump(mode="json", by_alias=True)}


def snapshot_id(assets: dict[str, str]) -> str:
    return content_id("snapshot", 1, {"schema": SNAPSHOT_SCHEMA, "assets": assets})


def check_assets(assets: dict[str, str], where: str) -> None:
    """Refuse an asset map naming an unknown asset or lacking one."""
    unknown = sorted(set(assets) - set(ASSETS))
    if unknown:
        raise SnapshotError(f"{where}: unknown asset {unknown[0]!r} (assets: {', '.join(ASSETS)})")
    missing = [a for a in ASSETS if a not in assets]
    if missing:
        raise SnapshotError(f"{where}: asset {missing[0]!r} is missing")


def corpus_revision_id(record: RevisionRecord) -> str:
    return content_id(
        "corpus-revision",
        1,
        {"source_digest": record.source_digest, "format": record.format, "default_scope": record.default_scope},
    )


def asset_ids(
    corpus_id: str,
    pipeline: PipelineSpec,
    plan: QueryPlan,
    suite_digest: str,
    policy_id: str,
    settings: EvaluatorSettings,
) -> dict[str, str]:
    """Every asset's content ID, in ``ASSETS`` order."""
    ids = {"corpus_revision": corpus_id}
    ids.update({stage: str(pipeline.own_spec_ids[stage]) for stage in BUILD_ASSETS})
    ids.update({"query_plan": query_plan_id(plan), "answer_plan": answer_plan_id(plan)})
    ids.update({"suite": suite_digest, "gate_policy": policy_id, "evaluator": settings.evaluator_id})
    return ids


def changed_assets(parent: dict[str, str], child: dict[str, str]) -> list[str]:
    """Assets whose ID differs, in ``ASSETS`` order."""
    return [a for a in ASSETS if parent.get(a) != child.get(a)]
