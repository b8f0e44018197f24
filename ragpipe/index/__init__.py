"""Lexical (tantivy) and vector (lancedb) indexes over representations."""
