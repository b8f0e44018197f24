"""What the gate step shows an operator in the Dagster UI: a narrow checks table with units."""

from __future__ import annotations

from ragpipe.experiment.decision import check
from ragpipe.stages.gate_steps import checks_tables, figure


class Checks:  # the one attribute checks_tables reads
    def __init__(self, checks):
        self.checks = tuple(checks)


def test_one_checks_table_per_phase_with_three_narrow_columns_units_and_rounded_figures():
    decision = Checks(
        [
            check("target", "improvement", 0.0012345678, ">=", 0.002, metric="ndcg@10"),
            check("regression", "max_loss", -0.00049, ">=", -0.01, metric="recall@100", slice="tag:x"),
            check("coverage", "failed_rate", None, "<=", 0.0, arm="challenger"),
            check("cost", "p95_latency_relative", 38.915123, "<=", 25.5, advisory=True),
            check("cost", "bundle_bytes_relative", 3_500_000.0, "<=", 7_340_032.0),
            check("regression", "max_loss", 0.0, ">=", -0.01, metric="mrr@10", slice="all"),
        ]
    )
    tables = checks_tables(decision)
    assert list(tables) == ["checks coverage", "checks target", "checks regression", "checks cost"]  # phase order
    assert all([name for name, _ in t.columns] == ["verdict", "check", "value and rule"] for t in tables.values())
    assert {k: [list(r.values()) for r in t.rows] for k, t in tables.items()} == {
        "checks coverage": [["fail", "failed_rate (challenger)", "— <= 0"]],
        "checks target": [["fail", "improvement ndcg@10", "0.001235 >= 0.002"]],
        "checks regression": [
            ["pass", "max_loss recall@100 on tag:x", "-0.00049 >= -0.01"],
            ["pass", "max_loss mrr@10", "0 >= -0.01"],  # the slice of every case goes without saying
        ],
        "checks cost": [
            ["advisory", "p95_latency_relative", "38.92 ms <= 25.5 ms"],
            ["pass", "bundle_bytes_relative", "3.338 MiB <= 7 MiB"],
        ],
    }
    assert figure(512.0, "bytes") == "512 bytes" and figure(3 * 2**30, "bytes") == "3 GiB"


def test_every_float_in_dagster_metadata_has_four_significant_digits():
    from ragpipe.defs.metadata import rounded, table_value
    from ragpipe.stages.results import table

    t = table([("metric", "string"), ("value", "float"), ("n", "int")], [["ndcg@10", 0.9217678885599524, 99]])
    assert [r.data for r in table_value(t).value.records] == [{"metric": "ndcg@10", "value": 0.9218, "n": 99}]
    assert (rounded(1234.5678), rounded(7), rounded("x"), rounded(None)) == (1235.0, 7, "x", None)
