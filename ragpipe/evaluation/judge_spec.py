"""The judge spec: which model labels answers, with which prompt and rubric, and its semantic ID.

A ``JudgeSpec`` is a ``ragpipe.evaluation.model_spec.ModelSpec`` (the litellm model — any model
the answer generator can use — its ``api_base``, the prompt's text and digest, the sampling
parameters, the derived ``endpoint`` identity and ``send_scopes``: the same model behind another
endpoint is another judge) plus the rubric version and the reply contract ``ragpipe.judge/v1``.

The spec ID is ``content_id("judge-spec", 1, body)`` where the body is every field but two: the
prompt enters by ``prompt_digest`` (never its path or its text twice), and ``timeout_seconds`` is
operational — a timeout is a failure, never a label, so it cannot change a verdict.

The file (``ragpipe/specs/judge.yaml``) is read strictly (``kernel/strict_load.py``): one line
``<file>: cannot read judge spec: …``, ``<file>:<line>: <rule>`` or ``<file>: invalid judge spec:
<field>: <rule>``. Its ``prompt`` is a path relative to the file; the prompt must define the four
labels of the locked rubric.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, model_validator

from ragpipe.evaluation.model_spec import ModelSpec, load_model_spec, model_spec
from ragpipe.kernel.ids import content_id
from ragpipe.work.disclosure import DisclosurePolicy

DEFAULT_JUDGE_SPEC = Path(__file__).resolve().parent.parent / "specs" / "judge.yaml"
JUDGE_CONTRACT = "ragpipe.judge/v1"
# The locked rubric: a verdict's label is one of these, in this order (its index is its score).
Label = Literal["0_FAIL", "1_PARTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE"]
LABELS: tuple[str, ...] = get_args(Label)


class JudgeSpecError(ValueError):
    """A judge spec file is refused; ``str(e)`` is one line naming the file and the rule."""


class JudgeSpec(ModelSpec):
    """The judge (module docstring). Built by ``load_judge_spec`` or ``judge_spec``."""

    spec_schema: Literal["ragpipe.judge_spec/v1"] = Field("ragpipe.judge_spec/v1", alias="schema")
    rubric_version: int = Field(ge=1)
    contract: Literal["ragpipe.judge/v1"] = JUDGE_CONTRACT

    @model_validator(mode="after")
    def _rubric(self) -> JudgeSpec:
        missing = [label for label in LABELS if label not in self.prompt_text]
        if missing:
            raise ValueError(f"prompt: the rubric must define every label {', '.join(LABELS)} (missing {missing[0]})")
        return self

    @property
    def spec_id(self) -> str:
        return content_id("judge-spec", 1, self.identity())


def judge_spec(data: Mapping, prompt_text: str, disclosure: DisclosurePolicy | None = None) -> JudgeSpec:
    """A spec from the fields a file writes (``prompt`` already read into ``prompt_text``), with
    the derived fields filled in. Raises ``ValidationError`` (or ``ValueError`` for a derived field
    written)."""
    return model_spec(JudgeSpec, data, prompt_text, disclosure)


def load_judge_spec(path: Path | None = None, disclosure: DisclosurePolicy | None = None) -> JudgeSpec:
    """The judge spec in ``path`` (default: the checked-in ``ragpipe/specs/judge.yaml``), its
    endpoint's send scopes from ``disclosure`` (default: the default policy). Refused with
    ``JudgeSpecError`` in one line (module docstring)."""
    path = Path(path or DEFAULT_JUDGE_SPEC)
    return load_model_spec(path, "judge spec", JudgeSpecError, lambda raw, text: judge_spec(raw, text, disclosure))
