"""Chunkers: exact UTF-8 byte spans of source documents."""
