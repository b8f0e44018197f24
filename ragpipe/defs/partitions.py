"""One partition per immutable corpus revision."""

from dagster import DynamicPartitionsDefinition

corpus_revisions = DynamicPartitionsDefinition(name="corpus_revisions")
