"""The static side of the evaluation → gate → release chain: what the spec's ``evaluation:`` section
names, loaded once, and the code versions of the three chain assets.

Code versions (Dagster ``code_version``; docs/architecture.md):

- ``evaluation_run``: the *static* evaluation spec ID: the evaluation spec body
  (``ragpipe.evaluation.eval_spec.SpecBody``: suite digest, query plan ID, mode, scopes, depth,
  metric specs and cutoffs, repeats, answers, the judge spec ID when answers are judged,
  evaluator version) without the bundle ID, which is only known when the bundle is built. The
  run's full spec ID (with the bundle) is its data version. A section without ``judge`` makes the
  body it made before judges existed (the body leaves an unset judge out), so its code versions
  stay; the judge's budget and concurrency are operational and enter nothing.
- ``gate_decision``: the static evaluation spec ID, the gate policy ID and the comparison spec.
- ``release_manifest``: the gate plan plus what a manifest binds besides the run: query plan,
  answer plan and authorization policy IDs.

Paths never enter an ID; the content they name does (suite digest, plan ID, policy ID).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from ragpipe.answer.identity import answer_plan_id
from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.judge_spec import JudgeSpec, load_judge_spec
from ragpipe.evaluation.judging import Judging, judging_for
from ragpipe.evaluation.suite import Suite
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.experiment.gate_policy import GatePolicy, load_policy
from ragpipe.experiment.statistics import ComparisonSpec
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.strict_load import load_yaml
from ragpipe.retrieval.authz import ScopePolicy
from ragpipe.retrieval.plan import QueryPlan, load_plan
from ragpipe.spec import EvaluationSection, PipelineSpec
from ragpipe.work.disclosure import DisclosurePolicy

# A stand-in for the bundle ID in the static spec: removed again before hashing.
_NO_BUNDLE = ""


@dataclass(frozen=True)
class ChainPlan:
    """The loaded inputs of the chain and the IDs derived from them."""

    section: EvaluationSection
    suite: Suite
    plan: QueryPlan
    policy: GatePolicy
    judge: JudgeSpec | None = None  # the section's judge, loaded (None: answers are not judged)
    comparison: ComparisonSpec = ComparisonSpec()

    def judging(self, home: Path) -> Judging | None:
        """How one chain step reaches the judge (None without one): the judge cache of the
        workspace at ``home``, the section's budget (for this step alone) and concurrency."""
        if self.judge is None:
            return None
        s = self.section
        return judging_for(
            self.judge,
            home,
            s.judge_budget_micros,
            s.judge_concurrency,
            budget_setting="evaluation.judge_budget_micros",
            concurrency_setting="evaluation.judge_concurrency",
        )

    def evaluation_spec(self, bundle_path: Path, bundle_id: str, plan: QueryPlan | None = None) -> EvaluationSpec:
        """The evaluation spec of one bundle (``plan``: another query plan, e.g. an incumbent's)."""
        s = self.section
        return EvaluationSpec.build(
            self.suite,
            plan or self.plan,
            bundle_path,
            bundle_id,
            mode=s.mode,
            scopes=s.scopes,
            k=s.k,
            cutoffs=s.cutoffs,
            repeats=s.repeats,
            answers=s.answers or self.judge is not None,  # a judge implies answers
            judge=self.judge,
        )

    @cached_property
    def evaluation_code_version(self) -> str:
        body = self.evaluation_spec(Path("."), _NO_BUNDLE).body.as_json()
        del body["bundle_id"]
        return content_id("evaluation-static-spec", 1, body)

    @cached_property
    def gate_code_version(self) -> str:
        return content_id(
            "gate-plan",
            1,
            {
                "evaluation": self.evaluation_code_version,
                "gate_policy": self.policy.policy_id,
                "comparison": self.comparison.as_json(),
            },
        )

    @property
    def query_plan_id(self) -> str:
        return self.plan.plan_id

    @property
    def answer_plan_id(self) -> str:
        return answer_plan_id(self.plan)

    @property
    def authorization_policy_id(self) -> str:
        return ScopePolicy().policy_id

    @cached_property
    def release_code_version(self) -> str:
        return content_id(
            "release-plan",
            1,
            {
                "gate": self.gate_code_version,
                "query_plan_id": self.query_plan_id,
                "answer_plan_id": self.answer_plan_id,
                "authorization_policy_id": self.authorization_policy_id,
            },
        )

    def code_versions(self) -> dict[str, str]:
        return {
            "evaluation_run": self.evaluation_code_version,
            "gate_decision": self.gate_code_version,
            "release_manifest": self.release_code_version,
        }


def _stamp(path: Path | None) -> tuple[int, int] | None:
    """What tells an edited file from the one read before: modification time and size."""
    try:
        info = path.stat() if path is not None else None
    except OSError:
        return None
    return None if info is None else (info.st_mtime_ns, info.st_size)


def _judge_files(path: Path | None) -> tuple[Path, ...]:
    """The judge spec file and the prompt file it names (relative to it): an edit of either is a
    new judge. Only the ``prompt`` key is read here; a file that does not parse is refused by
    ``load_judge_spec``, in its own words."""
    if path is None:
        return ()
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, ValueError):  # StrictLoadError is a ValueError
        return (path,)
    prompt = raw.get("prompt") if isinstance(raw, dict) else None
    return (path, path.parent / prompt) if isinstance(prompt, str) else (path,)


@lru_cache(maxsize=4)
def _load(section: EvaluationSection, stamps: tuple, disclosure: str) -> ChainPlan:
    """The chain's inputs, read once per version of their files (``stamps``): a suite that grows
    with the corpus is read again in a process that outlives one edit of it. ``disclosure``: the
    pipeline spec's disclosure policy (JSON, hashable), which decides the scopes the judge's
    endpoint may receive — as it does for the build's generated representations."""
    policy = DisclosurePolicy.model_validate_json(disclosure)
    return ChainPlan(
        section,
        load_suite(section.suite, split=section.split),
        load_plan(section.query_plan),
        load_policy(section.gate_policy),
        None if section.judge is None else load_judge_spec(section.judge, policy),
    )


def chain_plan(spec: PipelineSpec) -> ChainPlan:
    """The chain of ``spec``; ``ValueError`` when the spec has no ``evaluation:`` section. A bad
    suite, plan, policy or judge spec raises its own error naming the file and line."""
    if spec.evaluation is None:
        raise ValueError(
            "the pipeline spec has no evaluation: section, so there is no evaluation → gate → release chain"
        )
    section = spec.evaluation
    files = (section.suite, section.query_plan, section.gate_policy, *_judge_files(section.judge))
    return _load(section, tuple(_stamp(p) for p in files), spec.disclosure.model_dump_json())
