"""Which object store a process writes to: a location string and, for S3, its endpoint.

A location is a folder (``/srv/ragpipe-store``, ``file:///srv/ragpipe-store``) or
``s3://bucket[/prefix]``. For S3 the endpoint comes from ``endpoint_url`` (config) or
``RAGPIPE_S3_ENDPOINT`` (environment; none: AWS itself), the region from ``region`` or
``AWS_REGION``/``AWS_DEFAULT_REGION`` (default ``us-east-1``), and credentials from boto3's own
chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a profile, an instance role) — never from
a location string, so none is ever logged or recorded. A location is operational: it never enters
an ID.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ragpipe.kernel.settings import Settings, current_settings
from ragpipe.storage.objects import ObjectStore, check_prefix

ENV_STORE = "RAGPIPE_STORE"
ENV_ENDPOINT = "RAGPIPE_S3_ENDPOINT"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class LocationError(ValueError):
    """A location that names no store; one line naming where it came from and the rule."""


def open_store(
    location: str, *, endpoint_url: str | None = None, region: str | None = None, source: str = "store"
) -> ObjectStore:
    """The store at ``location`` (module docstring); ``source`` names where the string came from."""
    if not location:
        raise LocationError(f"{source}: empty; give a folder, file:///folder or s3://bucket/prefix")
    parts = urlsplit(location)
    if "@" in parts.netloc:  # credentials come from boto3's chain, never from a string that gets logged
        raise LocationError(f"{source}: a location may not carry credentials (user:secret@); use AWS_* variables")
    if parts.scheme == "s3":
        return _s3(location, parts.netloc, parts.path, endpoint_url, region, source)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise LocationError(f"{source}: {location!r}: a file URL names a local folder (file:///folder)")
        return _local(Path(unquote(parts.path)))
    if parts.scheme and len(parts.scheme) > 1:  # not a Windows drive letter
        raise LocationError(f"{source}: {location!r}: unknown scheme {parts.scheme!r} (a folder, file:// or s3://)")
    return _local(Path(location))


def store_from(settings: Settings) -> ObjectStore | None:
    """The store ``settings.store`` (``RAGPIPE_STORE``) names, or ``None`` when it is unset
    (local-only operation). One store object per process and configuration: its client (a
    connection pool) is reused."""
    if not settings.store:
        return None
    return _opened(
        settings.store, settings.s3_endpoint, os.environ.get("AWS_REGION"), os.environ.get("AWS_DEFAULT_REGION")
    )


def store_from_env() -> ObjectStore | None:
    """``store_from(current_settings())``: for library code that was given no settings."""
    return store_from(current_settings())


@functools.lru_cache(maxsize=4)
def _opened(location: str, endpoint: str | None, region: str | None, default_region: str | None) -> ObjectStore:
    # the arguments are the cache key: a changed environment opens a new store
    return open_store(location, endpoint_url=endpoint, source=ENV_STORE)


def _local(path: Path) -> ObjectStore:
    from ragpipe.storage.local import LocalObjectStore

    return LocalObjectStore(path.resolve())


def _s3(location: str, bucket: str, path: str, endpoint: str | None, region: str | None, source: str) -> ObjectStore:
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise LocationError(f"{source}: {location!r}: {bucket!r} is not an S3 bucket name (3-63 of a-z 0-9 . -)")
    prefix = path.strip("/")
    try:
        check_prefix(prefix + "/" if prefix else "")
    except ValueError as exc:
        raise LocationError(f"{source}: {location!r}: the prefix: {exc}") from None
    endpoint = endpoint or current_settings().s3_endpoint
    if endpoint is not None and "@" in urlsplit(endpoint).netloc:
        raise LocationError(f"{source}: the endpoint may not carry credentials (user:secret@); use AWS_* variables")
    if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
        raise LocationError(f"{source}: endpoint {endpoint!r}: must be an http:// or https:// URL")
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    from ragpipe.storage.s3 import S3ObjectStore  # boto3 is imported only when S3 is used

    return S3ObjectStore(bucket, prefix, endpoint_url=endpoint, region_name=region)
