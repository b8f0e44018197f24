"""Retrieval metrics and judgments."""
