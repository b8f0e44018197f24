"""Datasets: signed decisions, versions fixed by content and split by case ID, forgeries, crashes."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.evaluation.datasets import (
    DOMAIN,
    DatasetError,
    add_cases,
    adjudicate,
    adjudication_statement,
    case_digest,
    create_dataset,
    dataset_dir,
    freeze,
    load_version,
    parse_reference,
    propose,
    read_dataset,
    record_decision,
    split_of,
)
from ragpipe.evaluation.suite import Case
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.ledger import encode
from ragpipe.kernel.signatures import load_key_file, new_key_file, sign

SPLITS = {"dev": 0.5, "holdout": 0.5}


def case(case_id: str, query: str, source: str = "d1") -> Case:
    return Case(id=case_id, query=query, target_level="document", judgments={source: 1})


QUESTIONS = {
    "c1": "Does aspirin lower the risk of stroke?",
    "c2": "Which vitamin deficiency causes scurvy?",
    "c3": "Is smoking linked to lung cancer?",
    "c4": "Do statins reduce cholesterol in children?",
}


@pytest.fixture
def keys(tmp_path: Path):
    """Two approvers' key files and the approvers mapping a target would list."""
    rita, sam = tmp_path / "rita.pem", tmp_path / "sam.pem"
    return {"rita": new_key_file(rita), "sam": new_key_file(sam)}, {"rita": rita, "sam": sam}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    create_dataset(home, "claims", "staging", SPLITS)
    add_cases(home, "claims", [case(i, q) for i, q in QUESTIONS.items()])
    return home


def decide(home, approvers, files, case_id, decision, by="rita", edited=None):
    return adjudicate(
        home, "claims", case_id, decision, by=by, key=load_key_file(files[by]), approvers=approvers, edited=edited
    )


def test_a_version_holds_exactly_the_accepted_cases_with_their_splits(home: Path, keys):
    approvers, files = keys
    decide(home, approvers, files, "c1", "accept")
    decide(home, approvers, files, "c2", "edit", edited={"query": "What causes scurvy?"})
    decide(home, approvers, files, "c3", "reject", by="sam")
    version = freeze(home, "claims", approvers)
    state, records = read_dataset(home, "claims")
    assert [r.kind for r in records] == ["created", "cases_added", *["adjudicated"] * 3, "version_registered"]
    assert (version.number, [c["id"] for c in version.cases]) == (1, ["c1", "c2"])
    assert version.cases[1]["query"] == "What causes scurvy?"
    assert version.splits == {i: state.split(i) for i in ("c1", "c2")}
    body = json.loads((dataset_dir(home, "claims") / "versions" / "1.json").read_bytes())
    assert body["excluded"] == {"pending": 1, "rejected": 1, "unverified": 0}
    assert body["decisions"] == {"c1": 3, "c2": 4} and body["created"] == records[0].hash
    assert version.id == content_id("dataset-version", 1, body) == state.versions[0][1]
    loaded = load_version(home, "claims", 1, approvers)
    assert (loaded.id, loaded.cases, loaded.splits) == (version.id, version.cases, version.splits)
    suite = loaded.suite()
    assert [(c.id, c.split) for c in suite.cases] == [(i, (version.splits[i],)) for i in ("c1", "c2")]


def test_the_next_version_keeps_every_case_in_its_split_and_refuses_no_change(home: Path, keys):
    approvers, files = keys
    decide(home, approvers, files, "c1", "accept")
    first = freeze(home, "claims", approvers)
    with pytest.raises(DatasetError, match=r"^dataset 'claims': nothing changed since version 1$"):
        freeze(home, "claims", approvers)
    decide(home, approvers, files, "c4", "accept", by="sam")
    add_cases(home, "claims", [case("c5", "Does coffee raise blood pressure?")])
    decide(home, approvers, files, "c5", "accept")
    second = freeze(home, "claims", approvers)
    assert second.number == 2 and {"c1", "c4", "c5"} == {c["id"] for c in second.cases}
    assert second.splits["c1"] == first.splits["c1"]
    assert json.loads((dataset_dir(home, "claims") / "versions" / "2.json").read_bytes())["parent"] == first.id
    assert load_version(home, "claims", None, approvers).number == 2  # the latest


