"""Step values on disk: each entry names its key and its value's digest, and is checked on load."""

from __future__ import annotations

import json

from ragpipe.work.entries import JsonEntryStore
from ragpipe.work.keys import step_key

K1, K2 = step_key("s", 1, {"t": "one"}), step_key("s", 1, {"t": "two"})


def test_committed_entries_round_trip_and_name_their_key(tmp_path):
    cache = JsonEntryStore(tmp_path, "test cache")
    cache.commit([(K1, {"text": "café"}), (K2, ["x"])])
    assert cache.lookup({K1, K2}) == {K1: {"text": "café"}, K2: ["x"]}
    entry = json.loads(cache.path_of(K1).read_text())
    assert entry["key"] == K1 and entry["value_digest"].startswith("sha256:")
    assert sorted(p.name for p in cache.path_of(K1).parent.iterdir()) == [cache.path_of(K1).name]  # no temp left


def test_a_flipped_byte_a_moved_entry_and_a_check_failure_are_set_aside(tmp_path, caplog):
    cache = JsonEntryStore(tmp_path, "test cache")
    cache.commit([(K1, {"text": "one"}), (K2, {"text": "two"})])
    path1, path2 = cache.path_of(K1), cache.path_of(K2)
    path1.write_bytes(path1.read_bytes().replace(b'"one"', b'"onE"'))
    path2.parent.mkdir(parents=True, exist_ok=True)
    assert cache.lookup({K1}) == {}
    assert "its value does not match its value digest" in caplog.text
    assert path1.with_name(path1.name + ".refused").exists() and not path1.exists()
    # an intact entry copied under another key's name names the wrong key
    cache.commit([(K1, {"text": "one"})])
    path2.write_bytes(path1.read_bytes())
    assert cache.lookup({K2}) == {} and f"names key {K1!r}" in caplog.text
    strict = JsonEntryStore(
        tmp_path, "test cache", check=lambda key, value: (_ for _ in ()).throw(ValueError("not mine"))
    )
    assert strict.lookup({K1}) == {} and "not mine" in caplog.text


def test_a_cut_file_is_never_a_value(tmp_path):
    cache = JsonEntryStore(tmp_path, "test cache")
    cache.commit([(K1, {"text": "one"})])
    data = cache.path_of(K1).read_bytes()
    for cut in range(len(data)):
        cache.path_of(K1).write_bytes(data[:cut])
        assert cache.lookup({K1}) == {}
        cache.commit([(K1, {"text": "one"})])
    assert cache.lookup({K1}) == {K1: {"text": "one"}}
