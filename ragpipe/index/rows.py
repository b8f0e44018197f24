"""The rows both indexes store: IDs plus the authorization fields needed for prefiltering."""

from __future__ import annotations

from dataclasses import dataclass

from ragpipe.corpus.models import Document
from ragpipe.representations.derive import Representation


@dataclass(frozen=True)
class IndexRow:
    representation_id: str
    chunk_id: str
    document_id: str
    kind: str
    text: str
    access_scopes: tuple[str, ...]
    source_role: str


def index_rows(documents: list[Document], reps: list[Representation]) -> list[IndexRow]:
    docs = {d.document_id: d for d in documents}
    return [
        IndexRow(
            representation_id=str(r.representation_id),
            chunk_id=str(r.chunk_id),
            document_id=str(r.document_id),
            kind=r.kind,
            text=r.text,
            access_scopes=docs[r.document_id].access_scopes,
            source_role=docs[r.document_id].source_role,
        )
        for r in reps
    ]