def test_decisions_are_refused_with_one_line_each(home: Path, keys, tmp_path: Path):
    approvers, files = keys
    stranger = tmp_path / "stranger.pem"
    new_key_file(stranger)
    proposal = propose(home, "claims", "c1", "accept", "rita")
    forged = sign(load_key_file(stranger), proposal.statement())
    with pytest.raises(DatasetError, match=r"^decision on case 'c1' by 'rita': the signature does not verify$"):
        record_decision(home, proposal, forged, approvers)
    with pytest.raises(
        DatasetError, match=r"^'eve' is not an approver of this dataset's target \(approvers: rita, sam\)$"
    ):
        record_decision(home, propose(home, "claims", "c1", "accept", "eve"), forged, approvers)
    # a signature over one case does not carry to another
    other = propose(home, "claims", "c2", "accept", "rita")
    with pytest.raises(DatasetError, match="the signature does not verify"):
        record_decision(home, other, sign(load_key_file(files["rita"]), proposal.statement()), approvers)
    with pytest.raises(DatasetError, match=r"^case 'c1': an edit cannot change the case ID$"):
        propose(home, "claims", "c1", "edit", "rita", {"id": "c9"})
    with pytest.raises(DatasetError, match=r"^case 'c1': 'query' must be a string, got number$"):
        propose(home, "claims", "c1", "edit", "rita", {"query": 7})
    with pytest.raises(DatasetError, match=r"^case 'c1': the edit changes nothing \(accept it instead\)$"):
        propose(home, "claims", "c1", "edit", "rita", {"query": QUESTIONS["c1"]})
    with pytest.raises(DatasetError, match=r"^dataset 'claims': no case 'c9'$"):
        propose(home, "claims", "c9", "accept", "rita")
    with pytest.raises(DatasetError, match=r"^dataset 'claims': case 'c1' is already in the dataset$"):
        add_cases(home, "claims", [case("c1", "again")])
    assert [r.kind for r in read_dataset(home, "claims")[1]] == ["created", "cases_added"]  # nothing appended


def test_a_stale_decision_is_refused_and_a_fresh_one_counts(home: Path, keys):
    """Rita proposes to accept c1; Sam edits it first: Rita's decision names a case that no longer
    is. Then Sam rejects c2 while Rita's accept of it waits: refused too — but Rita may accept c2
    again, having seen the rejection (a person may change their mind)."""
    approvers, files = keys
    stale = propose(home, "claims", "c1", "accept", "rita")
    decide(home, approvers, files, "c1", "edit", by="sam", edited={"tags": ["cardio"]})
    with pytest.raises(DatasetError, match=r"^dataset 'claims': case 'c1' changed since this decision was proposed"):
        record_decision(home, stale, sign(load_key_file(files["rita"]), stale.statement()), approvers)
    waiting = propose(home, "claims", "c2", "accept", "rita")
    decide(home, approvers, files, "c2", "reject", by="sam")
    with pytest.raises(DatasetError, match=r"case 'c2' changed since this decision was proposed"):
        record_decision(home, waiting, sign(load_key_file(files["rita"]), waiting.statement()), approvers)
    assert read_dataset(home, "claims")[0].cases["c2"].status == "rejected"
    decide(home, approvers, files, "c2", "accept")
    assert read_dataset(home, "claims")[0].cases["c2"].status == "accepted"


def test_a_removed_or_rotated_key_revokes_what_it_signed(home: Path, keys, tmp_path: Path):
    approvers, files = keys
    decide(home, approvers, files, "c1", "accept", by="sam")
    first = freeze(home, "claims", approvers)
    only_rita = {"rita": approvers["rita"]}
    with pytest.raises(DatasetError) as err:
        load_version(home, "claims", first.number, only_rita)
    assert str(err.value) == (
        "dataset 'claims' version 1: case 'c1': 'sam' is no longer an approver of the target; the version no longer holds"
    )
    rotated = {**approvers, "sam": new_key_file(tmp_path / "sam-2.pem")}
    with pytest.raises(DatasetError, match=r"case 'c1': the signature by 'sam' does not verify; the version no longer"):
        load_version(home, "claims", first.number, rotated)
    # the next freeze leaves the revoked case out (counted), and a new decision brings it back
    decide(home, approvers, files, "c2", "accept")
    second = freeze(home, "claims", only_rita)
    assert [c["id"] for c in second.cases] == ["c2"]
    body = json.loads((dataset_dir(home, "claims") / "versions" / "2.json").read_bytes())
    assert body["excluded"] == {"pending": 2, "rejected": 0, "unverified": 1}
    adjudicate(home, "claims", "c1", "accept", by="rita", key=load_key_file(files["rita"]), approvers=only_rita)
    assert [c["id"] for c in freeze(home, "claims", only_rita).cases] == ["c1", "c2"]


