"""The base of every identity-bearing record model: immutable, closed, finite.

``FrozenModel`` refuses unknown fields (a misspelt key in a policy or a forged record is an
error, never ignored), is hashable and immutable once validated, and refuses NaN and infinities
in any float field, so a record that validates can always be canonically encoded.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class FrozenModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
