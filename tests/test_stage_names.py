"""Stage names are written only where a stage kind is defined (the modules that build a `StageKind`) and
in the registry that lists them: everything else asks the registry (`stage_kind`) or reads a kind's
fields, so adding a kind touches its module, its registry entry and its tests (docs/ARCHITECTURE.md,
"Stage kinds"). The check reads every module of core/, flows/ and tasks/ with `ast`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tuneline.core.stages.registry import NOT_OFFERED, STAGE_NAMES

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("core", "flows", "tasks")
REGISTRY = ROOT / "core" / "stages" / "registry.py"
FRAMEWORK_KEYWORDS = frozenset({"framework", "return_tensors"})
"""Keyword arguments whose value names a tensor framework, where "pt" means PyTorch, not stage pt."""


def read_module(tree: ast.AST, names: set[str]) -> tuple[bool, list[tuple[int, str]]]:
    """Whether `tree` builds a `StageKind`, and (line, name) of each string constant in it equal to one of `names`."""
    defines_a_kind, frameworks, written = False, set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "StageKind":
            defines_a_kind = True
        elif isinstance(node, ast.keyword) and node.arg in FRAMEWORK_KEYWORDS:
            frameworks.add(id(node.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            written.append(node)
    return defines_a_kind, sorted((node.lineno, node.value) for node in written if id(node) not in frameworks)


def test_no_stage_name_is_written_outside_the_kind_modules_and_the_registry():
    names = {*STAGE_NAMES, *NOT_OFFERED}
    found, kind_modules = [], []
    quoted = re.compile("[\"']({})[\"']".format("|".join(map(re.escape, names))))
    for path in sorted(p for top in SCANNED for p in (ROOT / top).rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if not quoted.search(source):  # no constant can equal a name its text never quotes: nothing to parse
            continue
        defines_a_kind, written = read_module(ast.parse(source), names)
        if path == REGISTRY or defines_a_kind:
            kind_modules.append(path.relative_to(ROOT).as_posix())
        else:
            found.extend(f"{path.relative_to(ROOT)}:{line}: {name!r}" for line, name in written)
    assert len(kind_modules) >= 3, kind_modules  # the scan found the kinds' own modules
    assert not found, ("stage names written outside the kind modules and the registry; ask the registry "
                       "(stage_kind) or a StageKind field instead:\n" + "\n".join(found))


def test_the_check_finds_a_written_name_and_passes_a_tensor_framework():
    tree = ast.parse('if stage == "dpo":\n    weights = safe_open(path, framework="pt")\nbatch = tokenizer(text, return_tensors="pt")\n')
    assert read_module(tree, {"dpo", "pt"}) == (False, [(1, "dpo")])
    assert read_module(ast.parse('LAB = StageKind(name="lab", summary="", examples="supervised")'), {"lab"}) == (True, [(1, "lab")])