def test_a_case_carrying_its_own_split_is_refused(home: Path, keys):
    approvers, files = keys
    imported = Case(id="b1", query="From BEIR", target_level="document", judgments={"d1": 1}, split=["test"])
    with pytest.raises(DatasetError) as err:
        add_cases(home, "claims", [imported])
    assert (
        str(err.value) == "dataset 'claims': case 'b1': the dataset assigns each case its split by ID; remove 'split'"
    )
    with pytest.raises(DatasetError, match=r"^case 'c1': the dataset assigns each case its split by ID"):
        propose(home, "claims", "c1", "edit", "rita", {"split": ["holdout"]})


def test_leakage_between_splits_refuses_the_freeze(tmp_path: Path, keys):
    approvers, files = keys
    home = tmp_path / "home"
    state = create_dataset(home, "claims", "staging", SPLITS)
    ids = [f"q{i}" for i in range(40)]
    dev = next(i for i in ids if state.split(i) == "dev")
    holdout = next(i for i in ids if state.split(i) == "holdout")
    add_cases(
        home, "claims", [case(dev, "Does aspirin prevent strokes?"), case(holdout, "does ASPIRIN prevent strokes")]
    )
    for case_id in (dev, holdout):
        adjudicate(home, "claims", case_id, "accept", by="rita", key=load_key_file(files["rita"]), approvers=approvers)
    with pytest.raises(DatasetError) as err:
        freeze(home, "claims", approvers)
    a, b = sorted([dev, holdout])
    splits = {dev: "dev", holdout: "holdout"}
    assert str(err.value) == (
        f"dataset 'claims': cases {a!r} ({splits[a]}) and {b!r} ({splits[b]}) ask the same question (duplicate) "
        "in two splits; reject or edit one of them"
    )


def _rewrite(home: Path, events) -> None:
    """A forger with write access and no key: the ledger rewritten from ``(kind, payload)`` events,
    every hash and the head recomputed."""
    path = dataset_dir(home, "claims") / "ledger.jsonl"
    prev, out = None, []
    for seq, (kind, payload) in enumerate(events, start=1):
        record = DOMAIN.make_record(seq, kind, payload, prev)
        out.append(record)
        prev = record.hash
    path.write_bytes(b"".join(map(encode, out)))
    path.with_suffix(".head").write_bytes(canonical_bytes({"hash": prev, "seq": out[-1].seq}) + b"\n")


def _events(home: Path) -> list[tuple[str, dict]]:
    return [(r.kind, r.payload) for r in read_dataset(home, "claims")[1]]


def test_replayed_and_reordered_decisions_are_refused(home: Path, keys):
    approvers, files = keys
    accepted = decide(home, approvers, files, "c1", "accept")
    decide(home, approvers, files, "c1", "reject")
    honest = _events(home)
    _rewrite(home, [*honest, ("adjudicated", accepted.payload)])  # the old accept again, to undo the rejection
    with pytest.raises(DatasetError, match=r"record 5: the decision on case 'c1' does not follow the case's previous"):
        read_dataset(home, "claims")
    _rewrite(home, [*honest[:2], honest[3], honest[2]])  # the rejection first
    with pytest.raises(DatasetError, match=r"record 3: the decision on case 'c1' does not follow the case's previous"):
        read_dataset(home, "claims")


@pytest.mark.parametrize("field", ["salt", "target", "splits"])
def test_a_rewritten_creation_record_voids_every_decision(home: Path, keys, field: str):
    """Another salt (to move cases between splits), target (whose approvers a forger holds) or
    split: the created record's hash changes, and every signed decision names the old one."""
    approvers, files = keys
    decide(home, approvers, files, "c1", "accept")
    events = _events(home)
    created = dict(events[0][1])
    created[field] = {"salt": "f" * 32, "target": "sandbox", "splits": [["dev", 1.0]]}[field]
    _rewrite(home, [("created", created), *events[1:]])
    with pytest.raises(DatasetError, match=r"record 3: the decision on case 'c1' does not follow the case's previous"):
        read_dataset(home, "claims")


