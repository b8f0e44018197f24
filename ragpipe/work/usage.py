"""Usage and cost of model calls: tokens, latency and integer micros from a checked-in price table.

Money is integer micros (10⁻⁶ of the table's currency, USD). A call's cost is
``ceil((input_tokens × input_price + output_tokens × output_price) / 1,000,000)`` with prices in
micros per million tokens, so every figure is an integer and a sum is exact. A model the table does
not name has an *unknown* cost — ``None``, shown as unknown, never counted as zero.

The table is ``ragpipe/specs/prices.yaml`` (or the file ``$RAGPIPE_PRICES`` names). A key matches a
litellm model string exactly, or as an ``fnmatch`` pattern (``ollama/*``); an exact key wins, then
the longest matching pattern.
"""

from __future__ import annotations

import fnmatch
from functools import lru_cache
from pathlib import Path

from pydantic import Field, ValidationError

from ragpipe.kernel.models import FrozenModel
from ragpipe.kernel.settings import current_settings
from ragpipe.kernel.strict_load import StrictLoadError, load_yaml

DEFAULT_PRICES = Path(__file__).resolve().parent.parent / "specs" / "prices.yaml"


class PriceError(ValueError):
    """The price table is refused; one line naming the file and the rule."""


class ModelPrice(FrozenModel):
    input: int = Field(ge=0)  # micros per million input tokens
    output: int = Field(ge=0)  # micros per million output tokens


class PriceTable(FrozenModel):
    schema_: str = Field(alias="schema", pattern=r"^ragpipe\.prices/v1$")
    currency: str = "USD"
    models: dict[str, ModelPrice]

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.models.items())))

    def price(self, model: str) -> ModelPrice | None:
        if model in self.models:
            return self.models[model]
        matching = [k for k in self.models if any(c in k for c in "*?[") and fnmatch.fnmatchcase(model, k)]
        return self.models[max(matching, key=len)] if matching else None

    def cost_micros(self, model: str, input_tokens: int, output_tokens: int) -> int | None:
        """The cost of one call in micros, rounded up; None when the model has no price."""
        price = self.price(model)
        if price is None:
            return None
        return -(-(input_tokens * price.input + output_tokens * price.output) // 1_000_000)


@lru_cache(maxsize=4)
def _load(path: Path) -> PriceTable:
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"), str(path))
    except StrictLoadError as exc:  # a YAML syntax error keeps its wording; the strict rules are <file>:<line>: <rule>
        if exc.original is None:
            raise PriceError(str(exc)) from None
        raise PriceError(f"{path}: cannot read price table: {' '.join(str(exc.original).split())}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PriceError(f"{path}: cannot read price table: {' '.join(str(exc).split())}") from None
    try:
        return PriceTable.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(top)"
        raise PriceError(f"{path}: invalid price table: {where}: {first['msg']}") from None


def load_prices(path: Path | None = None) -> PriceTable:
    """The price table at ``path``, else ``RAGPIPE_PRICES`` (``current_settings().prices``), else
    the checked-in one."""
    return _load(Path(path or current_settings().prices or DEFAULT_PRICES).resolve())


class Usage(FrozenModel):
    """One model call: who answered, tokens both ways, how long it took, what it cost."""

    provider: str
    model: str
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    latency_ms: int = Field(ge=0)
    cost_micros: int | None = Field(ge=0)

    @property
    def metered(self) -> bool:
        """Whether the provider reported token counts. Every request sends a prompt, so a call
        with 0 input tokens reported none (its tokens are then 0 here and its cost None)."""
        return self.input_tokens > 0


class UsageTotals(FrozenModel):
    """Sums over calls. ``cost_micros`` sums the priced calls; ``unpriced_calls`` counts the others,
    so a total with any unpriced call is unknown (``cost_known`` False), never a smaller number."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: int = 0
    cost_micros: int = 0
    unpriced_calls: int = 0

    @property
    def cost_known(self) -> bool:
        return self.unpriced_calls == 0

    def add(self, usage: Usage) -> UsageTotals:
        return UsageTotals(
            calls=self.calls + 1,
            input_tokens=self.input_tokens + usage.input_tokens,
            output_tokens=self.output_tokens + usage.output_tokens,
            latency_ms=self.latency_ms + usage.latency_ms,
            cost_micros=self.cost_micros + (usage.cost_micros or 0),
            unpriced_calls=self.unpriced_calls + (usage.cost_micros is None),
        )

    def merge(self, other: UsageTotals) -> UsageTotals:
        return UsageTotals(**{name: getattr(self, name) + getattr(other, name) for name in UsageTotals.model_fields})

    def cost_text(self) -> str:
        """``"1234 micros"``, or ``"unknown (2 of 5 calls unpriced; 1234 micros priced)"``."""
        if self.cost_known:
            return f"{self.cost_micros} micros"
        return f"unknown ({self.unpriced_calls} of {self.calls} calls unpriced; {self.cost_micros} micros priced)"
