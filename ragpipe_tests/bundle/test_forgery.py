"""Forgeries that keep the bundle ID and directory and recompute the file list, material digest and
seal with the documented (unkeyed) formulas: verification recomputes the payload and refuses each.

What an unkeyed seal cannot stop — material (vectors, index text) rewritten with *every* digest
recomputed — is shown explicitly, and refused once a bundle key is configured (docs/trust.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from ragpipe.bundle.manifest import MANIFEST_NAME, BundleManifest, FileEntry, make_manifest, manifest_bytes
from ragpipe.bundle.payload_checks import stored_embeddings_digest
from ragpipe.bundle.verify import BundleVerificationError, check_vector_table, file_digest, open_bundle
from ragpipe.chunking.models import read_chunks, write_chunks
from ragpipe.corpus.snapshot import documents_table, read_snapshot_documents
from ragpipe.index.lexical import build_lexical_index
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import IndexRow, index_rows
from ragpipe.index.vector import build_vector_index, read_vector_rows
from ragpipe.index.vector_file import VECTORS_FILE, read_vectors_file, vectors_file_bytes
from ragpipe.kernel.ids import ContentDigest, bytes_digest
from ragpipe.kernel.seals import KEY_ENV, KEY_FILE_ENV, SealKey, SealKeyError, configured_key
from ragpipe.representations.derive import read_representations, write_representations
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever
from ragpipe.spec import LexicalIndexSpec

KEY = SealKey(b"a bundle key of at least 32 bytes!!")


def manifest_of(root: Path) -> BundleManifest:
    return BundleManifest.model_validate_json((root / MANIFEST_NAME).read_bytes())


def reseal(root: Path, key: SealKey | None = None, embeddings_digest: str | None | bool = False) -> None:
    """What a forger without the key does: re-list every file, recompute the material digest and
    the seal, keep the semantic section (so the bundle ID and directory name stay the same).
    ``embeddings_digest``: False keeps the manifest's, anything else replaces it."""
    m = manifest_of(root)
    files = [
        FileEntry(path=p.relative_to(root).as_posix(), size=p.stat().st_size, sha256=file_digest(p))
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    ]
    vectors = m.material.embeddings_digest if embeddings_digest is False else embeddings_digest
    forged = make_manifest(m.semantic, vectors, files, key)
    assert forged.bundle_id == m.bundle_id
    (root / MANIFEST_NAME).write_bytes(manifest_bytes(forged))


def refusal(root: Path, key: SealKey | None = None) -> str:
    with pytest.raises(BundleVerificationError) as info:
        open_bundle(root, key=key)
    return str(info.value)


@pytest.fixture
def forgeable(scoped_bundles, tmp_path: Path) -> Path:
    full, _ = scoped_bundles
    dst = tmp_path / full.name
    shutil.copytree(full, dst)
    return dst


def rewrite_documents(root: Path, edit) -> None:
    docs = [edit(d) for d in read_snapshot_documents(root / "documents.parquet")]
    pq.write_table(documents_table(docs), root / "documents.parquet")


def escalate(doc):
    return doc.model_copy(update={"access_scopes": ("public",)}) if doc.document_id == "sec-aspirin" else doc


def forged_rows(root: Path) -> list[IndexRow]:
    """The bundle's own index rows with the secret document's rows escalated to ``public``."""
    rows = index_rows(
        read_snapshot_documents(root / "documents.parquet"), read_representations(root / "representations.parquet")
    )
    return [
        r.__class__(**{**r.__dict__, "access_scopes": ("public",)}) if r.document_id == "sec-aspirin" else r
        for r in rows
    ]


def test_untouched_copy_verifies_and_reseal_is_faithful(forgeable: Path):
    before = (forgeable / MANIFEST_NAME).read_bytes()
    reseal(forgeable)
    assert (forgeable / MANIFEST_NAME).read_bytes() == before  # the forger's formulas are the real ones
    assert open_bundle(forgeable, key=None).bundle_id == manifest_of(forgeable).bundle_id


def test_scope_escalated_in_documents_is_refused(forgeable: Path):
    rewrite_documents(forgeable, escalate)
    reseal(forgeable)
    message = refusal(forgeable)
    assert "documents.parquet: corpus digest sha256:" in message
    assert "(a document's text, title, access_scopes or source_role changed)" in message


def test_scope_escalated_in_tantivy_rows_is_refused(forgeable: Path):
    shutil.rmtree(forgeable / "lexical")
    (forgeable / "lexical").mkdir()
    build_lexical_index(forgeable / "lexical", forged_rows(forgeable), LexicalIndexSpec())
    reseal(forgeable)
    message = refusal(forgeable)
    assert "lexical: row " in message
    assert "access_scopes ('public',) differs from its representation's document (('secret',))" in message


