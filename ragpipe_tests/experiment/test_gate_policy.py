"""The gate policy file: loading, identity, and malformed policies refused with exact messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.experiment.gate_policy import DEFAULT_POLICY_PATH, PHASES, PolicyError, load_policy, parse_policy
from ragpipe_tests.support.gate_support import policy_doc

BASE = """\
schema: ragpipe.gate_policy/v1
human_apply_required: true
hard:
  unauthorized_disclosures: {max: 0}
  answer_contract_valid_rate: {min: 0.99, if_measured: true}
coverage:
  max_failed_rate: 0.0
  min_cases: 10
target:
  metric: ndcg@10
  min_improvement: 0.01
  evidence: ci_lower
  alpha: 0.05
regression:
  overall: {recall@100: 0.02}
  tags: {}
cost:
  max_p95_latency_ratio: 1.5
  latency_slack_ms: 5.0
  max_p95_latency_ms: null
bootstrap_floors:
  ndcg@10: 0.3
  recall@100: 0.3
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def edit(old: str, new: str) -> str:
    assert BASE.count(old) == 1, old
    return BASE.replace(old, new)


def test_base_policy_equals_the_test_document_and_its_id_is_pinned(tmp_path: Path):
    policy = load_policy(write(tmp_path, BASE))
    assert policy == parse_policy(policy_doc(), "x")
    # Golden vector: pins the policy schema's canonical encoding.
    assert policy.policy_id == GOLDEN_ID


GOLDEN_ID = "sha256:dc96c74325f2b2cf9733f3e972dae112375d039766535e7bb9f4b5a77d87a4f9"


def test_policy_id_ignores_mapping_order_and_number_spelling(tmp_path: Path):
    reordered = BASE.replace(
        "  unauthorized_disclosures: {max: 0}\n  answer_contract_valid_rate: {min: 0.99, if_measured: true}\n",
        "  answer_contract_valid_rate: {if_measured: true, min: 0.99}\n  unauthorized_disclosures: {max: 0.0}\n",
    )
    reordered = reordered.replace("  ndcg@10: 0.3\n  recall@100: 0.3\n", "  recall@100: 0.30\n  ndcg@10: 3.0e-1\n")
    assert reordered != BASE
    assert load_policy(write(tmp_path, reordered)).policy_id == load_policy(write(tmp_path, BASE)).policy_id
    changed = edit("min_improvement: 0.01", "min_improvement: 0.02")
    assert load_policy(write(tmp_path, changed)).policy_id != load_policy(write(tmp_path, BASE)).policy_id


def test_default_policy_loads_with_every_phase():
    policy = load_policy()
    assert load_policy(DEFAULT_POLICY_PATH) == policy
    assert (policy.target.metric, policy.target.evidence, policy.human_apply_required) == ("ndcg@10", "ci_lower", True)
    assert policy.hard["unauthorized_disclosures"].max == 0.0
    assert "ndcg@10" in policy.bootstrap_floors


