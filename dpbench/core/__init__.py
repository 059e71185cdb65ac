"""The core layer: errors, config schemas, the plugin registry, tasks, optimizers, method labels, the results file
and redaction. It imports nothing above it (pyproject.toml's import-linter contract)."""
