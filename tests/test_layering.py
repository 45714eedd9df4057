"""`core/` is a plain library: no module under it may import Prefect (STYLE.md §1)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "core"
FORBIDDEN = ("prefect", "tuneline.tasks", "tuneline.flows")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_core_never_imports_prefect_or_upper_layers():
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 10
    offenders = {
        f"{path.relative_to(CORE)}: {name}"
        for path in files
        for name in imported_modules(path)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)
    }
    assert not offenders


def test_only_the_tracking_module_imports_mlflow():
    users = {path.name for path in CORE.rglob("*.py") if any(n.split(".")[0] == "mlflow" for n in imported_modules(path))}
    assert users == {"tracking.py"}
