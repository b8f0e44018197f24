"""The build summary table: the generation row (one line of sums) and its absence without one."""

from __future__ import annotations

from rich.console import Console

from ragpipe.cli.build_view import print_summary

SUMMARY = {"revision": "r1", "bundle_id": "sha256:" + "a" * 64, "up_to_date": False, "generation": None}
GENERATION = {
    "calls": 12,
    "cache_hits": 30,
    "computed": 12,
    "invalid_output": 1,
    "withheld": 2,
    "missing": 3,
    "retries": 2,
    "input_tokens": 4100,
    "output_tokens": 610,
    "cost_micros": 981,
    "cost_known": False,
    "cost": "unknown (3 of 12 calls unpriced; 981 micros priced)",
}


def rendered(summary: dict) -> str:
    console = Console(width=200, record=True, color_system=None)
    print_summary(console, summary)
    return console.export_text()


def test_the_generation_row_is_one_line_of_sums():
    out = rendered({**SUMMARY, "generation": GENERATION})
    (row,) = [line for line in out.splitlines() if "generation" in line]
    assert (
        "12 calls · 30 cached · 1 invalid · 2 withheld · tokens in 4100 · out 610 · "
        "cost unknown (3 of 12 calls unpriced; 981 micros priced) · 3 chunk(s) lack a generated kind"
    ) in row


def test_a_build_without_generated_kinds_has_no_generation_row():
    assert "generation" not in rendered(SUMMARY)
