"""A cache of step values: one file per key, committed atomically, verified on every load.

``<root>/<key hex[:2]>/<key hex>.json`` holds ``{"key", "value", "value_digest"}``: the entry
names its own key and the SHA-256 of its value's exact JSON bytes. An entry is used only if it
reads, names the key asked for, and its digest recomputes; anything else — a flipped byte, an
entry copied under another name, a cut file — is logged, set aside as ``<file>.refused`` and
computed again. Writing is ``write_file_atomic`` (temp, rename) without fsync, so a killed run
leaves every committed entry whole and nothing else but an ignored temp file. Not syncing is
safe because every load verifies: a power loss that cuts an entry makes it refused and computed
again, never wrong; syncing cost one fsync pair per item (~1 ms, 5 % of a 4-way step against a
50 ms model, ``benchmarks/step_bench.py``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragpipe.kernel.ids import bytes_digest
from ragpipe.kernel.publish import write_file_atomic

log = logging.getLogger(__name__)


def value_bytes(value: Any) -> bytes:
    """The bytes a value's digest covers: sorted-key compact JSON, non-ASCII kept (the canonical
    encoder would NFC-normalise strings and so not bind a model's own bytes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class JsonEntryStore:
    """Step values as JSON, one verified file per key (module docstring)."""

    def __init__(self, root: Path, label: str, check: Callable[[str, Any], None] | None = None):
        self.root = root
        self.label = label  # names the cache in warnings: "generation cache"
        # The value's own rules (it must be a value *for this key*): raising ValueError refuses it.
        self.check = check

    def path_of(self, key: str) -> Path:
        hex_ = key.split(":", 1)[1]
        return self.root / hex_[:2] / f"{hex_}.json"

    def lookup(self, keys: set[str]) -> dict[str, Any]:
        found = {}
        for key in sorted(keys):
            value = self._load(key)
            if value is not None:
                found[key] = value
        return found

    lookup_new = lookup  # every lookup reads the files: entries other processes committed included

    def _load(self, key: str) -> Any | None:
        path = self.path_of(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("%s: %s: cannot read: %s; computing it again", self.label, path, exc.strerror or exc)
            return None
        try:
            entry = json.loads(data.decode("utf-8"))
            if not isinstance(entry, dict) or set(entry) != {"key", "value", "value_digest"}:
                raise ValueError("is not an entry (key, value, value_digest)")
            if entry["key"] != key:
                raise ValueError(f"names key {entry['key']!r}, not {key!r}")
            if entry["value_digest"] != bytes_digest(value_bytes(entry["value"])):
                raise ValueError("its value does not match its value digest")
            if self.check is not None:
                self.check(key, entry["value"])
        except (UnicodeDecodeError, ValueError) as exc:
            log.warning("%s: %s: %s; set aside as %s.refused, computing it again", self.label, path, exc, path.name)
            try:
                os.replace(path, path.with_name(path.name + ".refused"))
            except OSError:
                pass  # unmovable (read-only cache): still never used
            return None
        return entry["value"]

    def commit(self, entries: list[tuple[str, Any]]) -> None:
        """Each entry on its own, atomically (one file per key: a kill keeps every earlier one)."""
        for key, value in entries:
            entry = {"key": key, "value": value, "value_digest": bytes_digest(value_bytes(value))}
            write_file_atomic(
                self.path_of(key), json.dumps(entry, sort_keys=True, ensure_ascii=False).encode(), sync=False
            )
