"""Retrieval representations derived from chunks (never evidence themselves)."""
