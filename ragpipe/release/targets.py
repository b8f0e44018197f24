"""Release targets, declared in ``ragpipe/specs/targets.yaml`` (or ``$RAGPIPE_TARGETS``).

A target is a named place a release can be active in (``staging``, ``production``); each has one
pointer. ``approval_required`` makes activation (and the sensor) wait for an approval signed by one of the
target's ``approvers`` (name → Ed25519 public key; ``ragpipe.release.approvals``);
``auto_activate`` says whether the activation sensor may activate releases on it without a person
(off for ``production`` in the checked-in file); a gate policy that says ``human_apply_required``
(the default one does) still forbids that unless the target also states ``waive_human_apply: true``
— then each such activation records the waiver in the target's history. ``gate_policies`` lists the gate policies a release must have been
gated under to be activated there — policy files, relative to the targets file, or ``default``
(``ragpipe/specs/gate_policy.yaml``, also what a target without the key accepts): a release store
can hold decisions made under any policy, and the target, not the release, says which count.
Configuration is operational: it never enters a release ID.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from ragpipe.experiment.gate_policy import PolicyError, load_policy
from ragpipe.kernel.settings import current_settings
from ragpipe.kernel.signatures import PUBLIC_KEY, KeyFileError, load_key_file, public_key_text
from ragpipe.kernel.strict_load import StrictLoadError, load_yaml
from ragpipe.release.store import TARGET_NAME, ReleaseError
from ragpipe.spec import read_error_text, strict_yaml_error_text

DEFAULT_TARGETS_PATH = Path(__file__).resolve().parent.parent / "specs" / "targets.yaml"


APPROVER_NAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}\Z")


class TargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    approval_required: bool
    auto_activate: bool
    waive_human_apply: bool = False  # let auto_activate apply decisions that say human_apply_required
    description: str = ""
    gate_policies: tuple[str, ...] = Field(("default",), min_length=1)
    approvers: dict[str, str] = {}  # name -> Ed25519 public key (ragpipe release approver-key)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        if isinstance(data, dict) and "sensor" in data:
            raise ValueError("'sensor' is now called 'auto_activate' (with 'waive_human_apply', docs/releases.md)")
        return data

    @model_validator(mode="after")
    def _waiver(self) -> TargetSpec:
        if self.waive_human_apply and not self.auto_activate:
            raise ValueError("waive_human_apply: true needs auto_activate: true (only automatic activation waives it)")
        return self

    @model_validator(mode="after")
    def _approvers(self) -> TargetSpec:
        for name, key in self.approvers.items():
            if not APPROVER_NAME.match(name):
                raise ValueError(
                    f"approver name {name!r} must be 1-64 of a-z 0-9 . _ @ - (starting with a letter or digit)"
                )
            if not isinstance(key, str) or not PUBLIC_KEY.match(key):
                raise ValueError(f"approver {name!r}: public key must be ed25519:<44 base64 characters>")
        return self


class TargetsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: str = Field(alias="schema", pattern=r"^ragpipe\.targets/v1$")
    default_target: str
    targets: dict[str, TargetSpec] = Field(min_length=1)
    _source: Path = PrivateAttr(DEFAULT_TARGETS_PATH)

    @model_validator(mode="after")
    def _names(self) -> TargetsConfig:
        for name in self.targets:
            if not TARGET_NAME.match(name):
                raise ValueError(f"target name {name!r} must match [a-z][a-z0-9_-]{{0,62}}")
        if self.default_target not in self.targets:
            raise ValueError(
                f"default_target {self.default_target!r} is not one of the declared targets {sorted(self.targets)}"
            )
        return self

    def get(self, target: str | None) -> tuple[str, TargetSpec]:
        """``(name, spec)`` of ``target`` (the default target when None); unknown names refuse."""
        name = self.default_target if target is None else target
        if name not in self.targets:
            raise ReleaseError(f"unknown target {name!r}: declared targets are {', '.join(sorted(self.targets))}")
        return name, self.targets[name]

    def accepted_policies(self, target: str) -> dict[str, str]:
        """``{policy ID: where it was declared}`` of the gate policies ``target`` accepts."""
        accepted = {}
        for entry in self.targets[target].gate_policies:
            path = None if entry == "default" else self._source.parent / entry
            try:
                accepted[load_policy(path).policy_id] = entry
            except PolicyError as exc:
                raise ReleaseError(f"{self._source}: target {target!r}: gate policy {entry!r}: {exc}") from None
        return accepted


def targets_path(path: Path | None = None) -> Path:
    """The targets file in use: ``path``, else ``$RAGPIPE_TARGETS``, else the checked-in one."""
    return Path(path or current_settings().targets or DEFAULT_TARGETS_PATH)


def load_targets(path: Path | None = None) -> TargetsConfig:
    """Load targets from ``path``, ``$RAGPIPE_TARGETS`` or the checked-in default. Refused with
    ``ReleaseError``, one line: ``<file>: cannot read targets config: <OS error or YAML problem with
    its line>``, ``<file>:<line>: <rule>`` for a key given twice, nesting deeper than the bound or
    an alias (``kernel/strict_load.py``), or ``<file>: invalid targets config: <field path>:
    <rule>`` (joined with ``; ``)."""
    path = targets_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReleaseError(f"{path}: cannot read targets config: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ReleaseError(f"{path}: cannot read targets config: {read_error_text(exc)}") from None
    try:
        raw = load_yaml(text, str(path))
    except StrictLoadError as exc:
        raise ReleaseError(strict_yaml_error_text(exc, "targets config")) from None
    try:
        config = TargetsConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise ReleaseError(f"{path}: invalid targets config: {problems}") from None
    config._source = path
    return config


def approver_key(spec: TargetSpec, target: str, by: str, key_file: Path):
    """The private key in ``key_file`` of ``target``'s approver ``by`` (what approvals and time
    corrections sign with); ``ReleaseError`` when ``by`` is not an approver the target lists, the
    file cannot be read as a key, or it holds another key than the one listed."""
    declared = spec.approvers.get(by)
    if declared is None:
        listed = ", ".join(sorted(spec.approvers)) or "none"
        raise ReleaseError(f"{by!r} is not an approver of target {target!r} (approvers: {listed})")
    try:
        key = load_key_file(key_file)
    except KeyFileError as exc:
        raise ReleaseError(str(exc)) from None
    if public_key_text(key) != declared:
        raise ReleaseError(
            f"{key_file}: not the key of approver {by!r} of target {target!r} (the targets config lists another)"
        )
    return key
