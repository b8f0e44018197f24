"""The case-draft spec: which model drafts evaluation cases from chunks, and its semantic ID.

A ``DraftSpec`` is a ``ragpipe.evaluation.model_spec.ModelSpec`` (model, ``api_base``, prompt by
digest, sampling parameters, the derived ``endpoint`` identity and ``send_scopes``) plus ``n``, the
questions asked per chunk (1–5), ``max_facts``, the most required facts a question may carry
(1–8), and the reply contract ``ragpipe.case-draft/v1`` (``ragpipe.evaluation.drafting``).

The spec ID is ``content_id("case-draft-spec", 1, body)``: every field but the prompt's text (it
enters by ``prompt_digest``, never by its path) and ``timeout_seconds`` (operational). A drafted
case names it as ``provenance.model_spec_id``.

The file (``ragpipe/specs/case_draft.yaml``) is read strictly, as every model spec is
(``model_spec.load_model_spec``): ``<file>: invalid case-draft spec: <field>: <rule>`` and the like,
one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field

from ragpipe.evaluation.model_spec import ModelSpec, load_model_spec, model_spec
from ragpipe.kernel.ids import content_id
from ragpipe.work.disclosure import DisclosurePolicy

DEFAULT_DRAFT_SPEC = Path(__file__).resolve().parent.parent / "specs" / "case_draft.yaml"
DRAFT_CONTRACT = "ragpipe.case-draft/v1"
MAX_QUESTIONS = 5
MAX_FACTS = 8


class DraftSpecError(ValueError):
    """A case-draft spec file is refused; ``str(e)`` is one line naming the file and the rule."""


class DraftSpec(ModelSpec):
    """The drafter (module docstring). Built by ``load_draft_spec`` or ``draft_spec``."""

    spec_schema: Literal["ragpipe.case_draft_spec/v1"] = Field("ragpipe.case_draft_spec/v1", alias="schema")
    n: int = Field(2, ge=1, le=MAX_QUESTIONS)
    max_facts: int = Field(3, ge=1, le=MAX_FACTS)
    contract: Literal["ragpipe.case-draft/v1"] = DRAFT_CONTRACT

    @property
    def spec_id(self) -> str:
        return content_id("case-draft-spec", 1, self.identity())


def draft_spec(data: Mapping, prompt_text: str, disclosure: DisclosurePolicy | None = None) -> DraftSpec:
    """A spec from the fields a file writes (``prompt`` already read into ``prompt_text``), the
    derived fields filled in. Raises ``ValidationError`` (or ``ValueError`` for a derived field)."""
    return model_spec(DraftSpec, data, prompt_text, disclosure)


def load_draft_spec(path: Path | None = None, disclosure: DisclosurePolicy | None = None) -> DraftSpec:
    """The spec in ``path`` (default: the checked-in ``ragpipe/specs/case_draft.yaml``), its
    endpoint's send scopes from ``disclosure`` (default: the default policy); ``DraftSpecError``
    in one line."""
    path = Path(path or DEFAULT_DRAFT_SPEC)
    return load_model_spec(path, "case-draft spec", DraftSpecError, lambda raw, text: draft_spec(raw, text, disclosure))
