"""Checks ``make lint`` runs besides ruff and mypy (not part of the package)."""
