"""`ragpipe dataset …` as a user runs it: create, add, decide with signed records, freeze, export, eval."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ragpipe.evaluation.suite import Case, Suite, write_suite
from ragpipe.evaluation.suite_load import load_suite
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.paths import REPO


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A fresh home and a targets config whose ``production`` target lists one approver, rita."""
    rita = tmp_path / "rita.pem"
    made = run_cli("release", "approver-key", "rita", "--out", str(rita), timeout=120)
    public = made.stdout.split('rita: "')[1].split('"')[0]
    targets = tmp_path / "targets.yaml"
    targets.write_text(
        "schema: ragpipe.targets/v1\ndefault_target: production\ntargets:\n  production:\n"
        "    approval_required: true\n    auto_activate: false\n"
        f"    gate_policies: [{REPO / 'ragpipe/specs/gate_policy.yaml'}]\n"
        f'    approvers: {{rita: "{public}"}}\n',
        encoding="utf-8",
    )
    return {**os.environ, "RAGPIPE_HOME": str(tmp_path / "home"), "RAGPIPE_TARGETS": str(targets), "COLUMNS": "200"}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return run_cli("dataset", *args, env=env, timeout=300)


def ok(env, *args: str):
    proc = run(env, *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if "--json" in args else proc.stdout


def refused(env, *args: str) -> str:
    proc = run(env, *args)
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout
    return proc.stderr


def test_from_drafts_to_an_exported_suite(env, tmp_path: Path):
    key = str(tmp_path / "rita.pem")
    drafts = tmp_path / "drafts.jsonl"
    write_suite(
        Suite.of(
            [
                Case(id="c1", query="Does aspirin lower stroke risk?", target_level="document", judgments={"d1": 1}),
                Case(id="c2", query="What causes scurvy?", target_level="document", judgments={"d2": 1}),
                Case(id="c3", query="Is smoking linked to cancer?", target_level="document", judgments={"d3": 1}),
            ],
            "drafts",
        ),
        drafts,
    )
    created = ok(
        env, "create", "claims", "--target", "production", "--split", "dev=0.5", "--split", "holdout=0.5", "--json"
    )
    assert created == {"dataset": "claims", "target": "production", "splits": {"dev": 0.5, "holdout": 0.5}}
    assert ok(env, "add", "claims", str(drafts), "--json") == {"dataset": "claims", "added": 3}
    accepted = ok(env, "adjudicate", "claims", "c1", "--accept", "--by", "rita", "--key", key, "--json")
    assert {k: accepted[k] for k in ("case_id", "decision", "by", "record")} == {
        "case_id": "c1",
        "decision": "accept",
        "by": "rita",
        "record": 3,
    }
    edit = ok(env, "adjudicate", "claims", "c2", "--edit", 'tags=["nutrition"]', "--by", "rita", "--key", key)
    assert edit == "edit c2 by rita (record 4)\n"
    ok(env, "adjudicate", "claims", "c3", "--reject", "--by", "rita", "--key", key, "--note", "vague")
    shown = ok(env, "show", "claims", "--json")
    assert shown["counts"] == {"pending": 0, "accepted": 2, "rejected": 1, "unverified": 0}
    frozen = ok(env, "freeze", "claims", "--json")
    assert (frozen["version"], frozen["cases"], sum(frozen["splits"].values())) == (1, 2, 2)
    suite_file = tmp_path / "all.jsonl"
    exported = ok(env, "export", "claims@1", "--out", str(suite_file), "--json")
    suite = load_suite(suite_file)
    assert exported["suite_digest"] == suite.digest and [c.id for c in suite.cases] == ["c1", "c2"]
    assert suite.by_id()["c2"].tags == ("nutrition",)
    splits = {c.id: c.split for c in suite.cases}
    for split in sorted(frozen["splits"]):
        part = load_suite(
            Path(ok(env, "export", f"claims:{split}", "--out", str(tmp_path / f"{split}.jsonl"), "--json")["out"])
        )
        assert all(splits[c.id] == (split,) for c in part.cases)
    audit = ok(env, "audit", "claims", "--json")
    assert (audit["cases"], audit["leakage"]) == (2, [])


def test_each_mistake_is_one_line(env, tmp_path: Path):
    key = str(tmp_path / "rita.pem")
    assert refused(env, "show", "claims").startswith("error: ") and "no dataset 'claims'" in refused(
        env, "show", "claims"
    )
    assert refused(env, "create", "claims", "--target", "nowhere", "--split", "all=1").count("\n") == 1
    assert refused(env, "create", "claims", "--target", "production", "--split", "dev") == (
        "error: --split 'dev': NAME=FRACTION, each name once (e.g. --split dev=0.5)\n"
    )
    ok(env, "create", "claims", "--target", "production", "--split", "all=1")
    assert refused(env, "freeze", "claims") == "error: dataset 'claims': no accepted case to freeze\n"
    assert refused(env, "adjudicate", "claims", "c1", "--by", "rita", "--key", key) == (
        "error: give exactly one of --accept, --reject, --edit FIELD=JSON\n"
    )
    assert refused(env, "adjudicate", "claims", "c1", "--accept", "--by", "bob", "--key", key) == (
        "error: 'bob' is not an approver of target 'production' (approvers: rita)\n"
    )
    assert refused(env, "export", "claims@x", "--out", str(tmp_path / "x.jsonl")) == (
        "error: dataset reference 'claims@x': NAME[@VERSION][:SPLIT], e.g. claims@2:holdout\n"
    )


@pytest.mark.parametrize(
    ("damage", "rule"),
    [
        (lambda data: data + b"[" * 100_000 + b"]" * 100_000 + b"\n", "record 2: not valid JSON (nested too deeply)"),
        (lambda data: data.replace(b'"target":"production"', b'"target":7'), "record 1: hash does not match"),
        # the only line unreadable is a torn first write to the ledger's rules: no record survives
        (lambda data: b"\xff\xfe" + data, "the dataset has no records"),
    ],
)
def test_a_damaged_ledger_is_one_line_from_every_command(env, tmp_path: Path, damage, rule: str):
    ok(env, "create", "claims", "--target", "production", "--split", "all=1")
    ledger = Path(env["RAGPIPE_HOME"]) / "datasets" / "claims" / "ledger.jsonl"
    ledger.write_bytes(damage(ledger.read_bytes()))
    for args in (("show", "claims"), ("audit", "claims"), ("freeze", "claims")):
        message = refused(env, *args)
        assert message.startswith(f"error: {ledger}: {rule}") and message.count("\n") == 1, message


def test_show_never_prints_a_control_character(env, tmp_path: Path):
    drafts = tmp_path / "drafts.jsonl"
    write_suite(
        Suite.of(
            [Case(id="c1", query="real question\x1b[2K\rfake question", target_level="document", judgments={"d1": 1})],
            "drafts",
        ),
        drafts,
    )
    ok(env, "create", "claims", "--target", "production", "--split", "all=1")
    ok(env, "add", "claims", str(drafts))
    shown = ok(env, "show", "claims")
    assert "real question\\x1b[2K\\x0dfake question" in shown and "\x1b" not in shown and "\r" not in shown
