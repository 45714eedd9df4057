"""The shape of `core/`: a plain library (no Prefect, MLflow only behind `tracking/`), subpackages
that import only the layers below them, and no import cycle between its modules.

Every import counts: top-level ones, those inside functions, and those under TYPE_CHECKING, since
a cycle hidden in a function is still a cycle of ideas (docs/ARCHITECTURE.md, "Layers").
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "core"
PACKAGE = "tuneline.core"
FORBIDDEN = ("prefect", "tuneline.tasks", "tuneline.flows")

# What each part of `core/` may import besides itself: a layer sees only the layers below it.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "config": {"errors"},
    "store": {"errors"},
    "templates": {"errors"},
    "tracking": {"errors", "store"},
    "models": {"errors", "config", "templates"},
    "data": {"errors", "config", "store", "templates", "models"},
    "training": {"errors", "config", "store", "templates", "models", "data", "tracking"},
    "evaluation": {"errors", "config", "templates", "models", "data"},
    "inference": {"errors", "config", "store", "templates", "models", "data", "evaluation"},
    "serving": {"errors", "config", "store", "templates", "models", "data", "evaluation", "inference", "tracking"},
    "stages": {"errors", "config", "store", "templates", "models", "data", "tracking", "training", "evaluation"},
    "worker": {"errors", "config", "store", "templates", "models", "data", "tracking", "training", "evaluation", "stages"},
    "pipeline": {"errors", "config", "store", "templates", "models", "data", "tracking", "training", "evaluation", "stages",
                 "worker"},
}


def module_name(path: Path, root: Path = CORE) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def imported_names(tree: ast.AST, *, module: str, is_package: bool) -> set[str]:
    """Every module name an import statement anywhere in `tree` names (relative ones resolved)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def import_graph(root: Path = CORE) -> dict[str, set[str]]:
    """Module -> the core modules it imports, including the packages Python imports on the way."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = {n for n in imported_names(tree, module=name, is_package=path.name == "__init__.py") if n in paths}
        parents = {t.rsplit(".", i)[0] for t in targets for i in range(1, t.count(".") - PACKAGE.count(".") + 1)}
        graph[name] = ({*targets, *(p for p in parents if p in paths)} - {name}) - _ancestors(name)
    return graph


def _ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts))}


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of `graph` as a closed path of nodes, or None when it is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def part_of(module: str) -> str:
    """The subpackage (or top-level module) of `core/` that `module` belongs to."""
    return module.removeprefix(PACKAGE + ".").split(".")[0] if module != PACKAGE else ""


def layering_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    found = []
    for module, targets in graph.items():
        source = part_of(module)
        for target in targets:
            into = part_of(target)
            if into and source and into != source and into not in ALLOWED.get(source, set()):
                found.append(f"{module} imports {target}: '{source}' may import only {sorted(ALLOWED.get(source, ()))}")
    return sorted(found)


def test_core_never_imports_prefect_or_upper_layers():
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 10
    offenders = {
        f"{path.relative_to(CORE)}: {name}"
        for path in files
        for name in imported_names(ast.parse(path.read_text(encoding="utf-8")), module=module_name(path), is_package=False)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)
    }
    assert not offenders


def test_only_the_tracking_package_imports_mlflow():
    users = {
        str(path.relative_to(CORE)) for path in CORE.rglob("*.py")
        if any(n.split(".")[0] == "mlflow" for n in imported_names(ast.parse(path.read_text(encoding="utf-8")),
                                                                    module=module_name(path), is_package=False))
    }
    assert users and all(user.startswith("tracking/") for user in users), users


def test_every_part_of_core_has_a_place_in_the_layers():
    parts = {part_of(m) for m in import_graph()} - {""}
    assert parts == set(ALLOWED), f"give {sorted(parts - set(ALLOWED))} a layer in ALLOWED; remove {sorted(set(ALLOWED) - parts)}"
    assert find_cycle(ALLOWED) is None  # the layers themselves form no loop


def test_subpackages_import_only_the_layers_below_them():
    violations = layering_violations(import_graph())
    assert not violations, "\n".join(violations)


def test_no_module_of_core_takes_part_in_an_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(m.removeprefix(PACKAGE + ".") for m in cycle)


def test_the_cycle_check_finds_a_cycle_hidden_inside_a_function(tmp_path: Path):
    """The check itself: two modules importing each other, one of them inside a function."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from tuneline.core.pkg.b import g\n")
    (tmp_path / "pkg" / "b.py").write_text("def g():\n    from tuneline.core.pkg import a\n")
    (tmp_path / "c.py").write_text("from tuneline.core.pkg import a\n")
    graph = import_graph(tmp_path)
    assert graph["tuneline.core.c"] == {"tuneline.core.pkg", "tuneline.core.pkg.a"}
    assert find_cycle(graph) == ["tuneline.core.pkg.a", "tuneline.core.pkg.b", "tuneline.core.pkg.a"]
    (tmp_path / "pkg" / "b.py").write_text("def g():\n    return 1\n")
    assert find_cycle(import_graph(tmp_path)) is None
