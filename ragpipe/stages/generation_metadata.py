"""What a generation run reports: calls, tokens, cache hits, failures, money (Dagster metadata)."""

from __future__ import annotations

from ragpipe.representations.generation_run import GenerationOutcome


def generation_metadata(outcome: GenerationOutcome) -> dict[str, int | str | bool]:
    """Sums over the run's generated kinds. ``generation_cost_micros`` is the priced calls' sum
    and ``generation_cost_known`` False when any call's model has no price (the cost is then
    unknown, shown as ``generation_cost``: never read the micros alone as the total)."""
    usage = outcome.usage
    reports = outcome.reports.values()
    invalid = sum(1 for r in outcome.records if r.status == "invalid_output")
    withheld = sum(1 for r in outcome.records if r.status == "withheld")
    return {
        "generation_items": sum(r.unique for r in reports),
        "generation_calls": usage.calls,
        "generation_cache_hits": sum(r.cache_hits + r.waited_hits for r in reports),
        "generation_computed": sum(r.computed for r in reports),
        "generation_invalid_output": invalid,
        # chunks the disclosure policy kept from the endpoint: nothing sent, no representation
        "generation_withheld": withheld,
        # chunk x kind pairs without the generated representation the spec asked for
        "generation_missing": invalid + withheld,
        "generation_retries": sum(sum(r.retries.values()) for r in reports),
        "generation_input_tokens": usage.input_tokens,
        "generation_output_tokens": usage.output_tokens,
        "generation_cost_micros": usage.cost_micros,
        "generation_cost_known": usage.cost_known,
        "generation_cost": usage.cost_text(),
    }
