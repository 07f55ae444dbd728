"""import-linter contract types that also see the package's ``importlib`` loads of its own modules.

``importlib.import_module("verl_otel_bridge.x")`` (or ``__import__``) with a literal
module name is an import that grimp does not see; these contract types add each such
load to the graph as an import of that module by the loading module, then check as
the built-in ``layers`` and ``acyclic_siblings`` contracts do.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import grimp
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import ContractCheck

_LOADERS = frozenset({"import_module", "__import__"})


def dynamic_imports(package: str) -> Iterator[tuple[str, str, int, str]]:
    """``(importer, imported, line number, line)`` of each literal load of one of ``package``'s modules."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, package
    root = Path(spec.origin).parent
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        importer = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            imported = node.args[0].value
            if name in _LOADERS and isinstance(imported, str) and imported.split(".")[0] == package:
                yield importer, imported, node.lineno, lines[node.lineno - 1].strip()


def _with_dynamic_imports(graph: grimp.ImportGraph, session_options: dict[str, object]) -> grimp.ImportGraph:
    """``graph`` with the importlib loads of each root package's own modules added."""
    roots = session_options.get("root_packages") or [session_options["root_package"]]
    for package in roots:  # type: ignore[union-attr]
        for importer, imported, line_number, line in dynamic_imports(str(package)):
            graph.add_import(importer=importer, imported=imported, line_number=line_number, line_contents=line)
    return graph


class LayersWithImportlibContract(LayersContract):
    """``layers``, with the package's importlib loads of its own modules counted as imports."""

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        return super().check(_with_dynamic_imports(graph, self.session_options), verbose)


class AcyclicSiblingsWithImportlibContract(AcyclicSiblingsContract):
    """``acyclic_siblings``, with the package's importlib loads of its own modules counted as imports."""

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        return super().check(_with_dynamic_imports(graph, self.session_options), verbose)
