"""Small real corpora the tests build from — the handbook (markdown and text, one file with
front-matter scopes) and the adversarial authorization documents (BEIR) — and the writers that
put a corpus on disk."""

from __future__ import annotations

import json
from pathlib import Path

HANDBOOK = {
    "guide/intro.md": "---\ntitle: Introduction\n---\n# Introduction\n\nragpipe builds retrieval indexes.\n\n## Goals\n\nExact spans, verified bundles and honest evaluation.\n",
    "guide/ops.md": "---\naccess_scopes: [staff]\nsource_role: runbook\n---\n# Operations\n\nRotate the signing keys every quarter. Keep the activation pointer backed up.\n",
    "notes/ünïcode.txt": "Café crème costs 3 €; naïve résumé — 日本語のテキストも含まれます。\r\nSecond line.\r\n",
    "notes/short.md": "tiny\n",
}


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text, UTF-8 bytes as given) under ``root``; returns ``root``."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    return root


def write_beir(path: Path, docs: list[dict]) -> Path:
    """Write ``docs`` as BEIR JSON lines to ``path``; returns ``path``."""
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return path


# Adversarial authorization fixture: secret documents that would rank first in both channels,
# a secret twin with exactly the text of a public document (equal-score tie across scopes), and
# a document whose text names scopes.
SCOPED_DOCS = [
    {
        "_id": "pub-aspirin",
        "title": "Aspirin and stroke",
        "text": "Low-dose aspirin reduces the risk of a first stroke in older adults. The effect was modest.",
    },
    {
        "_id": "pub-statin",
        "title": "Statins",
        "text": "Statins lower LDL cholesterol and reduce cardiovascular events in high-risk patients.",
    },
    {
        "_id": "pub-twin",
        "title": "Twin",
        "text": "Aspirin twin text: aspirin stroke prevention trial results in the general population.",
    },
    {
        "_id": "pub-scopes",
        "title": "Access scopes",
        "text": "Documents carry access scopes such as secret and staff; a scope decides who may read a document.",
    },
    {
        "_id": "staff-aspirin",
        "title": "Aspirin staff memo",
        "text": "Staff memo: aspirin dosing for stroke patients on the ward.",
        "metadata": {"access_scopes": ["staff"]},
    },
    {
        "_id": "sec-aspirin",
        "title": "Aspirin stroke aspirin stroke",
        "text": "Aspirin stroke aspirin stroke aspirin stroke: the secret aspirin stroke trial data.",
        "metadata": {"access_scopes": ["secret"]},
    },
    {
        "_id": "sec-twin",
        "title": "Twin",
        "text": "Aspirin twin text: aspirin stroke prevention trial results in the general population.",
        "metadata": {"access_scopes": ["secret"]},
    },
]
SECRET_IDS = {"sec-aspirin", "sec-twin"}