def test_a_version_file_says_nothing_the_signed_ledger_does_not(home: Path, keys):
    """Rita accepts c1 and c2, rejects c3, freezes. The forger adds c3 to the version file (with
    the decision record of another case), moves every case to another split, recomputes the
    version ID and re-registers it in a rewritten ledger: the version is rebuilt from the ledger,
    and the file is not it."""
    approvers, files = keys
    decide(home, approvers, files, "c1", "accept")
    decide(home, approvers, files, "c2", "accept")
    decide(home, approvers, files, "c3", "reject")
    freeze(home, "claims", approvers)
    path = dataset_dir(home, "claims") / "versions" / "1.json"
    body = json.loads(path.read_bytes())
    body["cases"].append(read_dataset(home, "claims")[0].cases["c3"].case)
    body["decisions"]["c3"] = body["decisions"]["c1"]
    body["splits"] = dict.fromkeys([*body["splits"], "c3"], "train-on-me")
    path.write_bytes(canonical_bytes(body))
    events = _events(home)
    registered = {**events[-1][1], "version_id": content_id("dataset-version", 1, body)}
    _rewrite(home, [*events[:-1], ("version_registered", registered)])
    with pytest.raises(DatasetError, match=r"1\.json: the file is not version 1 as the ledger registers it"):
        load_version(home, "claims", 1, approvers)


def test_an_edited_result_with_its_digest_recomputed_does_not_verify(home: Path, keys):
    approvers, files = keys
    decide(home, approvers, files, "c1", "accept")
    freeze(home, "claims", approvers)
    events = _events(home)
    decision = dict(events[2][1])
    decision["result"] = {**decision["result"], "judgments": {"d9": 1}}
    decision["result_digest"] = case_digest(decision["result"])
    _rewrite(home, [*events[:2], ("adjudicated", decision), *events[3:]])
    with pytest.raises(DatasetError) as err:
        load_version(home, "claims", 1, approvers)
    assert str(err.value) == (
        "dataset 'claims' version 1: case 'c1': the signature by 'rita' does not verify; the version no longer holds"
    )
    with pytest.raises(DatasetError, match=r"no accepted case to freeze \(1 accepted by keys the target no longer"):
        freeze(home, "claims", approvers)


def test_a_version_file_in_another_encoding_is_refused(home: Path, keys):
    approvers, files = keys
    decide(home, approvers, files, "c1", "accept")
    freeze(home, "claims", approvers)
    path = dataset_dir(home, "claims") / "versions" / "1.json"
    path.write_bytes(b'{"name":"forged",' + path.read_bytes()[1:])  # the same object, a duplicate key first
    with pytest.raises(DatasetError, match=r"the file is not version 1 as the ledger registers it"):
        load_version(home, "claims", 1, approvers)


@pytest.mark.parametrize(
    ("edit", "rule"),
    [
        (lambda p: {**p, "splits": []}, "created: splits: Tuple should have at least 1 item after validation, not 0"),
        (lambda p: {**p, "splits": [["all", "1"]]}, "created: splits.0.1: Input should be a valid number"),
        (lambda p: {**p, "salt": 7}, "created: salt: Input should be a valid string"),
    ],
)
def test_a_hand_edited_ledger_is_one_line(home: Path, edit, rule: str):
    events = _events(home)
    _rewrite(home, [("created", edit(events[0][1])), *events[1:]])
    with pytest.raises(DatasetError) as err:
        read_dataset(home, "claims")
    assert str(err.value) == f"{dataset_dir(home, 'claims') / 'ledger.jsonl'}: record 1: {rule}"


def test_a_statement_binds_every_field():
    digest = "sha256:" + "0" * 64
    base = ("claims", digest, "c1", digest, digest, "accept", digest, "rita", "2026-12-07T00:00:00.000000Z")
    statements = {adjudication_statement(*base)}
    for i in range(len(base)):
        changed = list(base)
        changed[i] = "x"
        statements.add(adjudication_statement(*changed))
    assert len(statements) == len(base) + 1


def _create_then_die(home: Path) -> None:
    create_dataset(home, "fresh", "staging", SPLITS, on_step=lambda step: os.kill(os.getpid(), signal.SIGKILL))


def test_killed_while_creating_leaves_a_name_that_can_be_created(tmp_path: Path):
    process = multiprocessing.get_context("spawn").Process(target=_create_then_die, args=(tmp_path,))
    process.start()
    process.join(120)
    assert process.exitcode == -signal.SIGKILL
    assert (dataset_dir(tmp_path, "fresh") / "ledger.jsonl").stat().st_size == 0
    with pytest.raises(DatasetError, match=r"the dataset has no records"):
        read_dataset(tmp_path, "fresh")
    assert create_dataset(tmp_path, "fresh", "staging", SPLITS).name == "fresh"
    assert [r.kind for r in read_dataset(tmp_path, "fresh")[1]] == ["created"]


