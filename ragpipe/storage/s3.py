"""The S3 backend of ``ObjectStore`` (the only boto3 import): objects under ``s3://bucket/prefix``.

``put_new`` is a PutObject with ``If-None-Match: *`` and ``put_if`` one with ``If-Match: <etag>``
(or ``If-None-Match: *`` to create): the service decides the race, so writers on any machine are
ordered without a lock. S3 answers a lost condition with 412 (PreconditionFailed), a condition on
a missing key with 404, and a write racing another conditional write on the same key with 409
(ConditionalRequestConflict): for ``put_new`` a 409 is retried (the other write may yet fail), for
``put_if`` it is a ``Conflict`` like the others. Every other failure is a one-line
``StorageError`` naming the store and key; credentials never appear in a message.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from ragpipe.storage.objects import Conflict, StorageError, Stored, check_key, check_prefix

T = TypeVar("T")
_LOST = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404"}
_RACE_RETRIES = 5


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "")) or str(
        exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
    )


class S3ObjectStore:
    def __init__(self, bucket: str, prefix: str = "", client: Any = None, **client_options: Any):
        """``client_options`` go to ``boto3.client("s3", ...)``: ``endpoint_url``, ``region_name``,
        ``aws_access_key_id``, ``aws_secret_access_key``."""
        self.bucket = bucket
        self.prefix = check_prefix(prefix.strip("/") + "/" if prefix.strip("/") else "")
        self.client = client or boto3.client(
            "s3",
            config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=60),
            **client_options,
        )

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _call(self, key: str, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except ClientError as exc:
            if _code(exc) in _LOST:
                raise
            message = exc.response.get("Error", {}).get("Message") or _code(exc)
            raise StorageError(f"{self.url}: {key}: cannot be {what}: {_code(exc)}: {message}") from None
        except BotoCoreError as exc:
            raise StorageError(f"{self.url}: {key}: cannot be {what}: {exc}") from None

    def get(self, key: str) -> Stored | None:
        name = self.prefix + check_key(key)
        try:
            reply = self._call(key, "read", lambda: self.client.get_object(Bucket=self.bucket, Key=name))
            data = self._call(key, "read", reply["Body"].read)
        except ClientError:  # only a missing key gets here (_LOST)
            return None
        return Stored(data=data, etag=reply["ETag"])

    def version(self, key: str) -> str | None:
        name = self.prefix + check_key(key)
        try:
            reply = self._call(key, "read", lambda: self.client.head_object(Bucket=self.bucket, Key=name))
        except ClientError:  # only a missing key gets here (_LOST)
            return None
        return reply["ETag"]

    def put_new(self, key: str, data: bytes) -> bool:
        name = self.prefix + check_key(key)
        for attempt in range(_RACE_RETRIES):
            try:
                self._call(
                    key,
                    "written",
                    lambda: self.client.put_object(Bucket=self.bucket, Key=name, Body=data, IfNoneMatch="*"),
                )
                return True
            except ClientError as exc:
                if _code(exc) not in {"ConditionalRequestConflict", "409"}:
                    return False  # 412: the key exists
                time.sleep(0.05 * 2**attempt)  # another conditional write is in flight: it decides
        raise StorageError(f"{self.url}: {key}: cannot be written: conditional writes kept conflicting")

    def put_if(self, key: str, data: bytes, etag: str | None) -> str:
        name = self.prefix + check_key(key)
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        try:
            reply = self._call(
                key,
                "written",
                lambda: self.client.put_object(Bucket=self.bucket, Key=name, Body=data, **condition),
            )
        except ClientError as exc:
            raise Conflict(
                f"{self.url}: {key}: changed since it was read (expected version {etag}; {_code(exc)})"
            ) from None
        return reply["ETag"]

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix + prefix)
        keys: list[str] = []
        for page in self._call(prefix or "/", "listed", lambda: list(pages)):
            keys += [item["Key"][len(self.prefix) :] for item in page.get("Contents", ())]
        return sorted(keys)
