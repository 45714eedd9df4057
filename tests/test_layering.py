"""The shape of the repository: imports run one way, `flows/` -> `tasks/` -> `core/`; `core/` is a
plain library (no Prefect, MLflow only behind `tracking/`) whose subpackages import only the layers
below them; and no import cycle anywhere, between the library's modules or among the tests, their
helpers and the scripts.

Every import counts: top-level ones, those inside functions, and those under TYPE_CHECKING, since
a cycle hidden in a function is still a cycle of ideas (docs/ARCHITECTURE.md, "Layers"); no import
is exempt, so a cycle is broken by moving what both sides need, not by a late import.
"""

from __future__ import annotations

import ast
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
CORE = REPO / "core"
PACKAGE = "tuneline.core"
FORBIDDEN = ("prefect", "tuneline.tasks", "tuneline.flows")

# Imports run one way, flows/ -> tasks/ -> core/: what each part of the library may import besides itself.
LIBRARY: dict[str, set[str]] = {
    "tuneline.flows": {"tuneline.tasks", "tuneline.core"},
    "tuneline.tasks": {"tuneline.core"},
    "tuneline.core": set(),
}
SKIPPED = {"build", "dist", "site", "node_modules", "__pycache__"}  # besides hidden folders (.venv, .git) and *.egg-info

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


def parsed(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once for all the checks (per text, so a file rewritten is parsed again)."""
    return _syntax_tree(path.read_text(encoding="utf-8"))


@cache
def _syntax_tree(text: str) -> ast.Module:
    return ast.parse(text)


def module_name(path: Path, root: Path = CORE) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def statements(node: ast.AST) -> Iterable[ast.AST]:
    """Every statement in `node`, at any depth: an import is a statement, so no expression needs a visit."""
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):  # the fields that hold statements
        for child in getattr(node, field, ()):
            yield child
            yield from statements(child)


def imported_names(tree: ast.AST, *, module: str, is_package: bool) -> set[str]:
    """Every module name an import statement anywhere in `tree` names (relative ones resolved)."""
    names = set()
    for node in statements(tree):
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
        tree = parsed(path)
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


def python_files(repo: Path) -> list[Path]:
    files = []
    for folder, subfolders, names in os.walk(repo):
        subfolders[:] = [name for name in subfolders if not (name.startswith(".") or name in SKIPPED or name.endswith(".egg-info"))]
        files.extend(Path(folder) / name for name in names if name.endswith(".py"))
    return sorted(files)


def package_modules(repo: Path, files: Iterable[Path]) -> dict[str, Path]:
    """Dotted name -> file of each module of the packages pyproject.toml maps (`tuneline.core` -> core/)."""
    folders = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]
    modules = {}
    for package, folder in folders.items():
        for path in files:
            if path.is_relative_to(repo / folder):
                parts = path.relative_to(repo / folder).with_suffix("").parts
                modules[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return modules


def library_part(module: str) -> str | None:
    return next((part for part in LIBRARY if module == part or module.startswith(part + ".")), None)


def repository_graph(repo: Path = REPO) -> dict[Path, set[Path]]:
    """Each Python file of the repository -> the repository's files its imports load.

    The library (`LIBRARY`) is imported by dotted names only, with the packages Python imports on the
    way. The other files (tests and their helpers, benchmarks, the data and docs scripts) also import
    each other by file name (`from conftest import ...`, `from golden_rows import ...`), their folder
    being on sys.path when they run: such a name is the file beside the importer, else the one file of
    that name outside the library.
    """
    files = python_files(repo)
    modules = package_modules(repo, files)
    names = {path: name for name, path in modules.items()}
    library = {path for name, path in modules.items() if library_part(name)}
    stems = Counter(path.stem for path in files if path not in library)
    by_file_name = {path.stem: path for path in files if path not in library and stems[path.stem] == 1}
    graph = {}
    for path in files:
        module = names.get(path, path.stem)
        tree = parsed(path)
        targets = set()
        for name in imported_names(tree, module=module, is_package=path.name == "__init__.py"):
            parts = name.split(".")
            targets.update(modules[prefix] for prefix in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                           if prefix in modules)
            if "." not in name and path not in library:
                beside = path.parent / f"{name}.py"
                targets.update([beside] if beside.is_file() else [by_file_name[name]] if name in by_file_name else [])
        above = {modules.get(".".join(module.split(".")[:i])) for i in range(1, module.count(".") + 1)}
        graph[path] = targets - {path} - above  # its own packages are imported before it runs
    return graph


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
        for name in imported_names(parsed(path), module=module_name(path), is_package=False)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)
    }
    assert not offenders


def test_only_the_tracking_package_imports_mlflow():
    users = {
        str(path.relative_to(CORE)) for path in CORE.rglob("*.py")
        if any(n.split(".")[0] == "mlflow" for n in imported_names(parsed(path),
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


def test_imports_run_one_way_flows_tasks_core():
    modules = package_modules(REPO, python_files(REPO))
    offenders = []
    for module, path in modules.items():
        if (source := library_part(module)) is None:
            continue
        for name in imported_names(parsed(path), module=module, is_package=path.name == "__init__.py"):
            into = library_part(name)
            if into and into != source and into not in LIBRARY[source]:
                offenders.append(f"{path.relative_to(REPO)} imports {name}: {source} may import only {sorted(LIBRARY[source])}")
    assert {library_part(m) for m in modules} >= set(LIBRARY)
    assert not offenders, "\n".join(sorted(set(offenders)))


def test_no_import_cycle_anywhere_in_the_repository():
    graph = repository_graph()
    assert {REPO / "flows/cli.py", REPO / "tests/conftest.py", REPO / "tests/data/golden_rows.py"} <= set(graph)
    assert REPO / "tests/conftest.py" in graph[REPO / "tests/flows/test_cli_errors.py"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(str(path.relative_to(REPO)) for path in cycle)


def test_the_repository_check_finds_cycles_through_packages_and_file_names(tmp_path: Path):
    """The check itself: a cycle of two flows modules (one side inside a function), then one of two test
    helpers imported by file name; a third-party name that is also a library file's name is not ours."""
    files = {
        "pyproject.toml": '[tool.setuptools.package-dir]\n"tuneline.core" = "core"\n"tuneline.flows" = "flows"\n',
        "core/__init__.py": "", "core/config/__init__.py": "", "core/config/ray.py": "from tuneline.flows import serve\n",
        "flows/__init__.py": "", "flows/cli.py": "from tuneline.flows.serve import f\n",
        "flows/serve.py": "import ray\n\n\ndef f():\n    from tuneline.flows.cli import main\n",
        "tests/conftest.py": "import helper\n", "tests/helper.py": "def g():\n    import conftest\n",
        "tests/flows/test_x.py": "from conftest import g\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = repository_graph(tmp_path)
    assert graph[tmp_path / "flows/serve.py"] == {tmp_path / "flows/cli.py"}  # `import ray` is Ray's
    assert graph[tmp_path / "tests/flows/test_x.py"] == {tmp_path / "tests/conftest.py"}
    assert find_cycle(graph) == [tmp_path / "flows/serve.py", tmp_path / "flows/cli.py", tmp_path / "flows/serve.py"]
    (tmp_path / "flows/serve.py").write_text("import ray\n")
    assert find_cycle(repository_graph(tmp_path)) == [tmp_path / p for p in ("tests/conftest.py", "tests/helper.py", "tests/conftest.py")]
    (tmp_path / "tests/helper.py").write_text("def g():\n    return 1\n")
    assert find_cycle(repository_graph(tmp_path)) is None


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
