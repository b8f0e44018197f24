"""A home for the lab's tests and benchmark: two revisions of a small handbook built through every
stage, three completed evaluation runs (with answers, extractive generator), and serve keys.

* revision ``lab`` — the handbook plus ``guide/xss.md``, whose title and text hold ``<script>``
  elements (they must render as text); bundle A;
* revision ``lab-plain`` — the handbook alone (another corpus digest); bundle B;
* runs ``a1`` and ``a2`` of bundle A and ``b1`` of bundle B, each over the same four cases (one
  query holding a ``<script>`` element; one judging the hostile document, which b1 skips) under
  the scopes public and staff, so the staff-only runbook is among the evidence a public reviewer
  may not read;
* keys: ``rev-public`` (reviewer, scope public), ``rev-staff`` (reviewer, public and staff),
  ``plain`` (scope public, no role).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ragpipe.evaluation.suite import Case
from ragpipe.server.config import KeyEntry, ServeConfig
from ragpipe.server.keys import new_key
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.release_fixtures import new_evaluation_run

XSS_TITLE = "<script>window.__xss_title = 1</script> Hostile title"
XSS_TEXT = "<script>window.__xss_text = 1</script> An honest evaluation of retrieval needs hostile text too."
XSS_QUERY = "<script>window.__xss_query = 1</script> honest evaluation"
XSS_DOC = {"guide/xss.md": f'---\ntitle: "{XSS_TITLE}"\n---\n# Hostile\n\n{XSS_TEXT}\n'}
CASES = (
    Case(id="goals", query="honest evaluation", target_level="document", judgments={"guide/intro.md": 1}),
    Case(id="keys", query="rotate the signing keys", target_level="document", judgments={"guide/ops.md": 1}),
    Case(id="xss", query=XSS_QUERY, target_level="document", judgments={"guide/intro.md": 1}),
    # judges the hostile document, which only revision lab has: run b1 skips it (lost coverage)
    Case(id="hostile", query="hostile text", target_level="document", judgments={"guide/xss.md": 1}),
)
SCOPES = ("public", "staff")
STAFF_DOCUMENT = "guide/ops.md"


@dataclass(frozen=True)
class LabState:
    home: Path
    runs: dict[str, str]  # a1, a2, b1 -> run ID
    bundles: dict[str, Path]  # A, B -> bundle folder
    keys: dict[str, str]  # key ID -> key
    entries: tuple[KeyEntry, ...]

    def config(self, **changes) -> ServeConfig:
        return ServeConfig.model_validate({"keys": self.entries, "poll_interval_s": 0.5, **changes})


def build_lab_state(root: Path) -> LabState:
    """Build the home under ``root`` (module docstring); about a build and a half of the handbook."""
    home = root / "home"
    _, _, bundle_a = build_all_stages(home, "lab", write_tree(root / "lab", {**HANDBOOK, **XSS_DOC}), "markdown")
    _, _, bundle_b = build_all_stages(home, "lab-plain", write_tree(root / "lab-plain", HANDBOOK), "markdown")
    evaluations = home / "evaluations"
    runs = {
        name: new_evaluation_run(bundle, evaluations, cases=CASES, scopes=SCOPES, answers=True)
        for name, bundle in (("a1", bundle_a), ("a2", bundle_a), ("b1", bundle_b))
    }
    made = {key_id: new_key(key_id) for key_id in ("rev-public", "rev-staff", "plain")}
    entries = (
        KeyEntry(id="rev-public", hash=made["rev-public"][1], subject="rita", scopes=("public",), roles=("reviewer",)),
        KeyEntry(id="rev-staff", hash=made["rev-staff"][1], subject="sam", scopes=SCOPES, roles=("reviewer",)),
        KeyEntry(id="plain", hash=made["plain"][1], subject="pat", scopes=("public",)),
    )
    return LabState(home, runs, {"A": bundle_a, "B": bundle_b}, {k: v[0] for k, v in made.items()}, entries)
