"""Identity, canonical encoding and atomic publication. Stdlib + rfc8785 + pydantic only."""
