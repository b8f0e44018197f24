"""What every evaluation model spec shares (the answer judge's, the case drafter's): the model, its
endpoint, the prompt by digest, the sampling parameters, and how a spec file is read.

A ``ModelSpec`` names the litellm model (``ragpipe.work.chat`` sends the request), its
``api_base`` (None: the provider's default), ``timeout_seconds`` (operational: a timeout is a
failure, never a result, so it is never in a spec ID), the prompt's text and digest, the sampling
parameters (``temperature``, ``max_tokens``, ``seed``) and two derived fields: the ``endpoint``
identity (``ragpipe.work.disclosure.endpoint_identity``: the same model behind another endpoint is
another spec) and ``send_scopes``, the scopes whose text the disclosure policy lets reach that
endpoint (``["*"]``: every scope). A spec read back from a record validates again: its digest must
match its text and its endpoint its model and ``api_base``.

``load_model_spec`` reads a spec file strictly (``kernel/strict_load.py``): one line
``<file>: cannot read <what>: …``, ``<file>:<line>: <rule>`` or ``<file>: invalid <what>:
<field>: <rule>``. Its ``prompt`` is a path relative to the file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator

from ragpipe.kernel.models import FrozenModel
from ragpipe.spec import content_digest_of, endpoint_base, read_error_text, read_yaml_file, validation_error_text
from ragpipe.work.disclosure import DisclosurePolicy, endpoint_identity

# Derived from the model, api_base, the prompt and the disclosure policy: a spec file never writes them.
DERIVED = ("endpoint", "send_scopes", "prompt_text", "prompt_digest")
S = TypeVar("S", bound="ModelSpec")


class ModelSpec(FrozenModel):
    """The shared fields and rules (module docstring); a subclass adds its schema, contract and
    the parameters of its task."""

    model: str = Field(min_length=1)
    api_base: str | None = None
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    prompt_text: str = Field(min_length=1, repr=False)
    prompt_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(1000, ge=1, le=32768)
    seed: int | None = 0
    endpoint: str
    send_scopes: tuple[str, ...]

    @field_validator("api_base")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return endpoint_base(value, "RAGPIPE_LLM_API_KEY")

    @model_validator(mode="after")
    def _derived(self):
        digest = content_digest_of(self.prompt_text)
        if self.prompt_digest != digest:
            raise ValueError(f"prompt_digest: does not match the prompt's text ({digest})")
        endpoint = endpoint_identity(self.model, self.api_base)
        if self.endpoint != endpoint:
            raise ValueError(f"endpoint: {self.endpoint!r} is not the identity of model and api_base ({endpoint!r})")
        return self

    def identity(self) -> dict:
        """What the spec ID covers: every field but the prompt's text (it enters by its digest)
        and ``timeout_seconds``."""
        return self.model_dump(mode="json", by_alias=True, exclude={"prompt_text", "timeout_seconds"})

    def record(self) -> dict:
        """The whole spec as JSON (prompt text included, no path): what a run folder keeps, so a
        verifier rebuilds every request from it."""
        return self.model_dump(mode="json", by_alias=True)

    def may_send(self, scopes: tuple[str, ...]) -> bool:
        """Whether text of a document with ``scopes`` may be sent to this spec's endpoint."""
        return "*" in self.send_scopes or any(s in self.send_scopes for s in scopes)


def model_spec(cls: type[S], data: Mapping, prompt_text: str, disclosure: DisclosurePolicy | None = None) -> S:
    """A ``cls`` spec from the fields a file writes (``prompt`` already read into
    ``prompt_text``), the derived fields filled in. Raises ``ValidationError`` (or ``ValueError``
    for a derived field written)."""
    written = [f for f in DERIVED if f in data]
    if written:
        raise ValueError(f"{written[0]}: derived from the model, api_base, prompt and disclosure; do not set it")
    disclosure = disclosure or DisclosurePolicy()
    model, api_base = data.get("model"), data.get("api_base")
    fields = {k: v for k, v in data.items() if k != "prompt"}
    fields["prompt_text"] = prompt_text
    fields["prompt_digest"] = content_digest_of(prompt_text)
    if isinstance(model, str) and isinstance(api_base, (str, type(None))):
        try:
            api_base = endpoint_base(api_base, "RAGPIPE_LLM_API_KEY")
        except ValueError:
            api_base = None  # refused below, by the field's own validation
        fields["endpoint"] = endpoint_identity(model, api_base)
        fields["send_scopes"] = disclosure.identity_part(fields["endpoint"])
    return cls.model_validate(fields)


def load_model_spec(
    path: Path,
    what: str,
    error: type[ValueError],
    build: Callable[[Mapping, str], S],
) -> S:
    """The spec in ``path``, built by ``build(fields, prompt_text)``; refused with ``error`` in
    one line naming ``what`` (module docstring)."""
    raw = read_yaml_file(path, what, error)
    if not isinstance(raw, Mapping):
        raise error(f"{path}: invalid {what}: (top): a mapping is required")
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise error(f"{path}: invalid {what}: prompt: a path to the prompt's text file is required")
    prompt_path = Path(prompt) if Path(prompt).is_absolute() else path.resolve().parent / prompt
    try:
        prompt_text = prompt_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: invalid {what}: prompt: cannot read {prompt_path}: {read_error_text(exc)}") from None
    try:
        return build(raw, prompt_text)
    except ValidationError as exc:
        # a rule over several fields (a rubric, a digest) names its field itself
        raise error(f"{path}: invalid {what}: {validation_error_text(exc).removeprefix('(top): ')}") from None
    except ValueError as exc:
        raise error(f"{path}: invalid {what}: {exc}") from None