def test_scope_escalated_in_lance_rows_is_refused(forgeable: Path):
    vectors = read_vector_rows(forgeable / "vector")
    matrix = np.stack(vectors.column("vector").to_numpy(zero_copy_only=False))
    shutil.rmtree(forgeable / "vector")
    build_vector_index(forgeable / "vector", forged_rows(forgeable), matrix)
    reseal(forgeable)
    message = refusal(forgeable)
    assert "vector: row " in message
    assert "access_scopes ('public',) differs from its representation's document (('secret',))" in message


def test_escalated_bundle_never_serves_the_secret_document(forgeable: Path):
    """The scope-forgery attack: before the fix, an anonymous query returned the secret document first."""
    rewrite_documents(forgeable, escalate)
    reseal(forgeable)
    with pytest.raises(BundleVerificationError):
        Retriever(forgeable).query("aspirin stroke", Subject.default(), k=3)


def test_document_text_forged_with_or_without_its_digest_is_refused(forgeable: Path, tmp_path: Path):
    pristine = tmp_path / "pristine"
    shutil.copytree(forgeable, pristine)

    def new_text(doc, digest: bool):
        if doc.document_id != "pub-statin":
            return doc
        text = doc.text.replace("LDL", "HDL")
        return doc.model_copy(
            update={
                "text": text,
                "content_digest": ContentDigest(bytes_digest(text.encode())) if digest else doc.content_digest,
            }
        )

    rewrite_documents(forgeable, lambda d: new_text(d, digest=False))
    reseal(forgeable)
    assert "documents.parquet: document 'pub-statin': content_digest does not match its text" in refusal(forgeable)
    shutil.rmtree(forgeable)
    shutil.copytree(pristine, forgeable)
    rewrite_documents(forgeable, lambda d: new_text(d, digest=True))
    reseal(forgeable)
    assert "documents.parquet: corpus digest" in refusal(forgeable)


def test_forged_chunk_is_refused(forgeable: Path):
    chunks = read_chunks(forgeable / "chunks.parquet")
    first = chunks[0]
    # a consistent forgery: a shorter span whose text and digest match the document's bytes
    end = first.byte_start + 10
    text = read_snapshot_documents(forgeable / "documents.parquet")[0].text.encode()[first.byte_start : end].decode()
    chunks[0] = first.model_copy(
        update={"byte_end": end, "text": text, "digest": ContentDigest(bytes_digest(text.encode()))}
    )
    write_chunks(forgeable / "chunks.parquet", chunks)
    reseal(forgeable)
    message = refusal(forgeable)
    assert (
        f"chunks.parquet: chunk {first.chunk_id}: byte_end, text, digest differ from re-chunking the documents"
        in message
    )


def test_forged_representation_is_refused(forgeable: Path):
    reps = read_representations(forgeable / "representations.parquet")
    target = reps[0]
    text = target.text + " aspirin aspirin aspirin"
    reps[0] = target.model_copy(update={"text": text, "digest": ContentDigest(bytes_digest(text.encode()))})
    write_representations(forgeable / "representations.parquet", reps)
    reseal(forgeable)
    message = refusal(forgeable)
    assert (
        f"representations.parquet: representation {target.representation_id}: text, digest differ from re-deriving"
        in message
    )


def test_forged_tantivy_ids_are_refused(forgeable: Path):
    rows = index_rows(
        read_snapshot_documents(forgeable / "documents.parquet"),
        read_representations(forgeable / "representations.parquet"),
    )
    rows[0], rows[1] = rows[1], rows[0]  # two rows swap representations: hits would resolve to the wrong chunk
    shutil.rmtree(forgeable / "lexical")
    (forgeable / "lexical").mkdir()
    build_lexical_index(forgeable / "lexical", rows, LexicalIndexSpec())
    reseal(forgeable)
    assert "lexical: row 0 (representation " in refusal(forgeable)


