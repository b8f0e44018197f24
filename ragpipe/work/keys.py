"""The semantic key of one item of a step: step name, step version, input digest.

The input digest covers everything that can change the value (model, prompt digest, parameters,
the text); the execution policy never enters it. Two items with one key are computed once.
"""

from __future__ import annotations

from typing import Any

from ragpipe.kernel.ids import content_id


def step_key(step: str, version: int, inputs: Any) -> str:
    """``sha256:…`` of (step, version, the canonical inputs) under the ``step-key`` domain."""
    return content_id("step-key", 1, {"step": step, "version": version, "inputs": inputs})
