"""Calibration records: found again under their key, and refused — reported, set aside, never
used — when their key or value does not check."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from ragpipe.index.engine_calibration import (
    FORMAT_VERSION,
    MAX_RECORD_BYTES,
    Calibration,
    CalibrationRecords,
    calibration_key,
    host_signature,
)

TABLE = "sha256:" + "ab" * 32


def test_a_record_is_found_under_its_key_only(tmp_path: Path):
    records = CalibrationRecords(tmp_path / "c")
    key = calibration_key(TABLE, "cosine", False)
    assert records.get(key) is None
    records.put(key, Calibration(problem=None))
    assert records.get(key) == Calibration(problem=None)
    assert records.get(calibration_key(TABLE, "dot", False)) is None
    assert records.get(calibration_key("sha256:" + "cd" * 32, "cosine", False)) is None
    records.put(key, Calibration(problem="probe 0: differs"))  # a rewrite replaces it
    assert records.get(key) == Calibration(problem="probe 0: differs")
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [records.path(key).name]


def test_the_key_names_versions_host_and_format():
    key = calibration_key(TABLE, "l2", True)
    assert set(key) == {"format_version", "table_digest", "metric", "indexed", "lancedb", "numpy", "host"}
    assert key["format_version"] == FORMAT_VERSION and key["table_digest"] == TABLE and key["metric"] == "l2"
    assert key["indexed"] is True and calibration_key(TABLE, "l2", False) != key
    assert key["host"] == host_signature() and key["host"].startswith("sha256:")


def _refused(records: CalibrationRecords, key, caplog) -> str:
    path = records.path(key)
    with caplog.at_level(logging.WARNING, logger="ragpipe.index.engine_calibration"):
        assert records.get(key) is None
    assert not path.exists() and path.with_name(path.name + ".refused").exists()
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"calibration record {path} refused: ")
    return message


@pytest.mark.parametrize(
    ("edit", "rule"),
    [
        (lambda r: {**r, "value": {**r["value"], "problem": None}}, "value_digest does not match its value"),
        (lambda r: {**r, "value": {"problem": 1}}, "value is not {problem: str or null}"),
        (lambda r: {**r, "value": {**r["value"], "indexed": False}}, "value is not {problem: str or null}"),
        (lambda r: {**r, "key": {**r["key"], "metric": "dot"}}, "its key is not the key it is filed under"),
        (lambda r: {**r, "key": {**r["key"], "indexed": 0}}, "its key is not the key it is filed under"),
        (lambda r: {**r, "key": {**r["key"], "format_version": True}}, "its key is not the key it is filed under"),
        (lambda r: [r], "not a calibration record"),
        (lambda r: {"key": r["key"], "value": r["value"]}, "not a calibration record"),
    ],
)
def test_an_altered_record_is_refused_set_aside_and_recomputed(tmp_path: Path, caplog, edit, rule):
    records = CalibrationRecords(tmp_path)
    key = calibration_key(TABLE, "cosine", False)
    records.put(key, Calibration(problem="probe 1: lance's distances differ"))
    path = records.path(key)
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    assert rule in _refused(records, key, caplog)
    records.put(key, Calibration(problem=None))  # what the next calibration writes
    assert records.get(key) == Calibration(problem=None)


def test_a_record_copied_under_another_key_is_refused(tmp_path: Path, caplog):
    records = CalibrationRecords(tmp_path)
    mine, other = calibration_key(TABLE, "cosine", False), calibration_key("sha256:" + "ef" * 32, "cosine", False)
    records.put(mine, Calibration(problem=None))
    records.path(other).write_bytes(records.path(mine).read_bytes())
    assert "its key is not the key it is filed under" in _refused(records, other, caplog)
    assert records.get(mine) == Calibration(problem=None)


@pytest.mark.parametrize("cut", [0, 1, 17, -2])
def test_a_truncated_record_is_refused(tmp_path: Path, caplog, cut: int):
    records = CalibrationRecords(tmp_path)
    key = calibration_key(TABLE, "cosine", False)
    records.put(key, Calibration(problem=None))
    data = records.path(key).read_bytes()
    records.path(key).write_bytes(data[:cut])
    assert _refused(records, key, caplog)


def test_a_home_that_cannot_be_written_costs_only_the_record(tmp_path: Path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    records = CalibrationRecords(blocker / "calibrations")  # its parent is a file: every write fails
    key = calibration_key(TABLE, "cosine", False)
    with caplog.at_level(logging.WARNING, logger="ragpipe.index.engine_calibration"):
        records.put(key, Calibration(problem=None))
        assert records.get(key) is None
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        f"calibration record {records.path(key)} not written",
        f"calibration record {records.path(key)} cannot be read",
    ]


def test_deeply_nested_json_is_refused(tmp_path: Path, caplog):
    records = CalibrationRecords(tmp_path)
    key = calibration_key(TABLE, "cosine", False)
    records.path(key).write_text("[" * 5000 + "]" * 5000)
    assert "not JSON (RecursionError)" in _refused(records, key, caplog)


def test_an_oversized_record_is_refused_unread(tmp_path: Path, caplog):
    records = CalibrationRecords(tmp_path)
    key = calibration_key(TABLE, "cosine", False)
    records.path(key).write_bytes(b" " * (MAX_RECORD_BYTES + 1))
    assert f"not a regular file of at most {MAX_RECORD_BYTES} bytes" in _refused(records, key, caplog)


def test_a_fifo_is_never_waited_on(tmp_path: Path, caplog):
    records = CalibrationRecords(tmp_path)
    key = calibration_key(TABLE, "cosine", False)
    os.mkfifo(records.path(key))  # opened without blocking: no writer, no hang
    assert f"not a regular file of at most {MAX_RECORD_BYTES} bytes" in _refused(records, key, caplog)


def test_a_symlinked_record_is_not_followed(tmp_path: Path, caplog):
    records = CalibrationRecords(tmp_path / "c")
    key = calibration_key(TABLE, "cosine", False)
    elsewhere = tmp_path / "elsewhere.json"
    CalibrationRecords(tmp_path / "other").put(key, Calibration(problem=None))
    elsewhere.write_bytes(CalibrationRecords(tmp_path / "other").path(key).read_bytes())  # a valid record
    (tmp_path / "c").mkdir()
    records.path(key).symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="ragpipe.index.engine_calibration"):
        assert records.get(key) is None
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        f"calibration record {records.path(key)} cannot be read"
    ]
    records.put(key, Calibration(problem="probe 0: differs"))  # the next calibration replaces the link
    assert not records.path(key).is_symlink() and elsewhere.read_bytes()  # the target is untouched
    assert records.get(key) == Calibration(problem="probe 0: differs")