MALFORMED = [
    (
        "unknown phase",
        BASE + "speed:\n  max: 1\n",
        "24: speed: unknown phase (phases, in order: hard, coverage, target, regression, cost; other keys: schema, human_apply_required, refresh, bootstrap_floors)",
    ),
    (
        "missing phase",
        BASE.replace("cost:\n  max_p95_latency_ratio: 1.5\n  latency_slack_ms: 5.0\n  max_p95_latency_ms: null\n", ""),
        "1: policy: missing phase 'cost' (every phase is declared, even when empty)",
    ),
    (
        "phases out of order",
        BASE.replace("coverage:\n  max_failed_rate: 0.0\n  min_cases: 10\n", "").replace(
            "regression:\n", "coverage:\n  max_failed_rate: 0.0\n  min_cases: 10\nregression:\n"
        ),
        "6: target: phase out of order (phases run, and are listed, in the order hard, coverage, target, regression, cost)",
    ),
    (
        "unknown key in a phase",
        edit("  alpha: 0.05\n", "  alpha: 0.05\n  alpah: 0.01\n"),
        "14: target.alpah: unknown key (allowed: metric, min_improvement, evidence, alpha)",
    ),
    (
        "unknown metric in target",
        edit("metric: ndcg@10", "metric: ndcg@x"),
        "10: target.metric: unknown metric 'ndcg@x' (known: ndcg@K, recall@K, mrr@K, precision@K, hit@K, relevant_recall@K, "
        "unauthorized_disclosures, answer_contract_valid_rate, abstention_rate, correct_abstention_rate, citation_precision, ann_recall@10, "
        "answer_label, label_fail_rate, label_substantial_rate, label_authoritative_rate, required_fact_recall, "
        "groundedness_rate, judge_failure_rate)",
    ),
    (
        "unknown metric in hard",
        edit("  unauthorized_disclosures: {max: 0}", "  leaks: {max: 0}"),
        "4: hard.leaks: unknown metric 'leaks' (known: ndcg@K, recall@K, mrr@K, precision@K, hit@K, relevant_recall@K, "
        "unauthorized_disclosures, answer_contract_valid_rate, abstention_rate, correct_abstention_rate, citation_precision, ann_recall@10, "
        "answer_label, label_fail_rate, label_substantial_rate, label_authoritative_rate, required_fact_recall, "
        "groundedness_rate, judge_failure_rate)",
    ),
    (
        "NaN threshold",
        edit("min_improvement: 0.01", "min_improvement: .nan"),
        "11: target.min_improvement: threshold must be finite, got nan",
    ),
    (
        "infinite threshold",
        edit("  ndcg@10: 0.3\n", "  ndcg@10: .inf\n"),
        "22: bootstrap_floors.ndcg@10: threshold must be finite, got inf",
    ),
    (
        "min above max",
        edit("{min: 0.99, if_measured: true}", "{min: 0.99, max: 0.5}"),
        "5: hard.answer_contract_valid_rate: contradictory bounds: min 0.99 > max 0.5",
    ),
    (
        "ceiling below the metric's range",
        edit("{max: 0}", "{max: -1}"),
        "4: hard.unauthorized_disclosures.max: contradictory bound: -1 is outside the range [0, inf] of unauthorized_disclosures",
    ),
    (
        "floor above the metric's range",
        edit("  recall@100: 0.3\n", "  recall@100: 1.5\n"),
        "23: bootstrap_floors.recall@100: contradictory bound: 1.5 is outside the range [0, 1] of recall@100",
    ),
    (
        "unreachable improvement",
        edit("min_improvement: 0.01", "min_improvement: 2"),
        "11: target.min_improvement: contradictory bound: a change of 2 exceeds the range width 1 of ndcg@10",
    ),
    (
        "negative allowed loss",
        edit("{recall@100: 0.02}", "{recall@100: -0.02}"),
        "15: regression.overall.recall@100: must be >= 0, got -0.02",
    ),
    (
        "no bootstrap floor for the target",
        edit("  ndcg@10: 0.3\n", ""),
        "21: bootstrap_floors: contradictory policy: no floor for the target metric 'ndcg@10' (a bootstrap decision would have no target)",
    ),
    (
        "hard bound without min or max",
        edit("{max: 0}", "{if_measured: true}"),
        "4: hard.unauthorized_disclosures: needs min or max",
    ),
    (
        "boolean threshold",
        edit("max_failed_rate: 0.0", "max_failed_rate: no"),
        "7: coverage.max_failed_rate: must be a number, got False",
    ),
    (
        "duplicate key",
        edit("  alpha: 0.05\n", "  alpha: 0.05\n  alpha: 0.5\n"),
        "14: target.alpha: duplicate key (first at line 13)",
    ),
    (
        "duplicate key at depth",
        edit("  overall: {recall@100: 0.02}\n", "  overall: {recall@100: 0.02, recall@100: 0.5}\n"),
        "15: regression.overall.recall@100: duplicate key (first at column 13)",
    ),
    (
        # 100,000 levels: one line, never a RecursionError (kernel/strict_load.py); the policy's
        # mapping and regression are levels 1-2, so the 63rd '[' crosses the bound of 64
        "deep nesting",
        edit("  tags: {}\n", "  tags: " + "[" * 100_000 + "]" * 100_000 + "\n"),
        f"16: nesting deeper than 64 levels (column {len('  tags: ') + 63})",
    ),
    (
        "alias",
        edit("  overall: {recall@100: 0.02}\n", "  overall: &o {recall@100: 0.02}\n  tags: *o\n").replace(
            "  tags: {}\n", ""
        ),
        "16: YAML alias *o is not allowed (anchors and aliases are refused in configuration: write the value out)",
    ),
    (
        "unknown evidence rule",
        edit("evidence: ci_lower", "evidence: vibes"),
        "12: target.evidence: must be ci_lower or p_value, got 'vibes'",
    ),
    ("alpha out of range", edit("alpha: 0.05", "alpha: 0"), "13: target.alpha: must be > 0, got 0"),
    (
        "min_cases not an integer",
        edit("min_cases: 10", "min_cases: 2.5"),
        "8: coverage.min_cases: must be an integer >= 1, got 2.5",
    ),
    (
        "wrong schema",
        edit("schema: ragpipe.gate_policy/v1", "schema: ragpipe.gate_policy/v2"),
        "1: schema: must be 'ragpipe.gate_policy/v1', got 'ragpipe.gate_policy/v2'",
    ),
    (
        "unknown cost key",
        edit("  latency_slack_ms: 5.0\n", "  latency_slack: 5.0\n"),
        "19: cost.latency_slack: unknown key (allowed: max_p95_latency_ratio, latency_slack_ms, max_p95_latency_ms, "
        "max_build_vectors_ratio, max_build_vectors, max_bundle_bytes_ratio, max_bundle_bytes, "
        "max_answer_tokens_per_case, max_answer_micros_per_case)",
    ),
    (
        "invalid YAML",
        edit("  min_cases: 10\n", "  min_cases: [10\n"),
        "9: invalid YAML: expected ',' or ']', but got ':'",
    ),
    ("not a mapping", "- hard\n- target\n", "1: policy: must be a mapping, got list"),
    (
        "unknown metric in a protected slice",
        edit("tags: {}", "tags: {rare: {ndcg@0: 0.1}}"),
        "16: regression.tags.rare.ndcg@0: unknown metric 'ndcg@0' (known: ndcg@K, recall@K, mrr@K, precision@K, hit@K, relevant_recall@K, "
        "unauthorized_disclosures, answer_contract_valid_rate, abstention_rate, correct_abstention_rate, citation_precision, ann_recall@10, "
        "answer_label, label_fail_rate, label_substantial_rate, label_authoritative_rate, required_fact_recall, "
        "groundedness_rate, judge_failure_rate)",
    ),
]


