"""Datasets, an approver and a disputed served answer for the review queue's tests, on the lab's home.

``add_review_state(lab_state, root, name)`` writes, beside the lab's home:

* a targets config whose ``production`` target lists one approver, ``rita`` (her PKCS#8 PEM key
  file written by ``kernel.signatures.new_key_file``, what ``ragpipe release approver-key`` writes);
* dataset ``name`` of target ``production`` with two provisional, model-drafted cases (``draft-a``:
  expected source ``guide/intro.md``; ``draft-b``: the staff-only runbook, whose text a public
  reviewer may not read) and one person-written case (``xss``) whose question holds a
  ``<script>`` element;
* once per home, a served answer on ``production`` with a ``disputed`` verdict, written by the
  server's own ``TraceLog``.

Each test module passes its own dataset name, so modules sharing the lab's home do not meet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ragpipe.evaluation.datasets import add_cases, create_dataset
from ragpipe.evaluation.suite import Case
from ragpipe.kernel.signatures import new_key_file
from ragpipe.server.tracing import FEEDBACK, TRACE, TraceLog, find_trace, log_path
from ragpipe_tests.support.lab_state import LabState
from ragpipe_tests.support.paths import REPO

TARGET = "production"
SPLITS = {"dev": 0.5, "holdout": 0.5}
SPEC = "sha256:" + "5" * 64
MODEL = {"author": "model", "by": "drafter-1", "model_spec_id": SPEC, "at": "2026-12-07T21:08:01Z"}
XSS_DRAFT = "<script>window.__xss_draft = 1</script> Who keeps the handbook honest?"
DISPUTED_TRACE = "0193a3f0-0000-7000-8000-00000000d15b"
RELEASE = "sha256:" + "7" * 64
DRAFTS = (
    Case(
        id="draft-a",
        query="What does the handbook say honest evaluation needs?",
        target_level="document",
        expected=("guide/intro.md",),
        required_facts=("hostile text is part of an honest evaluation",),
        stratum="intro",
        provenance=MODEL,
        review="provisional",
    ),
    Case(
        id="draft-b",
        query="How are the signing keys rotated?",
        target_level="document",
        expected=("guide/ops.md",),
        required_facts=("keys are rotated",),
        provenance=MODEL,
        review="provisional",
    ),
    Case(id="xss", query=XSS_DRAFT, target_level="document", judgments={"guide/intro.md": 1}),
)


@dataclass(frozen=True)
class ReviewState:
    home: Path
    dataset: str
    targets: Path
    key_file: Path  # rita's private key (PEM)
    public_key: str


def add_review_state(lab_state: LabState, root: Path, name: str) -> ReviewState:
    root.mkdir(parents=True, exist_ok=True)
    key_file = root / "rita.pem"
    public = new_key_file(key_file)
    targets = root / "targets.yaml"
    targets.write_text(
        f"schema: ragpipe.targets/v1\ndefault_target: {TARGET}\ntargets:\n  {TARGET}:\n"
        "    approval_required: true\n    auto_activate: false\n"
        f"    gate_policies: [{REPO / 'ragpipe/specs/gate_policy.yaml'}]\n"
        f'    approvers: {{rita: "{public}"}}\n',
        encoding="utf-8",
    )
    home = lab_state.home
    create_dataset(home, name, TARGET, SPLITS)
    add_cases(home, name, DRAFTS)
    if find_trace(home, TARGET, DISPUTED_TRACE) is None and not log_path(home, TARGET, RELEASE).exists():
        log = TraceLog(home)
        at = "2026-12-07T21:00:00.000000Z"
        log.append(
            TARGET,
            RELEASE,
            TRACE,
            {
                "trace_id": DISPUTED_TRACE,
                "at": at,
                "target": TARGET,
                "release_id": RELEASE,
                "certificate_id": "sha256:" + "c" * 64,
                "context_digest": "sha256:" + "d" * 64,
                "answer": "<b>Keys are never rotated.</b>",
                "abstained": False,
                "citations": [{"label": "E1", "chunk_id": "sha256:" + "e" * 64, "document_id": "guide/ops.md"}],
            },
        )
        log.append(
            TARGET,
            RELEASE,
            FEEDBACK,
            {
                "trace_id": DISPUTED_TRACE,
                "at": at,
                "verdict": "disputed",
                "note": "wrong",
                "key_id": "plain",
                "subject": "pat",
                "as_reviewer": False,
            },
        )
        log.close()
    return ReviewState(home, name, targets, key_file, public)
