"""``ragpipe tune``: walk a declared search space as a chain of one-mutation candidates.

The space (``tune_space.yaml``, schema ``ragpipe.tune_space/v1``) lists *dimensions* in order;
each dimension lists *options*, each option one or more ``--set`` edits of one asset. For each
dimension, every option becomes a candidate of the current parent and is run against it (the
parent's evaluation run is reused, never recomputed); among the options the gate finds
*eligible*, the one with the largest mean target delta is accepted and becomes the parent of
the next dimension. Nothing is accepted except through the gate. An option that cannot make a
candidate of the current parent (it changes nothing, or no longer fits the plan an earlier
acceptance chose) is recorded as ``skipped`` with the reason; any other error stops the walk.

Runs are labelled ``s-<12 hex of the snapshot ID>`` (not incumbent/challenger), so a run of an
accepted candidate can be the incumbent of the next step. Output, under ``out``: one candidate
folder per option (``NN-<dimension>-<option>``) and ``tune.json`` (``TuneResult.as_json``): each
step's candidate ID, edits, decision, decisive phase and target delta with its interval; the
chosen snapshot and its spec files; candidates run, builds, texts embedded and cache hits; the
builds' model calls of generated representations (``generation``: calls, cache hits, tokens,
micros, whether the cost is known; null when no build generated); wall time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from ragpipe.candidates.create import Parent, new_candidate, parent_from_candidate
from ragpipe.candidates.folder import PIPELINE, PLAN, CandidateError
from ragpipe.candidates.run import Build, run_candidate
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.models import FrozenModel
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.strict_load import StrictLoadError, load_yaml
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import strict_yaml_error_text

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}\Z")


class TuneError(ValueError):
    """The space or the walk is refused; the message names the file, dimension or option."""


class Dimension(FrozenModel):
    name: str
    options: tuple[tuple[str, ...], ...] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError(f"dimension name {value!r} must match {NAME.pattern}")
        return value

    @field_validator("options", mode="before")
    @classmethod
    def _one_set_is_a_list(cls, value: Any) -> Any:
        return [[o] if isinstance(o, str) else o for o in value] if isinstance(value, list) else value


class TuneSpace(FrozenModel):
    space_schema: Literal["ragpipe.tune_space/v1"] = Field("ragpipe.tune_space/v1", alias="schema")
    dimensions: tuple[Dimension, ...] = Field(min_length=1)

    @property
    def space_id(self) -> str:
        return content_id("tune-space", 1, self.model_dump(mode="json", by_alias=True))


def load_space(path: Path) -> TuneSpace:
    """The space file, or ``TuneError`` naming it and the first rule broken."""
    try:
        raw = load_yaml(Path(path).read_text(encoding="utf-8"), str(path))
    except StrictLoadError as exc:
        raise TuneError(strict_yaml_error_text(exc, "the tune space")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TuneError(f"{path}: cannot read the tune space: {exc}") from None
    try:
        space = TuneSpace.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise TuneError(f"{path}: invalid tune space: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    names = [d.name for d in space.dimensions]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise TuneError(f"{path}: invalid tune space: dimension {dup!r} is declared twice")
    return space


def label(snapshot_id: str) -> str:
    return "s-" + snapshot_id.split(":", 1)[1][:12]


@dataclass
class TuneResult:
    space_id: str
    parent_revision: str
    root_snapshot_id: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    chosen: dict[str, Any] = field(default_factory=dict)
    builds: int = 0
    embedded: int = 0
    cache_hits: int = 0
    generation: dict[str, Any] = field(default_factory=dict)  # summed over builds (``add_generation``)
    seconds: float = 0.0

    def add_generation(self, g: dict[str, Any] | None) -> None:
        """Sum one build's model calls; the total cost is known only if every build's was."""
        if g is None:
            return
        total = self.generation or {"calls": 0, "cache_hits": 0, "input_tokens": 0, "output_tokens": 0}
        total = {k: total[k] + int(g[k]) for k in ("calls", "cache_hits", "input_tokens", "output_tokens")} | {
            "cost_micros": self.generation.get("cost_micros", 0) + int(g["cost_micros"]),
            "cost_known": self.generation.get("cost_known", True) and bool(g["cost_known"]),
        }
        self.generation = total

    def as_json(self) -> dict[str, Any]:
        run = [s for s in self.steps if s["status"] == "evaluated"]
        return {
            "schema": "ragpipe.tune_result/v1",
            "space_id": self.space_id,
            "parent_revision": self.parent_revision,
            "root_snapshot_id": self.root_snapshot_id,
            "candidates": len(run),
            "accepted": sum(s["accepted"] for s in run),
            "steps": self.steps,
            "chosen": self.chosen,
            "embedding": {"builds": self.builds, "embedded": self.embedded, "cache_hits": self.cache_hits},
            "generation": self.generation or None,
            "seconds": round(self.seconds, 3),
        }


Report = Callable[[dict[str, Any]], None]


def tune(
    ws: Workspace, parent: Parent, space: TuneSpace, out: Path, build: Build, on_step: Report | None = None
) -> TuneResult:
    """Walk ``space`` from ``parent`` (module docstring); writes ``out/tune.json`` last."""
    start = time.monotonic()
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise TuneError(f"{out}: already exists (a tune folder is created once)")
    out.mkdir(parents=True)
    result = TuneResult(space.space_id, parent.snapshot.revision, parent.snapshot.snapshot_id)
    incumbent_run: Path | None = None
    chosen_folder: Path | None = None
    for d_index, dim in enumerate(space.dimensions, start=1):
        best = None
        for o_index, sets in enumerate(dim.options, start=1):
            step = {"dimension": dim.name, "option": o_index, "edits": list(sets), "accepted": False}
            try:
                candidate = new_candidate(parent, list(sets), out / f"{d_index:02d}-{dim.name}-{o_index}")
            except CandidateError as exc:
                step.update(status="skipped", reason=str(exc))
                result.steps.append(step)
                if on_step:
                    on_step(step)
                continue
            run = run_candidate(
                ws,
                candidate,
                build,
                incumbent_run=incumbent_run,
                labels=(label(parent.snapshot.snapshot_id), label(candidate.snapshot.snapshot_id)),
            )
            if incumbent_run is None:
                incumbent_run = run.incumbent_run
            if run.build is not None:
                result.builds += 1
                result.embedded += run.build.embedded
                result.cache_hits += run.build.cache_hits
                result.add_generation(run.build.generation)
            summary = run.as_json()
            step.update(
                status="evaluated",
                candidate_id=candidate.candidate_id,
                asset=candidate.asset,
                folder=str(candidate.folder),
                eligible=summary["eligible"],
                decisive_phase=summary["decisive_phase"],
                target=summary["target"],
                reasons=summary["reasons"],
                seconds=summary["seconds"],
            )
            result.steps.append(step)
            if run.decision.eligible and (best is None or run.target["mean"] > best[1].target["mean"]):
                best = (step, run, candidate)
            if on_step:
                on_step(step)
        if best is not None:
            step, run, candidate = best
            step["accepted"] = True
            parent, incumbent_run, chosen_folder = (
                parent_from_candidate(candidate),
                run.challenger_run,
                candidate.folder,
            )
            if on_step:
                on_step({"accepted": step["candidate_id"], "dimension": dim.name, "edits": step["edits"]})
    result.chosen = {
        "snapshot_id": parent.snapshot.snapshot_id,
        "revision": parent.snapshot.revision,
        "candidate": None if chosen_folder is None else str(chosen_folder),
        "edits": [e for s in result.steps if s["accepted"] for e in s["edits"]],
    }
    (out / "chosen").mkdir()
    (out / "chosen" / PLAN).write_bytes(parent.plan_bytes)
    (out / "chosen" / PIPELINE).write_bytes(parent.pipeline_bytes)
    result.chosen.update(query_plan=str(out / "chosen" / PLAN), pipeline=str(out / "chosen" / PIPELINE))
    result.seconds = time.monotonic() - start
    write_file_atomic(
        out / "tune.json",
        (json.dumps(result.as_json(), indent=2, sort_keys=True) + "\n").encode("utf-8"),
        replace=False,
    )
    return result
