"""Locations name a store; what names none, or a store that cannot be used, is one line naming the
location (or key) and the rule, with no credential in it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ragpipe.storage.local import LocalObjectStore
from ragpipe.storage.location import LocationError, open_store, store_from_env
from ragpipe.storage.objects import StorageError
from ragpipe.storage.s3 import S3ObjectStore
from ragpipe_tests.support.s3_server import CREDENTIALS, REGION, S3Server


@pytest.mark.parametrize("location", ["{tmp}/store", "file://{tmp}/store"])
def test_a_folder_or_file_url_is_the_local_backend(tmp_path: Path, location: str):
    store = open_store(location.format(tmp=tmp_path))
    assert isinstance(store, LocalObjectStore) and store.root == tmp_path / "store"


def test_an_s3_url_names_bucket_prefix_and_the_configured_endpoint(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAGPIPE_S3_ENDPOINT", "http://127.0.0.1:9")
    store = open_store("s3://ragpipe-store/team/a/")
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.prefix, store.url) == ("ragpipe-store", "team/a/", "s3://ragpipe-store/team/a/")
    assert store.client.meta.endpoint_url == "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("", "RAGPIPE_STORE: empty; give a folder, file:///folder or s3://bucket/prefix"),
        ("gs://b/p", "RAGPIPE_STORE: 'gs://b/p': unknown scheme 'gs' (a folder, file:// or s3://)"),
        ("s3://Bad_Bucket/p", "RAGPIPE_STORE: 's3://Bad_Bucket/p': 'Bad_Bucket' is not an S3 bucket name"),
        ("s3://bucket/a/../b", "RAGPIPE_STORE: 's3://bucket/a/../b': the prefix: object key 'a/../b': segment '..'"),
        ("file://host/x", "RAGPIPE_STORE: 'file://host/x': a file URL names a local folder (file:///folder)"),
        (
            "s3://AKIA:secret@bucket/p",
            "RAGPIPE_STORE: a location may not carry credentials (user:secret@); use AWS_* variables",
        ),
    ],
)
def test_a_location_that_names_no_store_is_one_line(location: str, message: str):
    with pytest.raises(LocationError) as info:
        open_store(location, source="RAGPIPE_STORE")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_non_http_endpoint_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAGPIPE_S3_ENDPOINT", "127.0.0.1:9000")
    with pytest.raises(LocationError, match="^store: endpoint '127.0.0.1:9000': must be an http:// or https:// URL$"):
        open_store("s3://bucket")


def test_an_endpoint_with_credentials_is_refused_without_echoing_them(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAGPIPE_S3_ENDPOINT", "http://AKIA:supersecret@127.0.0.1:9")
    with pytest.raises(LocationError) as info:
        open_store("s3://bucket")
    assert "supersecret" not in str(info.value) and "may not carry credentials" in str(info.value)


def test_the_environment_names_the_store_or_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delenv("RAGPIPE_STORE", raising=False)
    assert store_from_env() is None
    monkeypatch.setenv("RAGPIPE_STORE", str(tmp_path))
    assert isinstance(store_from_env(), LocalObjectStore)


def test_an_unreachable_endpoint_is_one_line_naming_store_and_key():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = S3ObjectStore("bucket", "p", endpoint_url=f"http://127.0.0.1:{port}", region_name=REGION, **CREDENTIALS)
    with pytest.raises(StorageError) as info:
        store.get("bundles/x/manifest.json")
    text = str(info.value)
    assert text.startswith("s3://bucket/p/: bundles/x/manifest.json: cannot be read: Could not connect")
    assert "\n" not in text and CREDENTIALS["aws_secret_access_key"] not in text


def test_a_missing_bucket_is_one_line(s3_server: S3Server):
    store = S3ObjectStore("no-such-bucket", "", endpoint_url=s3_server.endpoint, region_name=REGION, **CREDENTIALS)
    with pytest.raises(StorageError, match="^s3://no-such-bucket/: k: cannot be written: NoSuchBucket: "):
        store.put_new("k", b"x")
    with pytest.raises(StorageError, match="^s3://no-such-bucket/: k: cannot be read: NoSuchBucket: "):
        store.get("k")
