"""Identity, canonical encoding, atomic publication and strict YAML/JSON reading. Stdlib + rfc8785 +
pydantic + PyYAML only."""
