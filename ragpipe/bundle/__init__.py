"""Content-addressed, verified index bundles."""
