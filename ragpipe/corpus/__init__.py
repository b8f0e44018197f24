"""Corpus connectors, normalisation and source snapshots."""
