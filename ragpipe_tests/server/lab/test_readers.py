"""What the lab refuses to show: a run that does not verify, a ledger that cannot be read, files
outside the run folder; and that no page names the home's absolute path."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import httpx
import pytest

from ragpipe.kernel.workspace import Workspace
from ragpipe.server.app import app_from
from ragpipe.server.lab.readers import LabReader, NotFound, Unverified
from ragpipe.server.redact import PathRedactor
from ragpipe_tests.server.lab.test_views import login
from ragpipe_tests.support.lab_state import LabState
from ragpipe_tests.support.served_http import served


@pytest.fixture
def damaged(lab_state: LabState, tmp_path: Path) -> tuple[Path, str, str]:
    """A home holding copies of run a1 (its trace's last byte flipped) and a2 (a torn record put
    before its ledger and its head removed), symbolic links to a file and to a folder in a1's
    folder, and a run folder that is a symbolic link; (home, a1, a2)."""
    home = tmp_path / "home"
    a1, a2 = lab_state.runs["a1"], lab_state.runs["a2"]
    for run in (a1, a2):
        shutil.copytree(lab_state.home / "evaluations" / run, home / "evaluations" / run)
    trace = home / "evaluations" / a1 / "traces" / "cells-000001.parquet"
    data = bytearray(trace.read_bytes())
    data[-1] ^= 1
    trace.write_bytes(bytes(data))
    ledger = home / "evaluations" / a2 / "ledger.jsonl"
    ledger.write_bytes(b'{"seq": 1, "kind"' + b"x" * 10 + b"\n" + ledger.read_bytes())
    (home / "evaluations" / a2 / "ledger.head").unlink()
    os.symlink("/etc/hostname", home / "evaluations" / a1 / "escape.json")
    os.symlink(home / "evaluations" / a2, home / "evaluations" / a1 / "linked-folder")
    os.symlink(lab_state.home / "evaluations" / lab_state.runs["b1"], home / "evaluations" / "linked")
    return home, a1, a2


def test_a_damaged_run_is_not_shown(damaged):
    home, a1, a2 = damaged
    reader = LabReader(Workspace(home), PathRedactor(home))
    assert reader.run_ids() == sorted([a1, a2], reverse=True)  # the linked folder is not a run here
    with pytest.raises(
        Unverified,
        match=r"^\$RAGPIPE_HOME/evaluations/.*cells-000001\.parquet does not match the digest in the ledger$",
    ):
        reader.run(a1)
    rows = {r.run_id: r for r in reader.runs()}
    assert rows[a1].status == "completed"  # the ledger itself is sound: the trace is checked on opening
    assert rows[a2].status == "unreadable"
    assert rows[a2].problem.startswith(f"$RAGPIPE_HOME/evaluations/{a2}/ledger.jsonl: ")
    with pytest.raises(NotFound, match=f"^run {a1} has no file 'escape.json'$"):
        reader.run_file(a1, "escape.json")
    with pytest.raises(NotFound, match=f"^run {a1} has no file 'linked-folder/ledger.jsonl'$"):
        reader.run_file(a1, "linked-folder/ledger.jsonl")
    assert reader.run_file(a1, "traces/cells-000001.parquet").name == "cells-000001.parquet"
    with pytest.raises(NotFound, match="^no evaluation run 'linked'$"):
        reader.run("linked")


def test_the_pages_of_a_damaged_run_say_why(damaged, lab_state: LabState):
    home, a1, a2 = damaged
    with served(app_from(home, lab_state.config(), "staging")) as base:
        client = login(base, lab_state.keys["rev-staff"])
        page = client.get(f"/lab/runs/{a1}")
        case = client.get(f"/lab/runs/{a1}/cases/goals/0")
        runs = client.get("/lab/runs")
        escape = client.get(f"/lab/runs/{a1}/files/escape.json")
        client.close()
    assert page.status_code == case.status_code == 409
    assert "<h1>Run does not verify</h1>" in page.text
    assert "cells-000001.parquet does not match the digest in the ledger" in page.text
    assert "<td>unreadable" in runs.text
    assert escape.status_code == 404
    for response in (page, case, runs):
        assert str(home) not in response.text


def test_no_page_names_the_homes_path(lab_url: str, lab_state: LabState):
    client = login(lab_url, lab_state.keys["rev-staff"])
    a1, b1 = lab_state.runs["a1"], lab_state.runs["b1"]
    pages = ["/lab/runs", f"/lab/runs/{a1}", f"/lab/runs/{a1}/ledger", "/lab/corpus", "/lab/corpus/lab"]
    pages += [f"/lab/runs/{a1}/cases/{case}/0" for case in ("goals", "keys", "xss")]
    pages += [f"/lab/compare?incumbent={a1}&challenger={b1}", "/lab/corpus/lab-plain", "/lab/runs/nope"]
    try:
        for path in pages:
            text = client.get(path).text
            assert str(lab_state.home.parent) not in text, path
            assert not re.search(r"Traceback", text), path
    finally:
        client.close()
    assert httpx.get(f"{lab_url}/lab/login").status_code == 200


def test_long_lists_are_cut_to_the_shown_depth_with_their_totals(lab_state: LabState, monkeypatch):
    import ragpipe.server.lab.readers as readers
    from ragpipe.retrieval.authz import Subject

    monkeypatch.setattr(readers, "ROWS_SHOWN", 2)
    reader = LabReader(Workspace(lab_state.home), PathRedactor(lab_state.home))
    trace = reader.case(lab_state.runs["a1"], "keys", 0, Subject("sam", ("public", "staff")))
    assert trace.totals["final"] == trace.record["hits"] > 2
    assert [i.rank for i in trace.final] == [1, 2]
    assert all(len(items) <= 2 for items in trace.channels.values())
    assert len(trace.context) == trace.totals["shown"] - len(trace.citations)  # context is never cut
    assert [i.label for i in trace.context] == [f"E{n}" for n in range(1, len(trace.context) + 1)]
