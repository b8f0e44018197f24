"""Releases: manifests, targets, pointers, history, approvals, activation, rollback (docs/releases.md)."""
