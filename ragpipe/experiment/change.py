"""What kind of change a challenger is, computed from identities (docs/gates.md).

A release's results depend on its corpus revision and on its *basis*: the spec ID of every stage
its bundle was built with, the bundle's default scope, and the query plan, answer plan and
authorization policy it serves under (``ChangeBasis``). Against an incumbent:

* **refresh** — the bases are equal: only the corpus revision differs (new, edited or deleted
  documents). A refresh must not be worse (non-inferiority).
* **experiment** — any part of the basis differs (with or without new content); ``differs``
  names each part, in the basis's field order. An experiment must improve.
* **bootstrap** — there is no incumbent; the policy's absolute floors decide.

The kind is never declared by a caller: ``classify`` derives it from the two bases, and whoever
checks a decision derives it again from the releases it names.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from ragpipe.kernel.models import FrozenModel

ChangeKind = Literal["bootstrap", "refresh", "experiment"]


class ChangeBasis(FrozenModel):
    """Every semantic input of a release except its corpus revision (module docstring)."""

    stage_specs: dict[str, str]  # stage -> own spec ID, as the bundle's manifest records them
    default_scope: str | None
    query_plan_id: str
    answer_plan_id: str
    authorization_policy_id: str


class Change(FrozenModel):
    """The kind of a challenger against ``incumbent_release`` (None: bootstrap) and, for an
    experiment, which parts of the basis differ (``stage_specs.chunks``, ``query_plan_id`` …)."""

    kind: ChangeKind
    incumbent_release: str | None
    differs: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> Change:
        if self.kind == "bootstrap" and (self.incumbent_release is not None or self.differs):
            raise ValueError("a bootstrap has no incumbent release and nothing that differs")
        if self.kind != "bootstrap" and self.incumbent_release is None:
            raise ValueError(f"a {self.kind} names the incumbent release it was made against")
        if self.kind == "refresh" and self.differs:
            raise ValueError("a refresh differs from its incumbent in nothing but the corpus")
        if self.kind == "experiment" and not self.differs:
            raise ValueError("an experiment names what differs from its incumbent")
        return self


def basis_differences(challenger: ChangeBasis, incumbent: ChangeBasis) -> tuple[str, ...]:
    """The parts of the basis that differ, in field order; a stage present on one side only (a
    vector index added or dropped) differs too."""
    out: list[str] = []
    for name in ChangeBasis.model_fields:
        a, b = getattr(challenger, name), getattr(incumbent, name)
        if name == "stage_specs":
            out += [f"stage_specs.{s}" for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)]
        elif a != b:
            out.append(name)
    return tuple(out)


def classify(challenger: ChangeBasis, incumbent: ChangeBasis | None, incumbent_release: str | None) -> Change:
    """The change a challenger with basis ``challenger`` is against the release
    ``incumbent_release`` with basis ``incumbent`` (both None: bootstrap)."""
    if (incumbent is None) != (incumbent_release is None):
        raise ValueError("an incumbent release and its basis go together")
    if incumbent is None:
        return Change(kind="bootstrap", incumbent_release=None)
    differs = basis_differences(challenger, incumbent)
    return Change(kind="experiment" if differs else "refresh", incumbent_release=incumbent_release, differs=differs)


def change_text(change: Change | None, *, short: bool = False) -> str:
    """One line for a person: ``refresh against sha256:…``, ``experiment (stage_specs.chunks
    differs) against …``, ``bootstrap (no incumbent)``; ``unknown (…)`` for a decision made before
    decisions recorded it. ``short``: the release ID cut to 12 hex digits (a unique prefix)."""
    if change is None:
        return "unknown (the decision predates change kinds)"
    if change.kind == "bootstrap":
        return "bootstrap (no incumbent)"
    what = f" ({', '.join(change.differs)} differ{'s' if len(change.differs) == 1 else ''})" if change.differs else ""
    against = str(change.incumbent_release)
    return f"{change.kind}{what} against {against[:19] + '…' if short else against}"
