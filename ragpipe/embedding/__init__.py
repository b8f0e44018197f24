"""Embedders (sentence-transformers adapter) and the persistent embedding cache."""
