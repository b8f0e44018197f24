"""Declared normalisation rules ``utf8-nfc-lf/v1``: strict UTF-8, ``\\r\\n``/``\\r`` → ``\\n``, NFC."""

from __future__ import annotations

import unicodedata


class CorpusError(ValueError):
    """Bad corpus input. ``problems`` lists every ``location: rule`` found (the message shows them)."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        shown = problems[:20]
        more = f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__("invalid corpus:\n  " + "\n  ".join(shown) + more)


def decode_utf8(data: bytes, where: str) -> str:
    """Strict UTF-8 decode; the error names ``where`` and the byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError([f"{where}: invalid UTF-8 at byte {exc.start}"]) from None


def normalize_text(text: str) -> str:
    """Apply ``utf8-nfc-lf/v1`` to already decoded text; strips a leading BOM."""
    if text.startswith("\ufeff"):
        text = text[1:]
    return unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