@pytest.mark.parametrize(("text", "message"), [(t, m) for _, t, m in MALFORMED], ids=[n for n, _, _ in MALFORMED])
def test_malformed_policy_is_refused_with_file_line_and_rule(tmp_path: Path, text: str, message: str):
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value) == f"{path}:{message}"


def test_unreadable_policy_names_the_file(tmp_path: Path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError) as info:
        load_policy(missing)
    assert str(info.value) == f"{missing}: cannot read gate policy: No such file or directory"


def test_phase_list_is_the_fixed_order():
    assert PHASES == ("hard", "coverage", "target", "regression", "cost")


def test_policy_id_is_the_domain_separated_hash_of_its_canonical_form(tmp_path: Path):
    import hashlib

    import rfc8785

    canonical = {
        "schema": "ragpipe.gate_policy/v1",
        "human_apply_required": True,
        "hard": {
            "unauthorized_disclosures": {"min": None, "max": 0.0, "if_measured": False},
            "answer_contract_valid_rate": {"min": 0.99, "max": None, "if_measured": True},
        },
        "coverage": {"max_failed_rate": 0.0, "min_cases": 10},
        "target": {"metric": "ndcg@10", "min_improvement": 0.01, "evidence": "ci_lower", "alpha": 0.05},
        "regression": {"overall": {"recall@100": 0.02}, "tags": {}},
        "cost": {"max_p95_latency_ratio": 1.5, "latency_slack_ms": 5.0, "max_p95_latency_ms": None},
        "bootstrap_floors": {"ndcg@10": 0.3, "recall@100": 0.3},
    }
    expected = "sha256:" + hashlib.sha256(b"ragpipe/gate-policy/v1\0" + rfc8785.dumps(canonical)).hexdigest()
    assert load_policy(write(tmp_path, BASE)).policy_id == expected == GOLDEN_ID


