"""A broken configuration file stops `ragpipe build` (and Dagster's loading of the code location)
before anything is registered or launched, with one line naming the file, the field and the rule.

Each case runs the real CLI on a fresh ``RAGPIPE_HOME`` / ``DAGSTER_HOME`` with
``RAGPIPE_PIPELINE_SPEC`` (or ``RAGPIPE_TARGETS``) pointing at a broken copy of a checked-in file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ragpipe.corpus.registry import list_revisions
from ragpipe.kernel.workspace import Workspace
from ragpipe_tests.cli.test_cli import ragpipe
from ragpipe_tests.support.paths import REPO, SAMPLE

SPECS = REPO / "ragpipe" / "specs"
CORPUS = SAMPLE / "rev-1.jsonl"


def line_of(text: str, needle: str) -> int:
    """The 1-based number of the first line of ``text`` that starts with ``needle``."""
    return next(i for i, line in enumerate(text.splitlines(), start=1) if line.startswith(needle))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    """A folder with a working configuration: the checked-in spec, its suite next to it (named by a
    relative path, so it resolves against the spec's folder), the checked-in plan, policy and targets."""
    folder = tmp_path / "cfg"
    folder.mkdir()
    shutil.copyfile(SAMPLE / "suite-stable.jsonl", folder / "suite.jsonl")
    for name in ("query_plan.yaml", "gate_policy.yaml", "targets.yaml"):
        shutil.copyfile(SPECS / name, folder / name)
    shutil.copyfile(SPECS / "pipeline.yaml", folder / "pipeline.yaml")
    edit(folder / "pipeline.yaml", "  suite: ../../data/scifact-sample/suite-stable.jsonl\n", "  suite: suite.jsonl\n")
    return folder


# Each case breaks one file of ``cfg`` and returns the exact line `ragpipe build` must print.
Breaker = Callable[[Path], str]


def spec_missing(cfg: Path) -> str:
    (cfg / "pipeline.yaml").unlink()
    return f"{cfg}/pipeline.yaml: cannot read pipeline spec: No such file or directory"


def spec_bad_yaml(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  max_bytes: 1200\n", "  max_bytes: 1200: 3\n")
    line = line_of((cfg / "pipeline.yaml").read_text(), "  max_bytes: 1200: 3")
    return (
        f"{cfg}/pipeline.yaml: cannot read pipeline spec: invalid YAML at line {line}, column 18: "
        "mapping values are not allowed here"
    )


def spec_duplicate_key(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  max_bytes: 1200\n", "  max_bytes: 1200\n  max_bytes: 900\n")
    line = line_of((cfg / "pipeline.yaml").read_text(), "  max_bytes: 900")
    return f"{cfg}/pipeline.yaml:{line}: chunker.max_bytes: duplicate key (first at line {line - 1})"


def spec_too_deep(cfg: Path) -> str:
    """100,000 nested lists: one line, no traceback (the document and chunker are levels 1-2)."""
    edit(cfg / "pipeline.yaml", "  max_bytes: 1200\n", "  max_bytes: " + "[" * 100_000 + "]" * 100_000 + "\n")
    line = line_of((cfg / "pipeline.yaml").read_text(), "  max_bytes: [")
    return f"{cfg}/pipeline.yaml:{line}: nesting deeper than 64 levels (column {len('  max_bytes: ') + 63})"


def spec_unknown_field(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  max_bytes: 1200\n", "  max_bytes: 1200\n  max_bites: 900\n")
    return f"{cfg}/pipeline.yaml: invalid pipeline spec: chunker.max_bites: Extra inputs are not permitted"


def spec_invalid_fields(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  kind: markdown_heading", "  kind: fixed")
    edit(cfg / "pipeline.yaml", "  k: 1000 ", "  k: 0 ")
    return (
        f"{cfg}/pipeline.yaml: invalid pipeline spec: "
        "chunker.kind: Input should be 'markdown_heading' or 'sliding_window'; "
        "evaluation.k: Input should be greater than or equal to 1"
    )


def spec_bad_scope(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  scopes: [public] ", '  scopes: ["bad scope!"] ')
    return f"{cfg}/pipeline.yaml: evaluation.scopes: invalid scope name 'bad scope!'"


def suite_missing(cfg: Path) -> str:
    """The bug report: the checked-in spec copied elsewhere, its relative suite path now naming nothing."""
    shutil.copyfile(SPECS / "pipeline.yaml", cfg / "pipeline.yaml")
    resolved = (cfg / "../../data/scifact-sample/suite-stable.jsonl").resolve()
    return (
        f"{cfg}/pipeline.yaml: evaluation.suite: '../../data/scifact-sample/suite-stable.jsonl' "
        f"(resolved to {resolved}): cannot read suite: No such file or directory"
    )


def suite_malformed_line(cfg: Path) -> str:
    lines = (cfg / "suite.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = '{"id": "broken", "query": \n'
    (cfg / "suite.jsonl").write_text("".join(lines), encoding="utf-8")
    return (
        f"{cfg}/pipeline.yaml: evaluation.suite: 'suite.jsonl' (resolved to {cfg}/suite.jsonl): "
        "line 3: not valid JSON: Expecting value (column 27)"
    )


def suite_duplicate_judgment(cfg: Path) -> str:
    lines = (cfg / "suite.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[1] = '{"id": "dup", "query": "x", "target_level": "document", "judgments": {"d1": 1, "d1": 0}}\n'
    (cfg / "suite.jsonl").write_text("".join(lines), encoding="utf-8")
    first = lines[1].index('"d1"') + 1
    return (
        f"{cfg}/pipeline.yaml: evaluation.suite: 'suite.jsonl' (resolved to {cfg}/suite.jsonl): "
        f"line 2: judgments.d1: duplicate key (first at column {first})"
    )


def spec_pq_sub_vectors(cfg: Path) -> str:
    edit(
        cfg / "pipeline.yaml",
        "  metric: cosine\n",
        "  metric: cosine\n  ann: {kind: ivf_pq, num_partitions: 4, num_sub_vectors: 7}\n",
    )
    return (
        f"{cfg}/pipeline.yaml: invalid pipeline spec: vector_index.ann.num_sub_vectors: "
        "7 does not divide the embedder's 384 dimensions (embedder.dimensions)"
    )


def plan_approximate_without_ann(cfg: Path) -> str:
    """Every bundle this spec builds would refuse the plan at the evaluation step: refused up front."""
    edit(cfg / "pipeline.yaml", "  query_plan: null ", "  query_plan: query_plan.yaml ")
    edit(cfg / "query_plan.yaml", "  kind: exact\n", "  kind: approximate\n")
    return (
        f"{cfg}/pipeline.yaml: evaluation.query_plan: 'query_plan.yaml' (resolved to {cfg}/query_plan.yaml): "
        "asks for approximate vector search (vector_search.kind: approximate), but vector_index declares no ann index"
    )


def plan_invalid(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  query_plan: null ", "  query_plan: query_plan.yaml ")
    edit(cfg / "query_plan.yaml", "  lexical: {depth: 100, weight: 1.0}", "  lexical: {depth: 0, weight: 1.0}")
    return (
        f"{cfg}/pipeline.yaml: evaluation.query_plan: 'query_plan.yaml' (resolved to {cfg}/query_plan.yaml): "
        "invalid query plan: channels.lexical.depth: Input should be greater than or equal to 1"
    )


def plan_missing_default_named(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  query_plan: null ", f"  query_plan: {cfg}/nowhere.yaml ")
    return (
        f"{cfg}/pipeline.yaml: evaluation.query_plan: '{cfg}/nowhere.yaml': "
        "cannot read query plan: No such file or directory"
    )


def policy_invalid(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  gate_policy: null ", "  gate_policy: gate_policy.yaml ")
    edit(cfg / "gate_policy.yaml", "  min_cases: 20 ", "  min_cases: 0 ")
    line = line_of((cfg / "gate_policy.yaml").read_text(), "  min_cases: 0 ")
    return (
        f"{cfg}/pipeline.yaml: evaluation.gate_policy: 'gate_policy.yaml' (resolved to {cfg}/gate_policy.yaml): "
        f"line {line}: coverage.min_cases: must be an integer >= 1, got 0"
    )


def cutoffs_invalid(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  cutoffs: null ", "  cutoffs: {ndcg: 10, bleu: 4} ")
    return (
        f"{cfg}/pipeline.yaml: evaluation.cutoffs: unknown metric family 'bleu' "
        "(known: ndcg, recall, mrr, precision, hit, relevant_recall)"
    )


def targets_invalid(cfg: Path) -> str:
    edit(cfg / "targets.yaml", "    auto_activate: true ", "    auto_activate: maybe ")
    return (
        f"{cfg}/targets.yaml: invalid targets config: targets.staging.auto_activate: "
        "Input should be a valid boolean, unable to interpret input"
    )


def targets_bad_yaml(cfg: Path) -> str:
    edit(cfg / "targets.yaml", "schema: ragpipe.targets/v1\n", "schema: ragpipe.targets/v1: 2\n")
    line = line_of((cfg / "targets.yaml").read_text(), "schema:")
    return (
        f"{cfg}/targets.yaml: cannot read targets config: invalid YAML at line {line}, column 27: "
        "mapping values are not allowed here"
    )


def targets_duplicate_key(cfg: Path) -> str:
    edit(cfg / "targets.yaml", "default_target: staging ", "default_target: production\ndefault_target: staging ")
    line = line_of((cfg / "targets.yaml").read_text(), "default_target: staging")
    return f"{cfg}/targets.yaml:{line}: default_target: duplicate key (first at line {line - 1})"


def targets_too_deep(cfg: Path) -> str:
    edit(cfg / "targets.yaml", "default_target: staging ", "default_target: " + "{a: " * 100_000 + "}" * 100_000)
    line = line_of((cfg / "targets.yaml").read_text(), "default_target: ")
    return f"{cfg}/targets.yaml:{line}: nesting deeper than 64 levels (column {len('default_target: ') + 63 * 4 + 1})"


def policy_duplicate_key(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  gate_policy: null ", "  gate_policy: gate_policy.yaml ")
    edit(cfg / "gate_policy.yaml", "  min_cases: 20 ", "  min_cases: 20\n  min_cases: 5 ")
    line = line_of((cfg / "gate_policy.yaml").read_text(), "  min_cases: 5 ")
    return (
        f"{cfg}/pipeline.yaml: evaluation.gate_policy: 'gate_policy.yaml' (resolved to {cfg}/gate_policy.yaml): "
        f"line {line}: coverage.min_cases: duplicate key (first at line {line - 1})"
    )


def targets_policy_missing(cfg: Path) -> str:
    edit(cfg / "targets.yaml", "    gate_policies: [default]   #", "    gate_policies: [strict.yaml]   #")
    return (
        f"{cfg}/targets.yaml: target 'staging': gate policy 'strict.yaml': "
        f"{cfg}/strict.yaml: cannot read gate policy: No such file or directory"
    )


def _with_judge(cfg: Path, extra: str = "") -> None:
    """The checked-in judge (and its prompt) beside the spec, named by ``evaluation.judge``."""
    (cfg / "prompts").mkdir(exist_ok=True)
    shutil.copyfile(SPECS / "judge.yaml", cfg / "judge.yaml")
    shutil.copyfile(SPECS / "prompts" / "judge.txt", cfg / "prompts" / "judge.txt")
    edit(cfg / "pipeline.yaml", "  gate_policy: null ", f"  judge: judge.yaml\n{extra}  gate_policy: null ")


def judge_missing(cfg: Path) -> str:
    edit(cfg / "pipeline.yaml", "  gate_policy: null ", "  judge: judges/strict.yaml\n  gate_policy: null ")
    return (
        f"{cfg}/pipeline.yaml: evaluation.judge: 'judges/strict.yaml' (resolved to {cfg}/judges/strict.yaml): "
        "cannot read judge spec: No such file or directory"
    )


def judge_invalid(cfg: Path) -> str:
    _with_judge(cfg)
    edit(cfg / "judge.yaml", "rubric_version: 1\n", "rubric_version: 0\n")
    return (
        f"{cfg}/pipeline.yaml: evaluation.judge: 'judge.yaml' (resolved to {cfg}/judge.yaml): "
        "invalid judge spec: rubric_version: Input should be greater than or equal to 1"
    )


def judge_budget_unpriced(cfg: Path) -> str:
    """The CLI's rule for --judge-budget-micros: a budget on a model without a price cannot be kept."""
    _with_judge(cfg, "  judge_budget_micros: 50000\n")
    edit(cfg / "judge.yaml", "model: openai/gpt-4o-mini\n", "model: openai/unpriced-judge\n")
    return (
        f"{cfg}/pipeline.yaml: evaluation.judge_budget_micros: the judge's model 'openai/unpriced-judge' has no "
        "price in the price table (ragpipe/specs/prices.yaml or $RAGPIPE_PRICES), so no budget can be kept"
    )


def judge_settings_out_of_range(cfg: Path) -> str:
    _with_judge(cfg, "  judge_budget_micros: -1\n  judge_concurrency: 65\n")
    return (
        f"{cfg}/pipeline.yaml: invalid pipeline spec: "
        "evaluation.judge_budget_micros: Input should be greater than or equal to 0; "
        "evaluation.judge_concurrency: Input should be less than or equal to 64"
    )


CASES: dict[str, Breaker] = {
    f.__name__: f
    for f in (
        spec_missing,
        spec_bad_yaml,
        spec_duplicate_key,
        spec_too_deep,
        spec_unknown_field,
        spec_invalid_fields,
        spec_bad_scope,
        spec_pq_sub_vectors,
        suite_missing,
        suite_malformed_line,
        suite_duplicate_judgment,
        plan_invalid,
        plan_approximate_without_ann,
        plan_missing_default_named,
        policy_invalid,
        policy_duplicate_key,
        cutoffs_invalid,
        judge_missing,
        judge_invalid,
        judge_budget_unpriced,
        judge_settings_out_of_range,
        targets_invalid,
        targets_bad_yaml,
        targets_duplicate_key,
        targets_too_deep,
        targets_policy_missing,
    )
}


def broken_env(cfg: Path) -> dict[str, str]:
    return {"RAGPIPE_PIPELINE_SPEC": str(cfg / "pipeline.yaml"), "RAGPIPE_TARGETS": str(cfg / "targets.yaml")}


def test_the_working_configuration_builds_past_the_check(cfg: Path, tmp_path: Path):
    """The fixture itself is valid: the check passes (the suite resolves against the spec's folder)."""
    code = "from ragpipe.stages.configuration import check_configuration as c; print(c().chain.suite.source)"
    env = {**os.environ, **broken_env(cfg)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{cfg}/suite.jsonl\n", "")


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_file_stops_the_build_with_one_line(cfg: Path, tmp_path: Path, case: str):
    expected = CASES[case](cfg)
    proc = ragpipe(
        "build", str(CORPUS), "--revision", "r1", "--default-scope", "public", home=tmp_path / "home", **broken_env(cfg)
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"error: {expected}"]
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr + proc.stdout
    assert list_revisions(Workspace(tmp_path / "home" / "ragpipe").registry) == []


def test_dagster_definitions_validate_prints_the_line_without_a_traceback(cfg: Path, tmp_path: Path):
    expected = suite_missing(cfg)
    env = {
        **os.environ,
        **broken_env(cfg),
        "RAGPIPE_HOME": str(tmp_path / "ragpipe"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    (tmp_path / "dagster").mkdir()
    (tmp_path / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 1
    assert expected in proc.stderr.splitlines()
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output and "Stack Trace" not in output
    assert "SuiteError" not in output and "ConfigurationError" not in output


def test_loading_the_location_in_process_raises_the_line_and_prints_nothing(cfg: Path, tmp_path: Path):
    """What `ragpipe build` meets when the configuration breaks after its own check: the in-process
    load of the code location (``build_location``) raises ``ConfigurationError`` with the line, and
    Dagster's warning (which carries the whole stack trace) is not shown."""
    expected = spec_unknown_field(cfg)
    code = (
        "from ragpipe.orchestration.launch import build_location\n"
        "from ragpipe.orchestration.materialize import dagster_instance\n"
        "from ragpipe.stages.configuration import ConfigurationError\n"
        "try:\n"
        "    with build_location(dagster_instance()):\n"
        "        pass\n"
        "except ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    env = {
        **os.environ,
        **broken_env(cfg),
        "RAGPIPE_HOME": str(tmp_path / "ragpipe"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{expected}\n", "")


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"RAGPIPE_STORE": "s3://Bad_Bucket/x"},
            "RAGPIPE_STORE: 's3://Bad_Bucket/x': 'Bad_Bucket' is not an S3 bucket name (3-63 of a-z 0-9 . -)",
        ),
        *(
            (
                {"RAGPIPE_EMBEDDING_SHARDS": value},
                f"RAGPIPE_EMBEDDING_SHARDS={value!r}: must be an integer from 1 to 64",
            )
            for value in ("0", "65", "three")
        ),
    ],
)
def test_an_operational_setting_out_of_its_rules_stops_the_build_with_one_line(
    cfg: Path, tmp_path: Path, env: dict[str, str], line: str
):
    args = ["build", str(CORPUS), "--revision", "r1", "--default-scope", "public"]
    proc = ragpipe(*args, home=tmp_path / "home", **env, **broken_env(cfg))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.splitlines() == [f"error: {line}"]
    assert list_revisions(Workspace(tmp_path / "home" / "ragpipe").registry) == []
