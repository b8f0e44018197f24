"""The configuration a build uses, checked as a whole before anything is registered or launched.

``check_configuration()`` reads, in this order, and stops at the first problem:

0. the ``RAGPIPE_*`` variables (``ragpipe.kernel.settings``; given, or read from the environment),
   every problem of them joined into the one line;
1. the pipeline spec: ``$RAGPIPE_PIPELINE_SPEC``, else the checked-in ``ragpipe/specs/pipeline.yaml``;
2. when it has an ``evaluation:`` section, every file that section names: ``suite`` (a JSONL suite
   or a BEIR folder, with ``split``), ``query_plan`` and ``gate_policy`` (left out or ``null``: the
   checked-in ``ragpipe/specs/query_plan.yaml`` / ``gate_policy.yaml``) and ``judge`` (left out or
   ``null``: answers are not judged); a relative path is relative to the folder of the spec file,
   never to the working directory. Then the section's ``cutoffs``, a judge budget's price (a
   budget on a model the price table does not price cannot be kept) and the chain's code versions
   (``ragpipe.stages.chain_plan``);
3. the release targets: ``$RAGPIPE_TARGETS``, else ``ragpipe/specs/targets.yaml``, and the gate
   policies each target accepts (relative to the targets file);
4. the object store ``$RAGPIPE_STORE`` names, if set (``ragpipe.storage.location``): parsed, not
   contacted; then ``$RAGPIPE_EXECUTOR`` (``in_process``; ``celery``, which needs its broker,
   backend and a store; ``k8s``, which needs its image, namespace and a store); the embedding shard
   count.

Contract: a problem raises ``ConfigurationError`` whose ``str`` is exactly one line (no line break,
several problems of one file joined with ``; ``, the first first) naming the file, the field and
the rule; nothing is written anywhere. The lines::

    <spec>: cannot read pipeline spec: <OS reason> | invalid YAML at line L, column C: <problem>
    <spec>: invalid pipeline spec: <field.path>: <rule>
    <spec>: evaluation.<field>: '<path as written>' (resolved to <absolute path>): <problem>
    <spec>: evaluation.cutoffs: <rule>
    <spec>: evaluation.judge_budget_micros: the judge's model '<model>' has no price in the price table …
    <targets>: cannot read targets config: <OS error> | invalid YAML at line L, column C: <problem>
    <targets>: invalid targets config: <field.path>: <rule>
    <targets>: target '<name>': gate policy '<entry>': <the policy's own line>
    RAGPIPE_STORE: '<location>': <rule>
    RAGPIPE_EXECUTOR: <rule>

``<problem>`` is the named file's own one-line error without its path (given just before):
``cannot read suite: No such file or directory``, ``line 3: not valid JSON: …`` (suite line),
``invalid query plan: fusion.k: …``, ``line 12: target.metric: …`` (gate policy line),
``invalid judge spec: rubric_version: …``. A field
left out shows ``default`` for the path as written; ``(resolved to …)`` is left out when the
path as written is already that absolute path.

``ragpipe build`` runs this before it registers the revision, and ``ragpipe.defs.build_definitions``
(what the code location ``definitions.py`` loads) before it defines anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ragpipe.evaluation.eval_spec import metric_specs
from ragpipe.evaluation.judge_spec import JudgeSpecError
from ragpipe.evaluation.judging import require_priced
from ragpipe.evaluation.suite_rules import SuiteError
from ragpipe.experiment.gate_policy import DEFAULT_POLICY_PATH, PolicyError
from ragpipe.kernel.settings import BY_NAME, Settings, SettingsError
from ragpipe.kernel.strict_load import load_yaml
from ragpipe.release.store import ReleaseError
from ragpipe.release.targets import TargetsConfig, load_targets, targets_path
from ragpipe.retrieval.plan import DEFAULT_PLAN_PATH, PlanError
from ragpipe.spec import (
    EvaluationSection,
    PipelineSpec,
    PipelineSpecError,
    load_pipeline_spec,
    pipeline_spec_path,
    validation_error_text,
)
from ragpipe.stages.chain_plan import ChainPlan, chain_plan
from ragpipe.storage.location import LocationError, store_from
from ragpipe.work.usage import load_prices

# The files of an evaluation: section, in the order chain_plan loads them, with the error type
# each loader raises (so the field of a failure is known) and the file an unset field means.
_CHAIN_FILES: tuple[tuple[str, type[ValueError], Path | None], ...] = (
    ("suite", SuiteError, None),
    ("query_plan", PlanError, DEFAULT_PLAN_PATH),
    ("gate_policy", PolicyError, DEFAULT_POLICY_PATH),
    ("judge", JudgeSpecError, None),
)


class ConfigurationError(ValueError):
    """The configuration is refused; ``str(e)`` is one line: ``<file>: <field>: <rule>``."""

    def __init__(self, message: str):
        # the contract is one line whatever a loader said: any line break becomes "; "
        super().__init__("; ".join(part.strip() for part in str(message).splitlines() if part.strip()))


@dataclass(frozen=True)
class Configuration:
    """What ``check_configuration`` read, all of it valid."""

    spec_path: Path
    spec: PipelineSpec
    chain: ChainPlan | None  # None: the spec has no evaluation: section
    targets_path: Path
    targets: TargetsConfig
    settings: Settings


def check_configuration(
    spec_path: Path | None = None, targets: Path | None = None, settings: Settings | None = None
) -> Configuration:
    """Read and check the whole configuration of a build (module docstring); ``spec_path`` and
    ``targets`` default to ``$RAGPIPE_PIPELINE_SPEC`` / ``$RAGPIPE_TARGETS`` / the checked-in files,
    ``settings`` to this process's environment. Raises ``ConfigurationError`` (one line) at the
    first problem."""
    if settings is None:
        try:
            settings = Settings.from_environ()
        except SettingsError as exc:
            raise ConfigurationError(exc.one_line()) from None
    path = pipeline_spec_path(spec_path or settings.pipeline_spec)
    try:
        spec = load_pipeline_spec(path)
    except PipelineSpecError as exc:
        raise ConfigurationError(str(exc)) from None
    chain = _check_chain(path, spec) if spec.evaluation is not None else None
    where = targets_path(targets or settings.targets)
    try:
        config = load_targets(where)
        for name in config.targets:
            config.accepted_policies(name)
    except ReleaseError as exc:
        raise ConfigurationError(str(exc)) from None
    try:
        store_from(settings)  # parsed only: reaching the store is the first step's business, not loading's
    except LocationError as exc:
        raise ConfigurationError(str(exc)) from None
    _check_executor(settings)
    return Configuration(path, spec, chain, where, config, settings)


EXECUTOR_ENV = "RAGPIPE_EXECUTOR"
NEEDS = {
    "celery": ("RAGPIPE_CELERY_BROKER", "RAGPIPE_CELERY_BACKEND", "RAGPIPE_STORE"),
    "k8s": ("RAGPIPE_K8S_IMAGE", "RAGPIPE_K8S_NAMESPACE", "RAGPIPE_STORE"),
}


def _check_executor(settings: Settings) -> None:
    """``RAGPIPE_EXECUTOR`` names a known executor; Celery needs its broker and backend, Kubernetes
    its image and namespace, and both a store (their steps share no disk: without a store a step
    could not find what the previous one wrote)."""
    name = settings.executor  # a known name: Settings checks it
    for needed in NEEDS.get(name, ()):
        if not getattr(settings, BY_NAME[needed].field):
            raise ConfigurationError(f'{EXECUTOR_ENV}: {name} needs {needed} (docs/operations.md, "Scaling out")')


def _check_chain(path: Path, spec: PipelineSpec) -> ChainPlan:
    section = spec.evaluation
    assert section is not None
    try:
        chain = chain_plan(spec)
    except (SuiteError, PlanError, PolicyError, JudgeSpecError) as exc:
        field, default = next((f, d) for f, kind, d in _CHAIN_FILES if isinstance(exc, kind))
        raise ConfigurationError(_named_file_problem(path, section, field, default, str(exc))) from None
    try:
        metric_specs(section.cutoffs, section.answers or chain.judge is not None)
    except ValueError as exc:
        raise ConfigurationError(f"{path}: evaluation.cutoffs: {exc}") from None
    if chain.judge is not None:
        try:  # the CLI's rule for --judge-budget-micros, before any step could spend
            require_priced(chain.judge, load_prices(), section.judge_budget_micros, "evaluation.judge_budget_micros")
        except ValueError as exc:
            raise ConfigurationError(f"{path}: {exc}") from None
    if (
        chain.plan.approximate
        and section.mode in ("hybrid", "vector")
        and spec.vector_index.enabled
        and spec.vector_index.ann is None
    ):  # every bundle this spec builds would refuse the plan at the evaluation step
        raise ConfigurationError(
            _named_file_problem(
                path,
                section,
                "query_plan",
                DEFAULT_PLAN_PATH,
                "asks for approximate vector search (vector_search.kind: approximate), but vector_index "
                "declares no ann index",
            )
        )
    try:
        chain.code_versions()
    except ValidationError as exc:  # the evaluation spec body the section makes (e.g. a bad scope name)
        raise ConfigurationError(f"{path}: evaluation.{validation_error_text(exc)}") from None
    except ValueError as exc:
        raise ConfigurationError(f"{path}: evaluation: {exc}") from None
    return chain


def _named_file_problem(path: Path, section: EvaluationSection, field: str, default: Path | None, problem: str) -> str:
    """``<spec>: evaluation.<field>: '<as written>' (resolved to <path>): <problem without the path>``."""
    resolved = getattr(section, field) or default
    written = _as_written(path, field)
    shown = "default" if written is None else repr(written)
    if written is None or written != str(resolved):
        shown += f" (resolved to {resolved})"
    return f"{path}: evaluation.{field}: {shown}: {_without_path(problem, str(resolved))}"


def _as_written(path: Path, field: str) -> str | None:
    """The value of ``evaluation.<field>`` as the spec file writes it (None: not set). Read again
    only to word an error: the loaded spec holds the resolved path."""
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"), str(path))
    except (OSError, ValueError):  # StrictLoadError is a ValueError
        return None
    section = raw.get("evaluation") if isinstance(raw, dict) else None
    value = section.get(field) if isinstance(section, dict) else None
    return None if value is None else str(value)


def _without_path(problem: str, path: str) -> str:
    """A loader's error without its leading ``<path>: ``; ``<path>:<n>: `` becomes ``line <n>: ``."""
    if problem.startswith(f"{path}: "):
        return problem[len(path) + 2 :]
    line = re.match(re.escape(path) + r":(\d+): ", problem)
    if line:
        return f"line {line.group(1)}: {problem[line.end() :]}"
    return problem
