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

import dataclasses
import importlib.util
import io
import json
import keyword
import os
import re
import tokenize
import typing
from functools import cache
from pathlib import Path
from typing import Any

from tuneline.core.config.machine_cache import cache_root

_SIMPLE_TYPES = {"bool": bool, "int": int, "float": float, "str": str}
# the classes in their files, base first; a subclass's fields follow its base's, as in a dataclass
_SOURCES = (("training_args.py", "TrainingArguments"), ("training_args_seq2seq.py", "Seq2SeqTrainingArguments"))
# what the annotations may name beyond transformers' own classes (which stand for themselves)
_KNOWN_NAMES: dict[str, Any] = {**_SIMPLE_TYPES, "Any": Any, "Literal": typing.Literal, "Optional": typing.Optional,
                                "Union": typing.Union, "list": list, "dict": dict, "tuple": tuple, "type": type}


class SourceNotReadable(Exception):
    """transformers' source is not the dataclasses this module expects."""


@cache
def training_fields() -> dict[str, Any]:
    """Init fields of `Seq2SeqTrainingArguments`, each mapped to the simple type it takes (bool,
    int, float, str) or `Any` when it takes something richer (enums, unions, lists)."""
    try:
        kinds = fields_from_source(transformers_folder())
    except (OSError, SyntaxError, tokenize.TokenError, SourceNotReadable):
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
        for name, annotation, value in class_statements((folder / file_name).read_text(encoding="utf-8"), class_name, file_name):
            if not re.search(r"\binit\s*=\s*False\b", value):  # field(init=False) is no argument
                kinds[name] = simple_kind(_evaluate(annotation))
    if "output_dir" not in kinds or "predict_with_generate" not in kinds:
        raise SourceNotReadable("the dataclasses lack fields every version has")
    return kinds


def class_statements(source: str, class_name: str, file_name: str) -> list[tuple[str, list[tokenize.TokenInfo], str]]:
    """(name, annotation tokens, value text) of each `name: annotation [= value]` directly in the body of
    top-level class `class_name`. Python's `tokenize` reads it: the interpreter's own AST conversion
    is not thread-safe in Python 3.11 (two threads parsing at once fail with "AST constructor
    recursion depth mismatch"), and a pipeline builds its stages' configs in threads."""
    logical: list[tuple[int, list[tokenize.TokenInfo]]] = []  # each logical line with its indentation level
    current: list[tokenize.TokenInfo] = []
    level = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.INDENT:
            level += 1
        elif token.type == tokenize.DEDENT:
            level -= 1
        elif token.type == tokenize.NEWLINE:
            logical.append((level, current))
            current = []
        elif token.type not in (tokenize.NL, tokenize.COMMENT):
            current.append(token)
    starts = [index for index, (indent, tokens) in enumerate(logical)
              if indent == 0 and [t.string for t in tokens[:2]] == ["class", class_name]]
    if len(starts) != 1:
        raise SourceNotReadable(f"{file_name} defines {class_name} {len(starts)} times")
    lines = []
    for indent, tokens in logical[starts[0] + 1:]:
        if indent == 0:
            break
        if indent == 1:  # deeper lines are the bodies of its methods
            lines.append(tokens)
    statements = []
    for tokens in lines:
        if len(tokens) > 2 and tokens[0].type == tokenize.NAME and tokens[1].string == ":":
            depth, equals = 0, len(tokens)
            for index, token in enumerate(tokens[2:], start=2):
                if token.type == tokenize.OP and token.string in ("(", "[", "{"):
                    depth += 1
                elif token.type == tokenize.OP and token.string in (")", "]", "}"):
                    depth -= 1
                if depth == 0 and token.string == "=":
                    equals = index
                    break
            statements.append((tokens[0].string, tokens[2:equals], " ".join(t.string for t in tokens[equals + 1:])))
    return statements


def simple_kind(hint: Any) -> str:
    """What `typing.get_type_hints` makes of a field, as its table has it: its one type besides None
    when that is a simple type (a `list[str]` counts as its item's type, as `typing.get_args` has it)."""
    options = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    simple = [name for name, kind in _SIMPLE_TYPES.items() if options == [kind]]
    return simple[0] if simple else "any"


def _evaluate(annotation: list[tokenize.TokenInfo]) -> Any:
    """The annotation as an object: known names as themselves, any other name a class of its own (a
    `ClassVar[...]`, which is no field, fails here too)."""
    text = " ".join(token.string for token in annotation)
    if any(token.string == "." for token in annotation):
        raise SourceNotReadable(f"annotation {text} names an attribute")
    names = {token.string for token in annotation if token.type == tokenize.NAME and not keyword.iskeyword(token.string)}
    namespace = {name: _KNOWN_NAMES[name] if name in _KNOWN_NAMES else type(name, (), {}) for name in names}
    try:
        return eval(text, {"__builtins__": {}}, namespace)
    except Exception as error:  # a form this module does not know
        raise SourceNotReadable(f"annotation {text}: {error}") from error


def _cached_imported_fields() -> dict[str, str]:
    from importlib import metadata

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