def test_forged_vector_is_refused(forgeable: Path):
    table = read_vector_rows(forgeable / "vector")
    matrix = np.stack(table.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
    matrix[3] = -matrix[3]
    rows = index_rows(
        read_snapshot_documents(forgeable / "documents.parquet"),
        read_representations(forgeable / "representations.parquet"),
    )
    shutil.rmtree(forgeable / "vector")
    build_vector_index(forgeable / "vector", rows, matrix)
    reseal(forgeable)
    message = refusal(forgeable)
    assert (
        "vector: embeddings digest sha256:" in message
        and "of the stored vectors differs from the manifest's" in message
    )


def test_material_rewritten_with_every_digest_recomputed_needs_the_keyed_seal(scoped_bundles, tmp_path: Path):
    """The documented limit of an unkeyed seal, and what the key adds."""
    full, _ = scoped_bundles
    keyed = tmp_path / "keyed" / full.name
    shutil.copytree(full, keyed)
    reseal(keyed, key=KEY)  # the owner seals the bundle with the store's key
    assert open_bundle(keyed, key=KEY).manifest.seal.kind == "hmac-sha256"
    table = read_vector_rows(keyed / "vector")
    matrix = np.stack(table.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
    matrix[3] = -matrix[3]
    rows = index_rows(
        read_snapshot_documents(keyed / "documents.parquet"), read_representations(keyed / "representations.parquet")
    )
    shutil.rmtree(keyed / "vector")
    build_vector_index(keyed / "vector", rows, matrix)
    (keyed / VECTORS_FILE).write_bytes(vectors_file_bytes([r.representation_id for r in rows], matrix))
    digest = stored_embeddings_digest(keyed / "vector")
    reseal(keyed, key=None, embeddings_digest=digest)  # forger without the key: best they can do
    assert open_bundle(keyed, key=None).bundle_id  # an unkeyed store cannot tell (docs/trust.md)
    assert "seal: unkeyed, but bundle key sha256:" in refusal(keyed, key=KEY)
    reseal(keyed, key=SealKey(b"another key that is 32 bytes long!"), embeddings_digest=digest)
    assert (
        f"seal: made with key {SealKey(b'another key that is 32 bytes long!').key_id}, the configured bundle key is {KEY.key_id}"
        in refusal(keyed, key=KEY)
    )


def test_keyed_bundle_without_a_configured_key_is_refused(forgeable: Path):
    reseal(forgeable, key=KEY)
    assert open_bundle(forgeable, key=KEY).manifest.seal.key_id == KEY.key_id
    assert f"seal: keyed with key {KEY.key_id}, but no bundle key is configured" in refusal(forgeable, key=None)


def test_bundle_key_configuration(tmp_path: Path, monkeypatch):
    assert configured_key({}) is None
    key_file = tmp_path / "bundle.key"
    key_file.write_bytes(b"x" * 40 + b"\n")
    assert configured_key({KEY_FILE_ENV: str(key_file)}) == SealKey(b"x" * 40)
    assert configured_key({KEY_ENV: "y" * 32}) == SealKey(b"y" * 32)
    with pytest.raises(SealKeyError, match=f"^{KEY_ENV}: key has 5 bytes, at least 32 are required$"):
        configured_key({KEY_ENV: "short"})
    with pytest.raises(SealKeyError, match="both RAGPIPE_BUNDLE_KEY and RAGPIPE_BUNDLE_KEY_FILE are set"):
        configured_key({KEY_ENV: "y" * 32, KEY_FILE_ENV: str(key_file)})
    with pytest.raises(SealKeyError, match="cannot read the key file: No such file or directory"):
        configured_key({KEY_FILE_ENV: str(tmp_path / "missing")})
    for name in (KEY_ENV, KEY_FILE_ENV):
        with pytest.raises(SealKeyError, match=f"^{name} is set but empty"):
            configured_key({name: ""})  # never a silent fall back to unkeyed verification
    crlf = tmp_path / "crlf.key"
    crlf.write_bytes(b"x" * 40 + b"\r\n")
    assert configured_key({KEY_FILE_ENV: str(crlf)}) == configured_key({KEY_ENV: "x" * 40})
    monkeypatch.setenv(KEY_ENV, "")
    with pytest.raises(BundleVerificationError, match="RAGPIPE_BUNDLE_KEY is set but empty"):
        open_bundle(tmp_path)
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(BundleVerificationError, match="key has 5 bytes"):
        open_bundle(tmp_path)  # a broken key configuration refuses every bundle, never falls back to unkeyed


def test_a_bundle_verified_once_is_still_checked_in_full_after_tampering(forgeable: Path):
    """The in-process memo of payload checks is keyed by the manifest's exact bytes: any change to a
    file either fails its listed digest or, re-listed, gives a new manifest and a full recheck."""
    assert open_bundle(forgeable, key=None)
    rewrite_documents(forgeable, escalate)
    assert "documents.parquet: content digest differs from the manifest" in refusal(forgeable)
    reseal(forgeable)
    assert "documents.parquet: corpus digest sha256:" in refusal(forgeable)


def test_forged_lance_scope_index_is_refused(forgeable: Path, tmp_path: Path):
    """The column values stay right; the LABEL_LIST index the prefilter uses says the secret
    document is public (its files taken from a table built with escalated rows)."""
    table = read_vector_rows(forgeable / "vector")
    matrix = np.stack(table.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
    evil = tmp_path / "evil"
    build_vector_index(evil, forged_rows(forgeable), matrix)
    (real,) = list((forgeable / "vector/representations.lance/_indices").iterdir())
    (forged,) = list((evil / "representations.lance/_indices").iterdir())
    for f in forged.iterdir():
        shutil.copyfile(f, real / f.name)
    reseal(forgeable)
    message = refusal(forgeable)
    assert "vector: a search prefiltered to 'public' returns rows [" in message
    assert "that lack the scope and misses rows [] that have it (scope or vector index altered)" in message


def test_lexical_postings_and_schema_must_agree_with_the_rows(forgeable: Path):
    """The postings a scope prefilter intersects must match exactly the rows' scopes (checked here
    against rows that disagree with the index), and a lexical folder built with another tokenizer
    is refused even though its stored rows are right."""
    from ragpipe.index.lexical_checks import structure_problems

    rows = index_rows(
        read_snapshot_documents(forgeable / "documents.parquet"),
        read_representations(forgeable / "representations.parquet"),
    )
    scopes = [r.access_scopes for r in rows]
    assert structure_problems(forgeable / "lexical", LexicalIndexSpec(), scopes) == []
    secret = next(i for i, r in enumerate(rows) if r.document_id == "sec-aspirin")
    claimed = [("public",) if i == secret else s for i, s in enumerate(scopes)]
    assert structure_problems(forgeable / "lexical", LexicalIndexSpec(), claimed) == [
        f"lexical: the access_scope 'public' postings match rows [] that lack the scope and miss rows [{secret}] that have it",
        f"lexical: the access_scope 'secret' postings match rows [{secret}] that lack the scope and miss rows [] that have it",
    ]
    shutil.rmtree(forgeable / "lexical")
    (forgeable / "lexical").mkdir()
    build_lexical_index(forgeable / "lexical", rows, LexicalIndexSpec(tokenizer="default"))
    reseal(forgeable)
    assert (
        "lexical/meta.json: schema differs from the one the lexical index spec builds (tokenizer or field options)"
        in refusal(forgeable)
    )


def test_manifest_spellings_that_hash_alike_are_refused(forgeable: Path):
    """Canonical encoding folds 1200.0 into 1200, so such a respelling keeps the bundle ID and the
    seal: verification accepts only the one canonical spelling; a non-NFC string has no ID at all
    (the encoder refuses it) and is refused by name."""
    import json as _json

    from ragpipe.bundle.manifest import bundle_id_of

    m = manifest_of(forgeable)
    raw = _json.loads((forgeable / MANIFEST_NAME).read_bytes())
    raw["semantic"]["specs"]["chunks"]["spec"]["max_bytes"] = float(
        raw["semantic"]["specs"]["chunks"]["spec"]["max_bytes"]
    )
    respelled = BundleManifest.model_validate(raw)
    assert bundle_id_of(respelled.semantic) == m.bundle_id
    (forgeable / MANIFEST_NAME).write_bytes(manifest_bytes(respelled))
    assert "manifest.json: specs.chunks: spec is not written in its canonical form" in refusal(forgeable)
    raw["semantic"]["specs"]["chunks"]["spec"]["max_bytes"] = int(
        raw["semantic"]["specs"]["chunks"]["spec"]["max_bytes"]
    )
    raw["semantic"]["default_scope"] = "public"  # ASCII is NFC; respell the default scope's key path instead
    raw["semantic"]["specs"]["source_snapshot"]["spec_id"] = m.semantic.specs["source_snapshot"].spec_id
    decomposed = BundleManifest.model_validate({**raw, "semantic": {**raw["semantic"], "default_scope": "cafe\u0301"}})
    (forgeable / MANIFEST_NAME).write_bytes(manifest_bytes(decomposed))
    assert "manifest.json: holds a string that is not NFC-normalised" in refusal(forgeable)


# --- vectors.arrow and the deferred lance-table checks -------------------------------------------


def rewrite_vectors_file(root: Path, edit) -> None:
    ids, matrix = read_vectors_file((root / VECTORS_FILE).read_bytes())
    ids, matrix = edit(ids, matrix.copy())
    (root / VECTORS_FILE).write_bytes(vectors_file_bytes(ids, matrix))


def test_a_published_bundle_holds_the_lance_vectors_in_vectors_arrow(forgeable: Path):
    ids, matrix = read_vectors_file((forgeable / VECTORS_FILE).read_bytes())
    table = read_vector_rows(forgeable / "vector")
    assert ids == table.column("representation_id").to_pylist()
    assert matrix.tobytes() == np.stack(table.column("vector").to_numpy(zero_copy_only=False)).astype("<f4").tobytes()
    assert VECTORS_FILE in {f.path for f in manifest_of(forgeable).files}


def test_an_altered_vector_in_vectors_arrow_is_refused(forgeable: Path):
    def nudge(ids, matrix):
        matrix[3, 5] = np.nextafter(matrix[3, 5], np.float32(2))
        return ids, matrix

    rewrite_vectors_file(forgeable, nudge)
    reseal(forgeable)
    for defer in (False, True):
        with pytest.raises(BundleVerificationError) as info:
            open_bundle(forgeable, key=None, defer_vector_table=defer)
        assert "vectors.arrow: embeddings digest sha256:" in str(info.value)


def test_permuted_rows_of_vectors_arrow_are_refused(forgeable: Path):
    rewrite_vectors_file(forgeable, lambda ids, m: (ids[1:] + ids[:1], np.roll(m, -1, axis=0)))
    reseal(forgeable)
    message = refusal(forgeable)
    ids = read_representations(forgeable / "representations.parquet")
    assert f"vectors.arrow: row 0 holds representation {ids[1].representation_id!r}, not " in message


def test_vectors_arrow_with_every_digest_recomputed_differs_from_the_lance_table(forgeable: Path, tmp_path: Path):
    """Material forgery with every digest recomputed (docs/trust.md): the lance table, when checked,
    still holds the original vectors, so complete verification refuses; a deferred open cannot tell
    (the unkeyed seal's documented limit) and a configured key refuses it. Queries never read the
    lance table: they score the vectors the manifest binds (vectors.arrow)."""
    rewrite_vectors_file(forgeable, lambda ids, m: (ids, m[::-1].copy()))
    ids, matrix = read_vectors_file((forgeable / VECTORS_FILE).read_bytes())
    from ragpipe.embedding.compute import embeddings_digest

    reseal(forgeable, embeddings_digest=embeddings_digest(ids, matrix))
    assert "vector: embeddings digest sha256:" in refusal(forgeable)
    deferred = open_bundle(forgeable, key=None, defer_vector_table=True)
    assert not deferred.vector_table_checked
    retriever = Retriever(deferred)
    assert np.array_equal(retriever.vector._tables.matrix, matrix) and not deferred.vector_table_checked
    retriever.close()


def test_lance_rows_escalated_are_refused_and_never_widen_what_queries_see(forgeable: Path):
    """The lance table's rows re-scoped to public and the bundle resealed: its check refuses them,
    and queries — which take vectors from vectors.arrow and scopes from the verified tables, never
    from the lance table — keep the secret documents hidden."""
    vectors = read_vector_rows(forgeable / "vector")
    matrix = np.stack(vectors.column("vector").to_numpy(zero_copy_only=False))
    shutil.rmtree(forgeable / "vector")
    build_vector_index(forgeable / "vector", forged_rows(forgeable), matrix)
    reseal(forgeable)
    deferred = open_bundle(forgeable, key=None, defer_vector_table=True)  # vectors.arrow is intact
    assert not deferred.vector_table_checked
    with pytest.raises(BundleVerificationError) as info:
        check_vector_table(deferred)
    assert "access_scopes ('public',) differs from its representation's document (('secret',))" in str(info.value)
    retriever = Retriever(open_bundle(forgeable, key=None, defer_vector_table=True))
    secret_rows = [i for i, r in enumerate(retriever.vector.rows) if r[2] == "sec-aspirin"]
    hits = retriever.vector.search(matrix[secret_rows[0]], 50, Prefilter(("public",)))
    assert hits and not {h.document_id for h in hits} & {"sec-aspirin", "sec-twin"}
    retriever.close()


def test_a_bundle_without_vectors_arrow_is_checked_completely(forgeable: Path, tmp_path: Path):
    """An older layout (no vectors.arrow) opens; nothing can be deferred, and memory reads the lance table."""
    (forgeable / VECTORS_FILE).unlink()
    reseal(forgeable)
    bundle = open_bundle(forgeable, key=None, defer_vector_table=True)
    assert bundle.vector_table_checked and bundle.tables.vectors is None
    retriever = Retriever(bundle)
    assert retriever.vector.engine == "memory"
    assert retriever.vector.why.endswith("read from the lance table (this bundle has no vectors.arrow)")
    retriever.close()