def _freeze_then_die(home: Path, approvers: dict) -> None:
    freeze(home, "claims", approvers, on_step=lambda step: os.kill(os.getpid(), signal.SIGKILL))


def test_killed_between_publishing_and_registering_leaves_no_version(home: Path, keys):
    approvers, files = keys
    decide(home, approvers, files, "c1", "accept")
    process = multiprocessing.get_context("spawn").Process(target=_freeze_then_die, args=(home, approvers))
    process.start()
    process.join(120)
    assert process.exitcode == -signal.SIGKILL
    assert (dataset_dir(home, "claims") / "versions" / "1.json").exists()  # published, never registered
    with pytest.raises(DatasetError, match=r"^dataset 'claims' has no version yet"):
        load_version(home, "claims", None, approvers)
    decide(home, approvers, files, "c2", "accept")
    version = freeze(home, "claims", approvers)  # overwrites the unregistered file
    assert (version.number, [c["id"] for c in version.cases]) == (1, ["c1", "c2"])
    assert load_version(home, "claims", 1, approvers).id == version.id


def _freeze(home: Path, approvers: dict, queue) -> None:
    try:
        queue.put(freeze(home, "claims", approvers).number)
    except DatasetError as exc:
        queue.put(str(exc))


def test_racing_freezers_register_one_version(home: Path, keys):
    approvers, files = keys
    decide(home, approvers, files, "c1", "accept")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    processes = [ctx.Process(target=_freeze, args=(home, approvers, queue)) for _ in range(3)]
    for p in processes:
        p.start()
    results = sorted((queue.get(timeout=120) for _ in processes), key=str)
    for p in processes:
        p.join(120)
    assert results == [1, *["dataset 'claims': nothing changed since version 1"] * 2]
    assert [r.kind for r in read_dataset(home, "claims")[1]].count("version_registered") == 1


def test_splits_follow_their_fractions():
    splits = (("dev", 0.3), ("holdout", 0.3), ("regression", 0.4))
    counts = {name: 0 for name, _ in splits}
    for i in range(30_000):
        counts[split_of("salt", f"case-{i}", splits)] += 1
    # binomial standard deviation at 30,000 draws is under 0.003: 0.01 is more than 3 of them
    assert {name: round(n / 30_000, 2) for name, n in counts.items()} == pytest.approx(dict(splits), abs=0.01)


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=20), st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=30))
def test_split_of_depends_on_the_case_id_alone(salt, ids):
    splits = (("dev", 0.3), ("holdout", 0.3), ("regression", 0.4))
    assigned = {i: split_of(salt, i, splits) for i in ids}
    assert {i: split_of(salt, i, splits) for i in reversed(ids)} == assigned
    assert set(assigned.values()) <= {"dev", "holdout", "regression"}
    assert all(split_of(salt, i, (("all", 1.0),)) == "all" for i in ids)


def test_bad_names_splits_and_references(tmp_path: Path):
    with pytest.raises(DatasetError, match=r"^dataset name 'Bad Name': 1-64 of a-z 0-9"):
        create_dataset(tmp_path, "Bad Name", "staging", SPLITS)
    with pytest.raises(DatasetError, match=r"^dataset 'd': splits: the split fractions sum to 0.9, not 1$"):
        create_dataset(tmp_path, "d", "staging", {"dev": 0.5, "holdout": 0.4})
    with pytest.raises(DatasetError, match=r"^dataset 'd': splits: split 'dev': a fraction in \(0, 1\], not 0.0$"):
        create_dataset(tmp_path, "d", "staging", {"dev": 0, "holdout": 1})
    create_dataset(tmp_path, "d", "staging", {"all": 1.0})
    with pytest.raises(DatasetError, match=r"^dataset 'd' already exists$"):
        create_dataset(tmp_path, "d", "staging", {"all": 1.0})
    with pytest.raises(DatasetError, match=r"^dataset 'd' has no version yet"):
        load_version(tmp_path, "d", None, {})
    with pytest.raises(DatasetError, match=r"no dataset 'nope'"):
        read_dataset(tmp_path, "nope")
    assert parse_reference("claims@2:holdout") == ("claims", 2, "holdout")
    assert parse_reference("claims") == ("claims", None, None)
    with pytest.raises(DatasetError, match=r"^dataset reference 'a@b': NAME\[@VERSION\]\[:SPLIT\]"):
        parse_reference("a@b")
