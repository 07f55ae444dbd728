"""The package's version, and how to read any installed distribution's version."""

from __future__ import annotations

__version__ = "0.1.0"


def distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name`` from package metadata (nothing is imported)."""
    import importlib.metadata  # not at module level: it costs milliseconds at every `import verl_otel_bridge`

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - broken metadata is "unknown", not a crash
        return None
