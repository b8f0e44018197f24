"""Object storage: one interface (``objects.ObjectStore``), two backends — the local filesystem
(``local``) and S3-compatible object storage (``s3``, the only boto3 import) — and the location
that names a store (``location``). docs/operations.md, "Object storage"."""
