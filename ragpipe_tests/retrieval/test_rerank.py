"""The optional reranker: validation of its output, failure policy, source authority."""

from __future__ import annotations

import pytest

from ragpipe.kernel.ids import bytes_digest, content_id
from ragpipe.retrieval.plan import PlanError, RerankerPlan, load_plan, parse_plan
from ragpipe.retrieval.rerank import (
    CrossEncoderReranker,
    RerankCandidate,
    RerankerError,
    RerankerModelError,
    checked_order,
    model_digest,
)
from ragpipe.retrieval.retriever import Retriever

CANDS = [RerankCandidate("c1", "one"), RerankCandidate("c2", "two"), RerankCandidate("c3", "three")]


def test_checked_order_sorts_by_score_with_stable_ties():
    assert checked_order(CANDS, [("c1", 0.1), ("c2", 0.9), ("c3", 0.1)]) == ["c2", "c1", "c3"]


@pytest.mark.parametrize(
    ("scored", "message"),
    [
        ([("c1", 1), ("c2", 1), ("c9", 1)], "reranker returned unknown chunk ID 'c9'"),
        ([("c1", 1), ("c1", 2), ("c3", 1)], "reranker returned chunk ID 'c1' twice"),
        ([("c1", 1), ("c2", float("nan")), ("c3", 1)], "non-finite score nan for 'c2'"),
        ([("c1", 1), ("c2", 1)], "reranker dropped 1 candidate(s)"),
    ],
)
def test_invalid_reranker_output_is_rejected(scored, message):
    with pytest.raises(RerankerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checked_order(CANDS, scored)


class Reversing:
    name = "reversing"

    def rerank(self, query, candidates):
        return [(c.chunk_id, float(i)) for i, c in enumerate(candidates)]


class Hostile:
    """Returns an unknown ID (candidates are frozen: it cannot alter their text)."""

    name = "hostile"

    def rerank(self, query, candidates):
        with pytest.raises(AttributeError):
            candidates[0].text = "ALTERED TEXT"
        return [("sha256:" + "f" * 64, 9.0)] + [(c.chunk_id, 1.0) for c in candidates]


def plan_with(on_failure: str):
    return load_plan().model_copy(
        update={
            "reranker": RerankerPlan(
                model_path="unused", model_digest="sha256:" + "0" * 64, depth=5, on_failure=on_failure
            )
        }
    )


def test_reranker_reorders_but_text_stays_the_bundle_text(scoped_bundles):
    base = Retriever(scoped_bundles[0])
    fused = base.query("aspirin stroke", k=5).hits
    r = Retriever(scoped_bundles[0], plan=plan_with("fail"), reranker=Reversing(), embedder=base.embedder())
    result = r.query("aspirin stroke", k=5, trace=True)
    assert [h["chunk_id"] for h in result.hits] == [h["chunk_id"] for h in reversed(fused)]
    for h in result.hits:
        assert h["text"] == r.chunks[h["chunk_id"]].text
    assert result.trace["reranker"]["name"] == "reversing"


def test_reranker_failure_policy(scoped_bundles):
    base = Retriever(scoped_bundles[0])
    fused = [h["chunk_id"] for h in base.query("aspirin stroke", k=5).hits]
    keep = Retriever(scoped_bundles[0], plan=plan_with("keep_fused"), reranker=Hostile(), embedder=base.embedder())
    result = keep.query("aspirin stroke", k=5, trace=True)
    assert [h["chunk_id"] for h in result.hits] == fused
    assert result.trace["reranker"]["applied_policy"] == "keep_fused"
    assert "unknown chunk ID" in result.trace["reranker"]["failed"]
    strict = Retriever(scoped_bundles[0], plan=plan_with("fail"), reranker=Hostile(), embedder=base.embedder())
    with pytest.raises(RerankerError, match="reranker hostile failed: reranker returned unknown chunk ID"):
        strict.query("aspirin stroke", k=5)


def test_cross_encoder_adapter_with_a_local_model(tmp_path, scoped_bundles):
    """A tiny cross-encoder made here (seeded random weights, MiniLM's tokenizer): the adapter
    loads a local folder, scores pairs deterministically, and the pipeline applies the order."""
    import shutil

    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from ragpipe.embedding.embedder import model_directory
    from ragpipe.spec import load_pipeline_spec

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            num_labels=1,
        )
    )
    model.save_pretrained(tmp_path / "ce")
    src = model_directory(load_pipeline_spec().embedder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(src / name, tmp_path / "ce" / name)
    digest = model_digest(tmp_path / "ce")
    reranker = CrossEncoderReranker(str(tmp_path / "ce"), digest)
    scores = reranker.rerank("aspirin", CANDS)
    assert [c for c, _ in scores] == ["c1", "c2", "c3"]
    assert scores == CrossEncoderReranker(str(tmp_path / "ce"), digest).rerank("aspirin", CANDS)
    base = Retriever(scoped_bundles[0])
    plan = load_plan().model_copy(
        update={
            "reranker": RerankerPlan(model_path=str(tmp_path / "ce"), model_digest=digest, depth=5, on_failure="fail")
        }
    )
    r = Retriever(scoped_bundles[0], plan=plan, embedder=base.embedder())  # the plan's model, checked, loaded
    result = r.query("aspirin stroke", k=5, trace=True)
    assert result.trace["reranker"]["order"][: len(result.hits)] == [h["chunk_id"] for h in result.hits]


class Overlapping:
    """Reverses the candidates, recording the most calls it ever saw in flight at once."""

    name = "overlapping"

    def __init__(self, thread_safe: bool):
        import threading

        self.thread_safe = thread_safe
        self._arrived = threading.Condition()
        self.active = self.most = self.calls = 0

    def rerank(self, query, candidates):
        with self._arrived:
            self.active += 1
            self.calls += 1
            self.most = max(self.most, self.active)
            self._arrived.notify_all()
            if self.calls == 1:
                # the first call waits for a second one to arrive (a condition, not a delay): it
                # arrives at once unless the Retriever serialises calls, then the wait times out once
                self._arrived.wait_for(lambda: self.active > 1, timeout=2)
            self.active -= 1
        return [(c.chunk_id, float(i)) for i, c in enumerate(candidates)]


@pytest.mark.parametrize("thread_safe", [False, True])
def test_a_reranker_not_declared_thread_safe_is_never_called_concurrently(scoped_bundles, thread_safe):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    base = Retriever(scoped_bundles[0])
    reranker = Overlapping(thread_safe)
    r = Retriever(scoped_bundles[0], plan=plan_with("fail"), reranker=reranker, embedder=base.embedder())
    expected = [h["chunk_id"] for h in r.query("aspirin stroke", k=5, mode="lexical").hits]
    reranker.calls = 0  # the first concurrent call, not the reference query, waits for a second
    barrier = threading.Barrier(8)

    def run(_):
        barrier.wait()
        return [[h["chunk_id"] for h in r.query("aspirin stroke", k=5, mode="lexical").hits] for _ in range(5)]

    with ThreadPoolExecutor(8) as pool:
        results = [hits for batch in pool.map(run, range(8)) for hits in batch]
    assert results == [expected] * 40
    if thread_safe:
        assert reranker.most > 1  # declared safe: calls overlap
    else:
        assert reranker.most == 1
    r.close()
    base.close()


def test_the_plan_binds_the_reranker_model_by_content(tmp_path):
    """A model folder is identified by every file's path and bytes; a folder that differs from the
    plan's digest is refused before anything loads, naming both digests."""
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "sub" / "tokenizer.json").write_bytes(b"{}")
    digest = model_digest(folder)
    assert digest == content_id(
        "reranker-model",
        1,
        [["model.safetensors", bytes_digest(b"weights")], ["sub/tokenizer.json", bytes_digest(b"{}")]],
    )
    (folder / "sub" / "tokenizer.json").write_bytes(b"{ }")
    changed = model_digest(folder)
    assert changed != digest
    with pytest.raises(RerankerModelError, match=f"its digest is {changed}, the query plan's model_digest is {digest}"):
        CrossEncoderReranker(str(folder), digest)
    plan = plan_with("fail")
    other = plan.model_copy(update={"reranker": plan.reranker.model_copy(update={"model_digest": changed})})
    assert plan.plan_id != other.plan_id  # same path string, other weights: another plan
    with pytest.raises(PlanError, match=r"reranker\.model_digest"):
        parse_plan({**plan.model_dump(mode="json", by_alias=True), "reranker": {"model_path": "x"}}, "p.yaml")
