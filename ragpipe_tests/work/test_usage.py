"""Cost in integer micros from the checked-in price table; an unpriced model is unknown, never zero."""

from __future__ import annotations

import pytest

from ragpipe.work.usage import PriceError, Usage, UsageTotals, load_prices


def test_cost_is_integer_micros_rounded_up_per_call():
    prices = load_prices()
    # gpt-4o-mini: 150,000 and 600,000 micros per million tokens
    assert prices.cost_micros("openai/gpt-4o-mini", 1000, 500) == 450  # 150 + 300
    assert prices.cost_micros("openai/gpt-4o-mini", 1, 1) == 1  # 0.75 rounds up
    assert prices.cost_micros("openai/gpt-4o-mini", 0, 0) == 0
    assert prices.cost_micros("ollama/qwen2.5:7b", 10_000, 10_000) == 0  # a pattern: ollama/*
    assert prices.cost_micros("someone/unknown-model", 1, 1) is None


def test_totals_with_an_unpriced_call_are_unknown():
    priced = Usage(provider="openai", model="m", input_tokens=5, output_tokens=7, latency_ms=3, cost_micros=12)
    unpriced = priced.model_copy(update={"cost_micros": None})
    total = UsageTotals().add(priced).add(priced)
    assert (total.calls, total.input_tokens, total.output_tokens, total.cost_micros) == (2, 10, 14, 24)
    assert total.cost_text() == "24 micros"
    mixed = total.add(unpriced)
    assert not mixed.cost_known
    assert mixed.cost_text() == "unknown (1 of 3 calls unpriced; 24 micros priced)"
    assert mixed.merge(total).calls == 5


def test_a_bad_price_table_is_one_line_naming_the_file(tmp_path, monkeypatch):
    table = tmp_path / "prices.yaml"
    table.write_text("schema: ragpipe.prices/v1\nmodels:\n  m: {input: -1, output: 2}\n")
    with pytest.raises(PriceError) as caught:
        load_prices(table)
    assert (
        str(caught.value)
        == f"{table.resolve()}: invalid price table: models.m.input: Input should be greater than or equal to 0"
    )
