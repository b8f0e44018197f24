"""The HTTP service: the active release of a target, followed through activation and rollback."""
