"""The package's version, how to install it with an extra, and how to read any installed distribution's version."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

#: Where the install command points when this copy was not installed from a checkout.
CHECKOUT_PLACEHOLDER = "/path/to/verl-otel-bridge"


def install_command(extra: str) -> str:
    """The one command every message gives for an extra: ``pip install '<checkout>[extra]'``.

    No package index serves verl-otel-bridge: it installs from a checkout (or a wheel built
    from one, docs/quickstart.md). Run from a checkout (an editable install), the command
    names that checkout, so it works when pasted.
    """
    checkout = Path(__file__).resolve().parent.parent
    source = str(checkout) if (checkout / "pyproject.toml").is_file() else CHECKOUT_PLACEHOLDER
    return f"pip install '{source}[{extra}]'"


def distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name`` from package metadata (nothing is imported)."""
    import importlib.metadata  # not at module level: it costs milliseconds at every `import verl_otel_bridge`

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - broken metadata is "unknown", not a crash
        return None