LABEL_RULE = (
    "must bound judge_failure_rate with a max below 1 (a judged answer recorded as a judge failure keeps no "
    "label and would escape that bound)"
)


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        (
            "  answer_contract_valid_rate: {min: 0.99, if_measured: true}\n",
            "  groundedness_rate: {min: 0.9}\n",
            "hard.groundedness_rate",
        ),
        (
            "  overall: {recall@100: 0.02}\n",
            "  overall: {recall@100: 0.02, answer_label: 0.1}\n",
            "regression.overall.answer_label",
        ),
        ("  tags: {}\n", "  tags: {rare: {label_fail_rate: 0.05}}\n", "regression.tags.rare.label_fail_rate"),
        ("  metric: ndcg@10\n", "  metric: required_fact_recall\n", "target.metric (required_fact_recall)"),
    ],
    ids=["hard", "regression", "tag", "target"],
)
def test_a_policy_bounding_judge_labels_must_bound_judge_failures_with_a_hard_max(
    tmp_path: Path, old: str, new: str, where: str
):
    text = edit(old, new)
    if "required_fact_recall" in new:  # its bootstrap floor, too
        text = text.replace("  ndcg@10: 0.3\n", "  required_fact_recall: 0.5\n")
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value) == f"{path}:3: hard: the policy bounds a judge label ({where}), so it {LABEL_RULE}"
    # a min is no bound on failures
    hard = "hard:\n  judge_failure_rate: {min: 0.0}\n"
    with pytest.raises(PolicyError) as info:
        load_policy(write(tmp_path, text.replace("hard:\n", hard)))
    assert str(info.value) == (
        f"{path}:4: hard.judge_failure_rate: the policy bounds a judge label ({where}), so it {LABEL_RULE}"
    )
    # a max of 1 bounds nothing: every answer may be a failure
    with pytest.raises(PolicyError) as info:
        load_policy(write(tmp_path, text.replace("hard:\n", "hard:\n  judge_failure_rate: {max: 1.0}\n")))
    assert str(info.value) == (
        f"{path}:4: hard.judge_failure_rate: the policy bounds a judge label ({where}), so it {LABEL_RULE}"
    )
    bounded = load_policy(write(tmp_path, text.replace("hard:\n", "hard:\n  judge_failure_rate: {max: 0.02}\n")))
    assert bounded.hard["judge_failure_rate"].max == 0.02


def test_the_failure_rate_alone_and_the_checked_in_policy_need_no_label_rule(tmp_path: Path):
    alone = load_policy(
        write(tmp_path, edit("hard:\n", "hard:\n  judge_failure_rate: {max: 0.05, if_measured: true}\n"))
    )
    assert "judge_failure_rate" in alone.hard
    default = load_policy()
    assert not default.metrics() & {"answer_label", "label_fail_rate", "groundedness_rate", "required_fact_recall"}
    # the checked-in policy bounds no judge label: its ID is the one it had before the rule
    assert default.policy_id == "sha256:388b55a0d3a70d7bd566eaa98786acf2e3cf4166ed5cbb30a8bf5a843a5d9265"
