"""A handbook revision whose representations include generated questions, against the local server."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ragpipe.corpus.registry import register_revision
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import PipelineSpec, load_pipeline_spec
from ragpipe.stages import steps
from ragpipe_tests.support.llm_server import LLMServer

EARLY = [steps.run_source_snapshot, steps.run_chunks, steps.run_representations]
MODEL = "openai/gpt-4o-mini"


def questions_for(request: dict) -> str:
    """Two deterministic questions about the passage a request carries (its user message)."""
    text = request["messages"][-1]["content"]
    words = sorted({w.lower() for w in re.findall(r"[A-Za-z]{4,}", text)}) or ["nothing", "else"]
    picked = [words[0], words[-1]] if len(words) > 1 else [words[0], words[0] + "s"]
    return json.dumps({"questions": [f"What does it say about {w}?" for w in picked]})


def generated_spec(server: LLMServer | str, disclosure: dict | None = None, **execution) -> PipelineSpec:
    """The default spec with ``[raw, questions]`` asked of ``server`` (or the API base given),
    under ``disclosure`` (default: the spec's)."""
    api_base = server if isinstance(server, str) else server.api_base
    data = load_pipeline_spec().model_dump(by_alias=True)
    data["representations"] = {
        "kinds": ["raw", "questions"],
        "generated": {"questions": {"model": MODEL, "n": 2, "max_chars": 200}},
    }
    data["execution"]["generation"] = {
        "api_base": api_base,
        "backoff_seconds": 0,
        "timeout_seconds": 5,
    } | execution
    if disclosure is not None:
        data["disclosure"] = disclosure
    return PipelineSpec.model_validate(data)


def serving(server: LLMServer) -> LLMServer:
    server.scenario = "responder"
    server.responder = questions_for
    return server


def early_build(home: Path, corpus: Path, spec: PipelineSpec, revision: str = "hb") -> Workspace:
    ws = Workspace(home)
    register_revision(ws.registry, revision, corpus, "markdown", "public")
    for run in EARLY:
        run(ws, revision, spec)
    return ws


def expected_cost(server: LLMServer) -> int:
    """Hand-computed: per call ceil((prompt words × 150,000 + reply words × 600,000) / 10^6)."""
    total = 0
    for request in server.requests:
        prompt = sum(len(m["content"].split()) for m in request["messages"])
        reply = len(questions_for(request).split())
        total += -(-(prompt * 150_000 + reply * 600_000) // 1_000_000)
    return total
