"""Object-store fixtures: a moto S3 server for the session, and ``store`` parametrized over both
backends, so every law of the interface is checked on the filesystem and on S3."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ragpipe.storage.local import LocalObjectStore
from ragpipe.storage.objects import ObjectStore
from ragpipe.storage.s3 import S3ObjectStore
from ragpipe_tests.support.s3_server import CREDENTIALS, REGION, S3Server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server.start()
    try:
        yield server
    finally:
        server.stop()


def s3_store(server: S3Server, prefix: str = "home") -> S3ObjectStore:
    return S3ObjectStore(server.bucket(), prefix, endpoint_url=server.endpoint, region_name=REGION, **CREDENTIALS)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalObjectStore(tmp_path / "store")
    return s3_store(request.getfixturevalue("s3_server"))


def store_env(store: ObjectStore, request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment that makes ``store_from_env()`` open ``store`` in another process."""
    if isinstance(store, LocalObjectStore):
        return {"RAGPIPE_STORE": str(store.root)}
    server: S3Server = request.getfixturevalue("s3_server")
    return {"RAGPIPE_STORE": store.url, **server.env()}


def overwrite(store: ObjectStore, key: str, data: bytes) -> None:
    """Replace an object behind the interface's back (its create-only writes cannot)."""
    if isinstance(store, LocalObjectStore):
        (store.root / key).write_bytes(data)
    else:
        store.client.put_object(Bucket=store.bucket, Key=store.prefix + key, Body=data)


def delete(store: ObjectStore, key: str) -> None:
    if isinstance(store, LocalObjectStore):
        (store.root / key).unlink()
    else:
        store.client.delete_object(Bucket=store.bucket, Key=store.prefix + key)
