"""Check a verl source tree against :data:`~verl_otel_bridge._internal.verl.targets.TARGETS` without importing it.

``doctor`` runs it on the installed verl; the source-contract test on the published
packages' sources (wheels unpacked, never installed: no GPU package needed). Each
target must exist with the parameters its wrapper reads, and each :class:`Uses`
must hold (the fields, keys, texts and result shapes the wrappers read). Names
imported from another verl module (``from verl.utils.debug import marked_timer``,
star imports and branches included) are followed to every definition they may bind.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from verl_otel_bridge._internal.verl.targets import TARGETS, Target, Uses

_Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
#: How deep imports are followed from a module to the definition of a name.
_MAX_HOPS = 8


@dataclass(frozen=True)
class Finding:
    """A target (or one thing its wrapper uses) that verl's source does not have as expected."""

    target: Target
    problem: str

    def __str__(self) -> str:
        return f"{self.target.qualified_name}: {self.problem}"


class SourceTree:
    """The verl package under ``root`` (the directory that holds ``verl/``), parsed on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._parsed: dict[str, ast.Module | None] = {}

    @property
    def version(self) -> str | None:
        """``verl/version/version``'s text (what ``verl.__version__`` reads), None without it."""
        path = self.root / "verl" / "version" / "version"
        return path.read_text().strip() if path.is_file() else None

    def path(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def parse(self, module: str) -> ast.Module | None:
        if module not in self._parsed:
            path = self.path(module)
            self._parsed[module] = ast.parse(path.read_text(), str(path)) if path is not None else None
        return self._parsed[module]

    def modules(self) -> Iterator[str]:
        """Every module of the package, by dotted name."""
        for path in sorted((self.root / "verl").rglob("*.py")):
            parts = path.relative_to(self.root).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def definitions(self, module: str, name: str, hops: int = 0) -> list[_Def]:
        """Every top-level definition ``name`` may be bound to in ``module`` (following verl's imports)."""
        tree = self.parse(module)
        if tree is None or hops > _MAX_HOPS:
            return []
        found: list[_Def] = []
        stars: list[str] = []
        for node in _top_level(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                found.append(node)
            elif isinstance(node, ast.ImportFrom):
                source = self._imported_module(module, node)
                if source is None:
                    continue
                for alias in node.names:
                    if alias.name == "*":
                        stars.append(source)
                    elif (alias.asname or alias.name) == name:
                        found.extend(self.definitions(source, alias.name, hops + 1))
        if not found:
            for source in stars:
                found.extend(self.definitions(source, name, hops + 1))
        return found

    def scopes(self, module: str, qualified: str) -> list[_Def]:
        """The definitions of ``Class.method`` (the class's verl bases included), ``Class`` or ``function``."""
        head, _, rest = qualified.partition(".")
        found = self.definitions(module, head)
        for part in rest.split(".") if rest else ():
            found = [member for node in found for member in self.members(module, node, part)]
        return found

    def members(self, module: str, node: _Def, name: str, hops: int = 0) -> list[_Def]:
        """The definitions of ``name`` in the class ``node`` of ``module``, or else in its verl bases."""
        if not isinstance(node, ast.ClassDef) or hops > _MAX_HOPS:
            return []
        own: list[_Def] = [
            item
            for item in _top_level(node.body)
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and item.name == name
        ]
        if own:
            return own
        return [found for base in self._bases(module, node) for found in self.members(module, base, name, hops + 1)]

    def _bases(self, module: str, node: ast.ClassDef) -> list[_Def]:
        return [base for expr in node.bases if isinstance(expr, ast.Name) for base in self.definitions(module, expr.id)]

    def declares(self, module: str, cls: str, name: str) -> bool:
        """Whether class ``cls`` (or a verl base of it) declares the field ``name``."""
        pending = [node for node in self.definitions(module, cls) if isinstance(node, ast.ClassDef)]
        seen: set[int] = set()
        while pending:
            node = pending.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if name in _fields(node):
                return True
            pending.extend(base for base in self._bases(module, node) if isinstance(base, ast.ClassDef))
        return False

    def _imported_module(self, module: str, node: ast.ImportFrom) -> str | None:
        if node.level:
            package = module if self.path(module) == self._package_init(module) else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            source = f"{package}.{node.module}" if node.module else package
        else:
            source = node.module or ""
        return source if source == "verl" or source.startswith("verl.") else None

    def _package_init(self, module: str) -> Path:
        return self.root.joinpath(*module.split(".")) / "__init__.py"


def check(tree: SourceTree, targets: Iterable[Target] = TARGETS) -> list[Finding]:
    """What of ``targets`` the source under ``tree`` does not have as expected (empty: everything is there).

    An optional target that is absent is no finding; one that is present is checked like the others.
    """
    findings: list[Finding] = []
    for target in targets:
        if tree.parse(target.module) is None:
            if not target.optional:
                findings.append(Finding(target, f"verl has no module {target.module}"))
            continue
        definitions = tree.scopes(target.module, target.name)
        if not definitions:
            if not target.optional:
                findings.append(Finding(target, f"{target.module} has no {target.name}"))
            continue
        for definition in definitions:
            missing = [name for name in target.parameters if name not in _parameters(tree, target.module, definition)]
            if missing:
                findings.append(Finding(target, f"{target.name} (line {definition.lineno}) lacks parameters {missing}"))
        lacking = [uses for uses in target.uses if not (uses.optional or holds(tree, uses))]
        findings.extend(Finding(target, f"verl's source lacks the {uses}") for uses in lacking)
    return findings


def holds(tree: SourceTree, uses: Uses) -> bool:
    """Whether ``uses`` holds in the source under ``tree``."""
    if uses.kind == "field":
        return uses.scope is not None and tree.declares(uses.module, uses.scope, uses.name)
    if uses.scope is None:
        module = tree.parse(uses.module)
        nodes: list[ast.AST] = [module] if module is not None else []
    else:
        nodes = list(tree.scopes(uses.module, uses.scope))
    if not nodes:
        return False
    if uses.kind == "literal":
        return any(_strings(node, lambda text: text == uses.name) for node in nodes)
    if uses.kind == "prefix":
        return any(_strings(node, lambda text: text.startswith(uses.name)) for node in nodes)
    if uses.kind == "returns":
        returns = [r for node in nodes for r in _returns(node)]
        return bool(returns) and all(
            isinstance(r.value, ast.Tuple) and len(r.value.elts) == int(uses.name) for r in returns
        )
    raise ValueError(f"unknown kind of use {uses.kind!r}")


def names_in(tree: SourceTree, name: str) -> set[str]:
    """Every module of ``tree`` whose code names ``name`` (defines, imports or reads it)."""
    found = set()
    for module in tree.modules():
        path = tree.path(module)
        if path is None or name not in path.read_text():
            continue
        parsed = tree.parse(module)
        if parsed is not None and any(_names(node, name) for node in ast.walk(parsed)):
            found.add(module)
    return found


# --------------------------------------------------------------------------- AST helpers


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of ``body``, including those in its ``if``/``try``/``with`` blocks (not in functions or classes)."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, block, []):
                    yield from _top_level(child.body if isinstance(child, ast.ExceptHandler) else [child])


def _parameters(tree: SourceTree, module: str, node: _Def) -> set[str]:
    if isinstance(node, ast.ClassDef):  # a class: its constructor's parameters
        return {name for init in tree.members(module, node, "__init__") for name in _parameters(tree, module, init)}
    args = node.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}


def _fields(node: ast.ClassDef) -> set[str]:
    found: set[str] = set()
    for item in _top_level(node.body):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            found.add(item.target.id)
        elif isinstance(item, ast.Assign):
            found.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
                found.add(item.name)
            for sub in ast.walk(item):
                targets = (
                    sub.targets
                    if isinstance(sub, ast.Assign)
                    else [sub.target]
                    if isinstance(sub, ast.AnnAssign)
                    else []
                )
                found.update(
                    t.attr
                    for t in targets
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                )
    return found


def _strings(node: ast.AST, test: Callable[[str], bool]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and test(sub.value):
            return True
        if isinstance(sub, ast.JoinedStr) and sub.values:
            head = sub.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and test(head.value):
                return True
    return False


def _returns(node: ast.AST) -> Iterator[ast.Return]:
    """The ``return`` statements of a function, not of the functions nested in it."""
    pending = list(ast.iter_child_nodes(node))
    while pending:
        sub = pending.pop()
        if isinstance(sub, ast.Return) and sub.value is not None:
            yield sub
        elif not isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(sub))


def _names(node: ast.AST, name: str) -> bool:
    if isinstance(node, ast.Name):
        return node.id == name
    if isinstance(node, ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.ImportFrom):
        return any(alias.name == name for alias in node.names)
    return False
