"""Making a candidate: a parent (a built revision, or an earlier candidate) plus ``--set`` edits.

``--set ASSET.PATH=VALUE`` edits a copy of one spec file: the first segment picks the asset
(``chunks.max_bytes=800`` edits ``chunker.max_bytes`` of ``pipeline.yaml``; ``query_plan.fusion.k=20``
and ``answer_plan.generator.kind=litellm`` edit ``query_plan.yaml``, the latter its ``answer``
section); the value is parsed as YAML (``20``, ``[raw]``, ``{kind: normalized_convex, …}``).
Several ``--set`` may edit the same asset (chunk size and overlap together); edits of two assets
are refused. The edited file must still load and the asset's ID must change. The folder is
written to a temporary sibling, validated (``validate_candidate``) and only then published.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ragpipe.candidates.asset_ids import (
    ASSETS,
    LOCKED,
    PLAN_ASSETS,
    STAGE_SECTIONS,
    EvaluatorSettings,
    Snapshot,
    asset_ids,
    corpus_revision_id,
)
from ragpipe.candidates.folder import (
    FILES,
    PARENT_PIPELINE,
    PARENT_PLAN,
    PIPELINE,
    PLAN,
    POLICY,
    RECORD,
    SUITE,
    Candidate,
    CandidateError,
    CandidateRecord,
    Change,
    build_revision_for,
    candidate_id,
    check_change,
    validate_candidate,
)
from ragpipe.corpus.registry import load_revision
from ragpipe.evaluation.suite import Suite, suite_bytes
from ragpipe.experiment.gate_policy import load_policy
from ragpipe.kernel.ids import bytes_digest
from ragpipe.kernel.publish import PublishOutcome, publish_directory
from ragpipe.kernel.strict_load import StrictLoadError, load_yaml
from ragpipe.kernel.workspace import Workspace
from ragpipe.retrieval.plan import PlanError, load_plan, parse_plan
from ragpipe.spec import (
    DEFAULT_PROMPTS,
    GENERATION_CONTRACTS,
    PipelineSpec,
    PipelineSpecError,
    load_pipeline_spec,
    validation_error_text,
)
from ragpipe.stages.steps import StageError, read_stage_record

SET_HELP = "expected ASSET.PATH=VALUE, e.g. query_plan.channels.vector.weight=0.7"


@dataclass(frozen=True)
class Parent:
    """What a candidate is made from: the parent snapshot and the bytes of its spec files."""

    snapshot: Snapshot
    pipeline_bytes: bytes
    plan_bytes: bytes
    suite: Suite
    policy_bytes: bytes
    settings: EvaluatorSettings


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CandidateError(f"{path}: cannot read {what}: {exc.strerror}") from None


def parent_from_revision(
    ws: Workspace,
    revision: str,
    pipeline_path: Path,
    plan_path: Path,
    suite: Suite,
    policy_path: Path,
    settings: EvaluatorSettings,
) -> Parent:
    """The snapshot of ``revision`` built under ``pipeline_path``, served with ``plan_path``.
    A suite with cases judged on the ``test`` split is refused unless ``settings`` allow it."""
    refuse_test_split(suite, settings)
    try:
        pipeline, plan = load_pipeline_spec(pipeline_path), load_plan(plan_path)
        policy = load_policy(policy_path)
        record = load_revision(ws.registry, revision)
        read_stage_record(ws, revision, "index_bundle", pipeline)  # the bundle is this spec's
    except (PipelineSpecError, PlanError, StageError, ValueError) as exc:
        raise CandidateError(f"parent {revision!r}: {exc}") from None
    assets = asset_ids(corpus_revision_id(record), pipeline, plan, suite.digest, policy.policy_id, settings)
    return Parent(
        Snapshot(revision=revision, assets=assets),
        _build_only(pipeline_path),
        _read(plan_path, "the query plan"),
        suite,
        _read(policy_path, "the gate policy"),
        settings,
    )


def refuse_test_split(suite: Suite, settings: EvaluatorSettings) -> None:
    """Tuning on the test split spends the measure a project reports: refused, naming the suite,
    unless the settings record ``test_split_allowed`` (``--allow-test-split``)."""
    test = suite.cases_of_split("test")
    if test and not settings.test_split_allowed:
        raise CandidateError(
            f"suite {suite.source}: {len(test)} of its {len(suite.cases)} cases are judged on the test split "
            f"(first: {test[0].id!r}); tune on another split (--split train), or pass --allow-test-split, "
            "which the candidate records"
        )


_ABSENT = object()


def _yaml(data: bytes, where: object) -> Any:
    """A spec file's bytes read again to edit them, strictly (``kernel/strict_load.py``): a file
    changed since it was validated is refused in one line, never read loosely."""
    try:
        return load_yaml(data.decode("utf-8"), str(where))
    except UnicodeDecodeError as exc:
        raise CandidateError(f"{where}: not valid UTF-8 (byte {exc.start + 1})") from None
    except StrictLoadError as exc:
        raise CandidateError(str(exc)) from None


def _build_only(pipeline_path: Path) -> bytes:
    """The parent's pipeline spec as a candidate folder keeps it: without its ``evaluation``
    section — a candidate's build stops at the bundle (``candidate run`` evaluates and gates it;
    the chain would gate and release an experiment), and the section's paths are relative to the
    original file — and with its prompt files inlined (``_portable``). No stage ID
    depends on either, so the copy is the same snapshot; a spec needing neither keeps its bytes."""
    pipeline_bytes = _read(pipeline_path, "the pipeline spec")
    doc = _yaml(pipeline_bytes, pipeline_path) or {}
    if not isinstance(doc, dict):
        return pipeline_bytes
    dropped = doc.pop("evaluation", _ABSENT) is not _ABSENT
    changed = _portable(doc, Path(pipeline_path).resolve().parent) or dropped
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode("utf-8") if changed else pipeline_bytes


def _portable(doc: dict, base: Path) -> bool:
    """Inline each ``representations.generated.<kind>`` prompt as ``prompt_text`` (in place; True
    if any was): its ``prompt`` file read against ``base``, or the packaged default of its kind. A
    spec resolves its prompts against its own folder, and the candidate's copy lives in another
    one; inlined, the copy is self-contained and its file digest covers the prompt, so editing or
    moving the original (or upgrading the default) later cannot change what a candidate built. IDs
    take the prompt by its text's digest, so none changes. An entry that already holds its text, or
    whose file does not read, is left as it is: validating the spec reports the latter."""
    generated = (doc.get("representations") or {}).get("generated") if isinstance(doc, dict) else None
    changed = False
    for kind, entry in generated.items() if isinstance(generated, dict) else ():
        if not isinstance(entry, dict) or entry.get("prompt_text") is not None or kind not in GENERATION_CONTRACTS:
            continue
        prompt = entry.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            continue
        path = DEFAULT_PROMPTS / f"{kind}.txt" if prompt is None else base / prompt
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        entry.pop("prompt", None)
        entry["prompt_text"] = text
        changed = True
    return changed


def parent_from_candidate(candidate: Candidate) -> Parent:
    """A validated candidate as the parent of the next one in a chain."""
    folder = candidate.folder
    return Parent(
        candidate.snapshot,
        (folder / PIPELINE).read_bytes(),
        (folder / PLAN).read_bytes(),
        candidate.suite,
        (folder / POLICY).read_bytes(),
        candidate.record.evaluator,
    )


def parse_set(text: str) -> tuple[str, tuple[str, ...], Any]:
    """``ASSET.PATH=VALUE`` -> (asset, keys under the asset's section, YAML value)."""
    path, sep, raw = text.partition("=")
    keys = tuple(path.split("."))
    if not sep or len(keys) < 2 or not all(keys):
        raise CandidateError(f"--set {text!r}: {SET_HELP}")
    asset = keys[0]
    if asset in LOCKED:
        raise CandidateError(f"--set {text!r}: asset {asset!r} is locked ({', '.join(LOCKED)} are locked)")
    if asset not in ASSETS:
        raise CandidateError(
            f"--set {text!r}: unknown asset {asset!r} (settable: {', '.join(a for a in ASSETS if a not in LOCKED and a != 'index_bundle')})"
        )
    if asset == "index_bundle":
        raise CandidateError(f"--set {text!r}: asset 'index_bundle' has no settable spec")
    if asset == "query_plan" and keys[1] == "answer":
        raise CandidateError(
            f"--set {text!r}: the answer section is the asset answer_plan (use answer_plan.{'.'.join(keys[2:]) or 'KEY'})"
        )
    try:
        value = load_yaml(raw, "--set")
    except StrictLoadError as exc:
        if exc.original is not None:
            raise CandidateError(
                f"--set {text!r}: the value is not YAML: {str(exc.original).splitlines()[0]}"
            ) from None
        shown = text if len(text) <= 80 else text[:80] + "…"
        raise CandidateError(f"--set {shown!r}: the value is refused: {exc.rule}") from None
    return asset, keys[1:], value


def _section(asset: str) -> tuple[str, ...]:
    if asset in PLAN_ASSETS:
        return () if asset == "query_plan" else ("answer",)
    return (str(STAGE_SECTIONS[asset]),)


def apply_set(doc: dict, text: str, asset: str, keys: tuple[str, ...], value: Any) -> None:
    """Set ``value`` at the asset's section + ``keys`` in ``doc`` (missing mappings are created)."""
    node = doc
    path = (*_section(asset), *keys)
    for depth, key in enumerate(path[:-1]):
        child = node.setdefault(key, {})
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise CandidateError(f"--set {text!r}: {'.'.join(path[: depth + 1])} is not a mapping")
        node = child
    node[path[-1]] = value


def _edited(parent: Parent, sets: list[str]) -> tuple[str, bytes, bytes]:
    """(asset, pipeline bytes, plan bytes) after the edits; the unedited file keeps its bytes."""
    if not sets:
        raise CandidateError("give at least one --set ASSET.PATH=VALUE")
    parsed = [(text, *parse_set(text)) for text in sets]
    assets = list(dict.fromkeys(p[1] for p in parsed))
    if len(assets) > 1:
        raise CandidateError(
            f"--set edits {len(assets)} assets ({', '.join(assets)}): a candidate changes exactly one asset"
        )
    asset = assets[0]
    is_plan = asset in PLAN_ASSETS
    doc = (
        _yaml(parent.plan_bytes if is_plan else parent.pipeline_bytes, f"the parent's {PLAN if is_plan else PIPELINE}")
        or {}
    )
    for text, _, keys, value in parsed:
        apply_set(doc, text, asset, keys, value)
    if not is_plan:
        _portable(doc, Path.cwd())  # a prompt path given on the command line is the user's
    data = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode("utf-8")
    name = PLAN if is_plan else PIPELINE
    try:
        parse_plan(doc, f"--set: edited {name}") if is_plan else PipelineSpec.model_validate(doc)
    except PlanError as exc:
        raise CandidateError(str(exc)) from None
    except ValidationError as exc:
        raise CandidateError(f"--set: edited {name}: invalid pipeline spec: {validation_error_text(exc)}") from None
    return asset, (parent.pipeline_bytes if is_plan else data), (data if is_plan else parent.plan_bytes)


def new_candidate(parent: Parent, sets: list[str], out: Path) -> Candidate:
    """Create the candidate folder ``out`` (never replaced) and return it validated."""
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise CandidateError(f"{out}: already exists (a candidate folder is created once)")
    asset, pipeline_bytes, plan_bytes = _edited(parent, sets)
    contents = {
        PIPELINE: pipeline_bytes,
        PLAN: plan_bytes,
        PARENT_PIPELINE: parent.pipeline_bytes,
        PARENT_PLAN: parent.plan_bytes,
        SUITE: suite_bytes(parent.suite),
        POLICY: parent.policy_bytes,
    }
    pipeline = PipelineSpec.model_validate(yaml.safe_load(pipeline_bytes))
    plan = parse_plan(yaml.safe_load(plan_bytes), PLAN)
    parents = parent.snapshot.assets
    child = asset_ids(
        parents["corpus_revision"], pipeline, plan, parents["suite"], parents["gate_policy"], parent.settings
    )
    if child[asset] == parents[asset]:
        raise CandidateError(
            f"--set leaves asset {asset!r} unchanged ({parents[asset]}): a candidate must change its asset"
        )
    check_change("--set", parents, child)
    cand_id = candidate_id(parent.snapshot.snapshot_id, asset, child[asset])
    record = CandidateRecord(
        candidate_id=cand_id,
        parent=parent.snapshot,
        evaluator=parent.settings,
        change=Change(asset=asset, edits=tuple(sets), old_id=parents[asset], new_id=child[asset]),
        build_revision=build_revision_for(parent.snapshot.revision, asset, cand_id),
        files={name: bytes_digest(contents[name]) for name in FILES},
    )

    def write_data(tmp: Path) -> None:
        (tmp / "parent").mkdir()
        for name, data in contents.items():
            (tmp / name).write_bytes(data)

    def write_record(tmp: Path) -> None:
        (tmp / RECORD).write_text(json.dumps(record.as_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")

    if publish_directory(out, write_data, write_record, validate=validate_candidate) is PublishOutcome.existing:
        raise CandidateError(f"{out}: already exists (a candidate folder is created once)")
    return validate_candidate(out)
