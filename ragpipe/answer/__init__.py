"""Answer generation from certified evidence, and the strict answer validator."""
