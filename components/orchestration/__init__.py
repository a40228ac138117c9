"""Dagster building blocks over the core: state paths, the MLflow tracker resource, the manifest
IO manager, the per-asset stage (run-scoped folder + nested MLflow run), and Component types whose
instances are declared in YAML (pipelines/defs/**/defs.yaml)."""
