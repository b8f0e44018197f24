"""Stage runners: what each asset does, as plain functions over a workspace (no Dagster here)."""
