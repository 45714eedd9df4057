"""The init fields of `transformers.Seq2SeqTrainingArguments`, each with the simple type it takes.

Importing transformers' trainer module costs seconds (it imports peft, accelerate and more), too
much for a command that only checks a config or finds every stage cached, and a machine that starts
with an empty cache (a container, a new worker) would pay it on every start. So the two dataclasses
are read from transformers' source instead, which takes milliseconds: each annotation is evaluated
with the names it uses standing for themselves, and classified as `typing.get_type_hints` would
have it. Should that source ever not parse as expected, the module is imported after all, and its
table kept per transformers version under `$TUNELINE_CACHE`.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import typing
from functools import cache
from pathlib import Path
from typing import Any

_SIMPLE_TYPES = {"bool": bool, "int": int, "float": float, "str": str}
# the classes in their files, base first; a subclass's fields follow its base's, as in a dataclass
_SOURCES = (("training_args.py", "TrainingArguments"), ("training_args_seq2seq.py", "Seq2SeqTrainingArguments"))
# what the annotations may name beyond transformers' own classes (which stand for themselves)
_KNOWN_NAMES: dict[str, Any] = {**_SIMPLE_TYPES, "None": None, "Any": Any, "Literal": typing.Literal, "Optional": typing.Optional,
                                "Union": typing.Union, "list": list, "dict": dict, "tuple": tuple, "type": type}


class SourceNotReadable(Exception):
    """transformers' source is not the dataclasses this module expects."""


@cache
def training_fields() -> dict[str, Any]:
    """Init fields of `Seq2SeqTrainingArguments`, each mapped to the simple type it takes (bool,
    int, float, str) or `Any` when it takes something richer (enums, unions, lists)."""
    try:
        kinds = fields_from_source(transformers_folder())
    except (OSError, SyntaxError, SourceNotReadable):
        kinds = _cached_imported_fields()
    return {name: _SIMPLE_TYPES.get(kind, Any) for name, kind in kinds.items()}


def transformers_folder() -> Path:
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise SourceNotReadable("transformers is not installed as source files")
    return Path(spec.origin).parent


def fields_from_source(folder: Path) -> dict[str, str]:
    """{field: "bool" | "int" | "float" | "str" | "any"} of the dataclasses in `_SOURCES`, read from `folder`."""
    kinds: dict[str, str] = {}
    for file_name, class_name in _SOURCES:
        tree = ast.parse((folder / file_name).read_text(encoding="utf-8"))
        found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
        if len(found) != 1:
            raise SourceNotReadable(f"{file_name} defines {class_name} {len(found)} times")
        for statement in found[0].body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and _is_init_field(statement):
                kinds[statement.target.id] = simple_kind(_evaluate(statement.annotation))
    if "output_dir" not in kinds or "predict_with_generate" not in kinds:
        raise SourceNotReadable("the dataclasses lack fields every version has")
    return kinds


def simple_kind(hint: Any) -> str:
    """What `typing.get_type_hints` makes of a field, as its table has it: its one type besides None
    when that is a simple type (a `list[str]` counts as its item's type, as `typing.get_args` has it)."""
    options = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    simple = [name for name, kind in _SIMPLE_TYPES.items() if options == [kind]]
    return simple[0] if simple else "any"


def _is_init_field(statement: ast.AnnAssign) -> bool:
    value = statement.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
        return not any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords)
    return True


def _evaluate(annotation: ast.expr) -> Any:
    """The annotation as an object: known names as themselves, any other name a class of its own (a
    `ClassVar[...]`, which is no field, fails here too)."""
    names = {node.id for node in ast.walk(annotation) if isinstance(node, ast.Name)}
    if any(isinstance(node, ast.Attribute) for node in ast.walk(annotation)):
        raise SourceNotReadable(f"annotation {ast.unparse(annotation)} names an attribute")
    namespace = {name: _KNOWN_NAMES[name] if name in _KNOWN_NAMES else type(name, (), {}) for name in names}
    try:
        return eval(compile(ast.Expression(annotation), "<annotation>", "eval"), {"__builtins__": {}}, namespace)
    except Exception as error:  # a form this module does not know
        raise SourceNotReadable(f"annotation {ast.unparse(annotation)}: {error}") from error


def _cached_imported_fields() -> dict[str, str]:
    from importlib import metadata

    from tuneline.core.config.reading import cache_root

    cache_file = cache_root() / f"trainer-arguments-{metadata.version('transformers')}.json"
    try:
        return json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        kinds = imported_fields()
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
        tmp.write_text(json.dumps(kinds), encoding="utf-8")
        os.replace(tmp, cache_file)
        return kinds


def imported_fields() -> dict[str, str]:
    """The same table from the imported dataclass (seconds)."""
    from transformers import Seq2SeqTrainingArguments

    hints = typing.get_type_hints(Seq2SeqTrainingArguments)
    return {f.name: simple_kind(hints[f.name]) for f in dataclasses.fields(Seq2SeqTrainingArguments) if f.init}
