"""The generated kinds in the pipeline spec: one-line errors, prompts by digest in records."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from ragpipe.spec import DEFAULT_SPEC_PATH, RECORDED, PipelineSpecError, RepresentationSpec, load_pipeline_spec

BASE = yaml.safe_load(DEFAULT_SPEC_PATH.read_text(encoding="utf-8"))


def spec_file(tmp_path, generated: dict, kinds=("raw", "questions")):
    data = {**BASE, "representations": {"kinds": list(kinds), "generated": generated}}
    data.pop("evaluation")
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("entry", "rule"),
    [
        ({"model": "m", "prompt": 5}, "representations: generated.questions.prompt: must be a path to a text file"),
        ({"model": "m", "prompt_text": ["x"]}, "representations: generated.questions.prompt_text: must be a string"),
        ({"model": "m", "prompt": "missing.txt"}, "representations: generated.questions.prompt: cannot read "),
        (
            {"model": "m", "prompt_digest": "sha256:" + "0" * 64},
            "representations.generated.questions.prompt: a spec file names its prompt file",
        ),
        (
            {"model": "m", "contract": "ragpipe.questions/v9"},
            "generated.questions.contract: must be 'ragpipe.questions/v1'",
        ),
    ],
)
def test_a_bad_generated_entry_is_one_line_naming_the_field(tmp_path, entry, rule):
    path = spec_file(tmp_path, {"questions": entry})
    with pytest.raises(PipelineSpecError) as caught:
        load_pipeline_spec(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: invalid pipeline spec: ") and rule in message and "\n" not in message


def test_a_listed_generated_kind_needs_its_configuration(tmp_path):
    with pytest.raises(PipelineSpecError) as caught:
        load_pipeline_spec(spec_file(tmp_path, {}, kinds=("raw", "summary")))
    assert "kinds: 'summary' is generated: configure it under representations.generated.summary" in str(caught.value)


def test_a_summary_is_one_text_by_default_and_only_one(tmp_path):
    spec = load_pipeline_spec(spec_file(tmp_path, {"summary": {"model": "m"}}, kinds=("raw", "summary")))
    assert spec.representations.generated["summary"].n == 1
    explicit = load_pipeline_spec(spec_file(tmp_path, {"summary": {"model": "m", "n": 1}}, kinds=("raw", "summary")))
    assert explicit.own_spec_ids["representations"] == spec.own_spec_ids["representations"]
    with pytest.raises(PipelineSpecError) as caught:
        load_pipeline_spec(spec_file(tmp_path, {"summary": {"model": "m", "n": 3}}, kinds=("raw", "summary")))
    assert str(caught.value).endswith("representations: generated.summary.n: a summary is one text (n: 1)")


def test_a_relative_prompt_is_read_next_to_the_spec_and_enters_the_id_by_digest(tmp_path):
    (tmp_path / "q.txt").write_text("Ask.\n", encoding="utf-8")
    spec = load_pipeline_spec(spec_file(tmp_path, {"questions": {"model": "m", "prompt": "q.txt"}}))
    entry = spec.representations.generated["questions"]
    assert entry.prompt_text == "Ask.\n" and entry.prompt == tmp_path / "q.txt"
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / "q.txt").write_text("Ask.\n", encoding="utf-8")
    again = load_pipeline_spec(spec_file(moved, {"questions": {"model": "m", "prompt": "q.txt"}}))
    assert again.spec_ids == spec.spec_ids  # the path is not identity, the text is


def test_a_recorded_spec_names_its_prompt_by_digest_only():
    digest = "sha256:" + "1" * 64
    recorded = {
        "kinds": ["raw", "questions"],
        "generated": {"questions": {"model": "m", "prompt_digest": digest, "contract": "ragpipe.questions/v1"}},
    }
    assert RepresentationSpec.model_validate(recorded, context=RECORDED).generated["questions"].prompt_text is None
    # a manifest naming a path would make a verifier read a file the manifest chose
    forged = {**recorded, "generated": {"questions": {**recorded["generated"]["questions"], "prompt": "/dev/zero"}}}
    with pytest.raises(ValidationError, match="a recorded spec carries prompt_digest only"):
        RepresentationSpec.model_validate(forged, context=RECORDED)
