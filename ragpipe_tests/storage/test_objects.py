"""The object-store laws, on both backends (``store`` is the filesystem and moto's S3 server):
create-only writes keep the first object, compare-and-swap never loses an update, racing writers
leave exactly one complete object, and listing sees exactly the published keys."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.storage.blobs import folder_files, pull_folder, push_folder, put_blob
from ragpipe.storage.objects import Conflict, ObjectStore, StorageError, check_key

WRITERS = 8


def race(n: int, work) -> list:
    """Run ``work(i)`` on ``n`` threads released together; their results in thread order."""
    barrier, results = threading.Barrier(n), [None] * n

    def run(i: int) -> None:
        barrier.wait()
        results[i] = work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def test_a_created_object_reads_back_and_is_never_replaced(store: ObjectStore):
    assert store.get("bundles/ab/manifest.json") is None
    assert store.put_new("bundles/ab/manifest.json", b"first") is True
    assert store.put_new("bundles/ab/manifest.json", b"second") is False
    stored = store.get("bundles/ab/manifest.json")
    assert stored is not None and stored.data == b"first"


def test_the_version_without_the_bytes_is_the_version_get_returns(store: ObjectStore):
    assert store.version("targets/prod.json") is None
    first = store.put_if("targets/prod.json", b"one", None)
    assert store.version("targets/prod.json") == first == store.get("targets/prod.json").etag
    second = store.put_if("targets/prod.json", b"two", first)
    assert store.version("targets/prod.json") == second != first
    with pytest.raises(ValueError):
        store.version("../outside")


def test_racing_creators_of_one_key_leave_one_complete_object(store: ObjectStore):
    bodies = [bytes([i]) * (256 * 1024 + i) for i in range(WRITERS)]
    won = race(WRITERS, lambda i: store.put_new("blobs/one", bodies[i]))
    assert won.count(True) == 1
    stored = store.get("blobs/one")
    assert stored is not None and stored.data == bodies[won.index(True)]


def test_compare_and_swap_refuses_every_stale_version(store: ObjectStore):
    with pytest.raises(Conflict, match="pointer.json: changed since it was read"):
        store.put_if("targets/t/pointer.json", b"g1", '"not-a-version"')  # missing object
    v1 = store.put_if("targets/t/pointer.json", b"g1", None)
    with pytest.raises(Conflict):
        store.put_if("targets/t/pointer.json", b"g1-again", None)  # exists already
    v2 = store.put_if("targets/t/pointer.json", b"g2", v1)
    with pytest.raises(Conflict):
        store.put_if("targets/t/pointer.json", b"g3", v1)  # a writer that read g1
    stored = store.get("targets/t/pointer.json")
    assert stored is not None and (stored.data, stored.etag) == (b"g2", v2) and v1 != v2


def test_concurrent_read_modify_write_loses_no_update(store: ObjectStore):
    """Each writer adds its increments by read + compare-and-swap, retrying a lost race: the final
    count is every increment, exactly once."""
    per_writer = 5
    store.put_if("counter", b"0", None)

    def increment(_: int) -> int:
        lost = 0
        for _ in range(per_writer):
            for _attempt in range(200):  # bounded: 8 writers cannot starve one for 200 rounds
                current = store.get("counter")
                assert current is not None
                try:
                    store.put_if("counter", str(int(current.data) + 1).encode(), current.etag)
                    break
                except Conflict:
                    lost += 1
            else:
                raise AssertionError("a writer never won a round")
        return lost

    race(WRITERS, increment)
    final = store.get("counter")
    assert final is not None and int(final.data) == WRITERS * per_writer


def test_listing_sees_exactly_the_published_keys(store: ObjectStore):
    for key in ("bundles/a/manifest.json", "bundles/a/x.parquet", "bundles/b/manifest.json", "blobs/sha256/ff"):
        store.put_new(key, key.encode())
    assert store.list("bundles/") == ["bundles/a/manifest.json", "bundles/a/x.parquet", "bundles/b/manifest.json"]
    assert store.list("bundles/a/") == ["bundles/a/manifest.json", "bundles/a/x.parquet"]
    assert store.list("nothing/") == []
    assert len(store.list()) == 4


def test_keys_that_could_leave_the_namespace_are_refused(store: ObjectStore):
    for key in ("", "/abs", "a//b", "../up", "a/../b", ".tmp-x", "a/.locks/x", "sp ace", "a/"):
        with pytest.raises(ValueError, match="object key"):
            store.put_new(key, b"x")


segment = st.from_regex(r"[A-Za-z0-9_=+-][A-Za-z0-9._=+-]{0,20}", fullmatch=True)


@given(st.lists(segment, min_size=1, max_size=6))
def test_every_well_formed_key_is_accepted_unchanged(segments: list[str]):
    key = "/".join(segments)
    assert check_key(key) == key


@given(st.lists(segment, min_size=1, max_size=4), st.sampled_from(["", ".", "..", ".hidden", "a b", "é"]))
def test_one_bad_segment_refuses_the_key(segments: list[str], bad: str):
    with pytest.raises(ValueError, match="object key"):
        check_key("/".join([*segments, bad, *segments]))


@pytest.mark.parametrize(
    ("paths", "rule"),
    [
        (["a", "a"], "a file path is listed twice"),
        (["a", "a/b"], "'a' is listed as a file and holds other files"),
        (["x" * 256], "leaves the folder or is not a file name"),
        (["../x"], "leaves the folder or is not a file name"),
    ],
)
def test_a_listing_that_cannot_be_a_folder_is_refused_before_anything_is_written(
    store: ObjectStore, tmp_path, paths: list[str], rule: str
):
    import json

    entry = {"size": 1, "sha256": put_blob(store, b"x")}
    store.put_new(
        "l/listing.json",
        json.dumps({"format": "ragpipe.folder/v1", "files": [{"path": p, **entry} for p in paths]}).encode(),
    )
    with pytest.raises(StorageError) as info:
        pull_folder(store, "l/listing.json", tmp_path / "out")
    assert str(info.value).startswith(f"{store.url}l/listing.json: ") and rule in str(info.value)
    assert not (tmp_path / "out").exists()


def test_a_pulled_folder_is_exactly_the_pushed_one(store: ObjectStore, tmp_path):
    (tmp_path / "src" / "d").mkdir(parents=True)
    (tmp_path / "src" / "d" / "f.bin").write_bytes(b"\x00\x01")
    (tmp_path / "src" / "top.txt").write_text("top")
    (tmp_path / "src" / "link").symlink_to(tmp_path / "src" / "top.txt")  # links are not sent
    assert push_folder(store, "v/listing.json", tmp_path / "src") is True
    assert push_folder(store, "v/listing.json", tmp_path / "src") is False
    pull_folder(store, "v/listing.json", tmp_path / "out")
    assert folder_files(tmp_path / "out") == {"d/f.bin": b"\x00\x01", "top.txt": b"top"}
