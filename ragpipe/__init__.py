"""ragpipe: build, verify, evaluate and release retrieval indexes for RAG as Dagster assets."""

__version__ = "0.1.0"
