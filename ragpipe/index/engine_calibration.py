"""Calibration records: whether this host's lancedb computes a bundle's vector distances exactly
as the in-memory engine does, remembered so a later open needs no lancedb.

``ragpipe.index.vector_memory`` serves a bundle from memory only after lancedb and memory returned
bitwise-equal distances on calibration probes. That needs lancedb, whose import alone costs
seconds — more than a whole ``ragpipe query`` may take. The outcome is a pure function of the
calibration key, so it is recorded once per key and reused::

    <root>/<key digest hex>.json   {"key": {...}, "value": {"problem"}, "value_digest"}

The **key** names everything the outcome depends on: the bundle's material digest (the exact
lance files and vectors), the metric, whether the build rule gives the table an IVF_FLAT index
(``ragpipe.index.ivf``: the arithmetic the memory engine reproduces; a table that breaks the rule
fails calibration), the versions of lancedb (its kernels) and numpy (ours), this module's
``FORMAT_VERSION``, and the host's CPU (architecture and instruction-set flags: lance picks its
kernels at run time). The **value**: ``problem`` — None: memory may serve; else why lancedb serves.

What a record can change is which engine serves. Both return the same hits whenever the record is
true; a *forged* record that says memory matches where it does not can change scores in their
last bits, never which rows a subject may see (rows and scopes come from the verified tables). The
digest detects damage, not forgery: records are trusted like the rest of ``$RAGPIPE_HOME``.

Every load reads the record through one descriptor opened without following links and without
blocking (a regular file of at most ``MAX_RECORD_BYTES``), checks its key against the one wanted
and its value against ``value_digest``; a record that fails any of these, or does not parse, is
reported (a warning naming the file and the rule), moved aside to ``<name>.refused`` and computed
again — never used. Records are written atomically (temp, fsync, rename); two processes
calibrating at once write the same record. Garbage collection leaves them alone; removing the
folder (or one file) only costs a calibration.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.files import NotARegularFile, read_regular
from ragpipe.kernel.ids import bytes_digest, content_id
from ragpipe.kernel.publish import write_file_atomic

log = logging.getLogger(__name__)

# Bump when the memory engine's arithmetic or the calibration probes change: older records then
# no longer match any key and are simply not found.
FORMAT_VERSION = 1


MAX_RECORD_BYTES = 16384


@dataclass(frozen=True)
class Calibration:
    """One calibration's outcome: ``problem`` — why the memory engine may not serve (None: it may)."""

    problem: str | None


@cache
def cpu_flags() -> tuple[str, ...]:
    """This host's CPU instruction-set flags, sorted (empty where ``/proc/cpuinfo`` has none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return tuple(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ()


def host_has_avx512() -> bool:
    """Whether this CPU has AVX-512 Foundation (lance's widest float32 kernels need it)."""
    return "avx512f" in cpu_flags()


@cache
def host_signature() -> str:
    """Digest of this host's architecture and CPU instruction-set flags (what lance's run-time
    kernel choice reads); the architecture alone where ``/proc/cpuinfo`` has no flags."""
    return bytes_digest(f"{platform.machine()}\0{' '.join(cpu_flags())}".encode())


def calibration_key(table_digest: str, metric: str, indexed: bool) -> dict[str, object]:
    """The key of the calibration of the bundle whose material digest is ``table_digest``;
    ``indexed``: whether the build rule gives its table an IVF_FLAT index."""
    return {
        "format_version": FORMAT_VERSION,
        "table_digest": table_digest,
        "metric": metric,
        "indexed": indexed,
        "lancedb": metadata.version("lancedb"),
        "numpy": metadata.version("numpy"),
        "host": host_signature(),
    }


def _value_digest(value: dict[str, object]) -> str:
    return content_id("engine-calibration-value", 1, value)


class CalibrationRecords:
    """The records under ``root`` (created on first write)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, key: dict[str, object]) -> Path:
        return self.root / (content_id("engine-calibration-key", 1, key).split(":", 1)[1] + ".json")

    def get(self, key: dict[str, object]) -> Calibration | None:
        """The recorded outcome for ``key``; None when there is none or it was refused (and set aside)."""
        path = self.path(key)
        data: bytes | None = None
        try:
            data = read_regular(path, MAX_RECORD_BYTES)  # a FIFO, device or link is never waited on or followed
        except FileNotFoundError:
            return None
        except NotARegularFile as exc:
            if exc.link:  # a link is not set aside (it names another file): only not followed
                log.warning("calibration record %s cannot be read (%s): calibrating again", path, exc)
                return None
        except OSError as exc:
            log.warning("calibration record %s cannot be read (%s): calibrating again", path, exc.strerror or exc)
            return None
        rule = f"not a regular file of at most {MAX_RECORD_BYTES} bytes" if data is None else _problem(data, key)
        if rule is None and data is not None:
            return Calibration(problem=json.loads(data)["value"]["problem"])
        log.warning("calibration record %s refused: %s; set aside as %s.refused", path, rule, path.name)
        try:
            os.replace(path, path.with_name(path.name + ".refused"))
        except OSError:
            pass
        return None

    def put(self, key: dict[str, object], calibration: Calibration) -> None:
        """Record ``calibration`` under ``key``. A home that cannot be written (read-only, full)
        costs only the record: a warning, and the next open calibrates again."""
        value = {"problem": calibration.problem}
        record = {"key": key, "value": value, "value_digest": _value_digest(value)}
        try:
            write_file_atomic(self.path(key), canonical_bytes(record) + b"\n")
        except OSError as exc:
            log.warning("calibration record %s not written (%s)", self.path(key), exc.strerror or exc)


def _problem(data: bytes, key: dict[str, object]) -> str | None:
    """Why ``data`` is not a valid record for ``key`` (None: it is)."""
    if len(data) > MAX_RECORD_BYTES:
        return f"not a regular file of at most {MAX_RECORD_BYTES} bytes"
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"not JSON ({type(exc).__name__})"
    if not isinstance(record, dict) or set(record) != {"key", "value", "value_digest"}:
        return "not a calibration record (fields key, value, value_digest)"
    # compared as canonical bytes: JSON's true would otherwise equal a format_version of 1
    try:
        same_key = isinstance(record["key"], dict) and canonical_bytes(record["key"]) == canonical_bytes(key)
    except (TypeError, ValueError):
        same_key = False
    if not same_key:
        return "its key is not the key it is filed under"
    value = record["value"]
    if (
        not isinstance(value, dict)
        or set(value) != {"problem"}
        or not (value["problem"] is None or isinstance(value["problem"], str))
    ):
        return "value is not {problem: str or null}"
    if record["value_digest"] != _value_digest(value):
        return "value_digest does not match its value"
    return None
