"""The judge spec: which model labels answers, with which prompt and rubric, and its semantic ID.

A ``JudgeSpec`` names the litellm model (any model the answer generator can use: the same adapter,
``ragpipe.work.chat``, sends the request), its ``api_base`` (None: the provider's default), the
prompt's text and digest, the rubric version, the sampling parameters (``temperature``,
``max_tokens``, ``seed``), the reply contract ``ragpipe.judge/v1`` and two derived fields: the
``endpoint`` identity (``ragpipe.work.disclosure.endpoint_identity``: the same model behind another
endpoint is another judge) and ``send_scopes``, the scopes whose evidence the disclosure policy
lets reach that endpoint (``["*"]``: every scope).

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

from pydantic import Field, ValidationError, field_validator, model_validator

from ragpipe.kernel.ids import content_id
from ragpipe.kernel.models import FrozenModel
from ragpipe.spec import content_digest_of, endpoint_base, read_error_text, read_yaml_file, validation_error_text
from ragpipe.work.disclosure import DisclosurePolicy, endpoint_identity

DEFAULT_JUDGE_SPEC = Path(__file__).resolve().parent.parent / "specs" / "judge.yaml"
JUDGE_CONTRACT = "ragpipe.judge/v1"
# The locked rubric: a verdict's label is one of these, in this order (its index is its score).
Label = Literal["0_FAIL", "1_PARTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE"]
LABELS: tuple[str, ...] = get_args(Label)
# Derived from the model, api_base and the disclosure policy: a spec file never writes them.
DERIVED = ("endpoint", "send_scopes", "prompt_text", "prompt_digest")


class JudgeSpecError(ValueError):
    """A judge spec file is refused; ``str(e)`` is one line naming the file and the rule."""


class JudgeSpec(FrozenModel):
    """The judge (module docstring). Built by ``load_judge_spec`` or ``judge_spec``; a spec read
    back from a record (``record()``) validates again: its digest must match its text and its
    endpoint its model and ``api_base``."""

    spec_schema: Literal["ragpipe.judge_spec/v1"] = Field("ragpipe.judge_spec/v1", alias="schema")
    model: str = Field(min_length=1)
    api_base: str | None = None
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    prompt_text: str = Field(min_length=1, repr=False)
    prompt_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    rubric_version: int = Field(ge=1)
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(1000, ge=1, le=32768)
    seed: int | None = 0
    contract: Literal["ragpipe.judge/v1"] = JUDGE_CONTRACT
    endpoint: str
    send_scopes: tuple[str, ...]

    @field_validator("api_base")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return endpoint_base(value, "RAGPIPE_LLM_API_KEY")

    @model_validator(mode="after")
    def _derived(self) -> JudgeSpec:
        digest = content_digest_of(self.prompt_text)
        if self.prompt_digest != digest:
            raise ValueError(f"prompt_digest: does not match the prompt's text ({digest})")
        endpoint = endpoint_identity(self.model, self.api_base)
        if self.endpoint != endpoint:
            raise ValueError(f"endpoint: {self.endpoint!r} is not the identity of model and api_base ({endpoint!r})")
        missing = [label for label in LABELS if label not in self.prompt_text]
        if missing:
            raise ValueError(f"prompt: the rubric must define every label {', '.join(LABELS)} (missing {missing[0]})")
        return self

    def identity(self) -> dict:
        """What the spec ID covers (module docstring)."""
        return self.model_dump(mode="json", by_alias=True, exclude={"prompt_text", "timeout_seconds"})

    @property
    def spec_id(self) -> str:
        return content_id("judge-spec", 1, self.identity())

    def record(self) -> dict:
        """The whole spec as JSON (prompt text included, no path): what a run folder keeps, so a
        verifier rebuilds every request from it."""
        return self.model_dump(mode="json", by_alias=True)

    def may_send(self, scopes: tuple[str, ...]) -> bool:
        """Whether evidence of a document with ``scopes`` may be sent to this judge's endpoint."""
        return "*" in self.send_scopes or any(s in self.send_scopes for s in scopes)


def judge_spec(data: Mapping, prompt_text: str, disclosure: DisclosurePolicy | None = None) -> JudgeSpec:
    """A spec from the fields a file writes (``prompt`` already read into ``prompt_text``), with
    the derived fields filled in. Raises ``ValidationError`` (or ``ValueError`` for a derived field
    written)."""
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
    return JudgeSpec.model_validate(fields)


def load_judge_spec(path: Path | None = None, disclosure: DisclosurePolicy | None = None) -> JudgeSpec:
    """The judge spec in ``path`` (default: the checked-in ``ragpipe/specs/judge.yaml``), its
    endpoint's send scopes from ``disclosure`` (default: the default policy). Refused with
    ``JudgeSpecError`` in one line (module docstring)."""
    path = Path(path or DEFAULT_JUDGE_SPEC)
    raw = read_yaml_file(path, "judge spec", JudgeSpecError)
    if not isinstance(raw, Mapping):
        raise JudgeSpecError(f"{path}: invalid judge spec: (top): a mapping is required")
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise JudgeSpecError(f"{path}: invalid judge spec: prompt: a path to the prompt's text file is required")
    prompt_path = Path(prompt) if Path(prompt).is_absolute() else path.resolve().parent / prompt
    try:
        prompt_text = prompt_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise JudgeSpecError(
            f"{path}: invalid judge spec: prompt: cannot read {prompt_path}: {read_error_text(exc)}"
        ) from None
    try:
        return judge_spec(raw, prompt_text, disclosure)
    except ValidationError as exc:
        # a rule over several fields (the rubric, a digest) names its field itself
        raise JudgeSpecError(
            f"{path}: invalid judge spec: {validation_error_text(exc).removeprefix('(top): ')}"
        ) from None
    except ValueError as exc:
        raise JudgeSpecError(f"{path}: invalid judge spec: {exc}") from None
