"""Hybrid retrieval over verified bundles: channels, fusion, authorization, hydration, context."""
