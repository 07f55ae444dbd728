"""The package's version, how to install it with an extra, and how to read any installed distribution's version."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse

__version__ = "0.1.0"

#: Where the install command points when it cannot tell where this copy came from.
CHECKOUT_PLACEHOLDER = "/path/to/verl-otel-bridge"


def install_command(extra: str) -> str:
    """The one command every message gives for an extra: ``pip install '<source>[extra]'``.

    No package index serves verl-otel-bridge: it installs from a checkout or from a wheel
    built from one (docs/quickstart.md). The command names, so that it works when pasted:
    the checkout this copy runs from (an editable install); else the directory or wheel
    pip installed it from, while that is still there; else a placeholder.
    """
    here = Path(__file__).resolve().parent.parent
    if (here / "pyproject.toml").is_file():
        return f"pip install '{here}[{extra}]'"
    return f"pip install '{_installed_from(here) or CHECKOUT_PLACEHOLDER}[{extra}]'"


def _installed_from(site: Path) -> str | None:
    """The checkout or wheel pip installed the copy in ``site`` from, if it is still there.

    pip records it in the distribution's ``direct_url.json`` (PEP 610).
    """
    for record in site.glob("verl_otel_bridge-*.dist-info/direct_url.json"):
        try:
            url = urlparse(json.loads(record.read_text(encoding="utf-8"))["url"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        path = Path(unquote(url.path))
        if url.scheme == "file" and ((path / "pyproject.toml").is_file() or (path.suffix == ".whl" and path.is_file())):
            return str(path)
    return None


def distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name`` from package metadata (nothing is imported)."""
    import importlib.metadata  # not at module level: it costs milliseconds at every `import verl_otel_bridge`

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - broken metadata is "unknown", not a crash
        return None
