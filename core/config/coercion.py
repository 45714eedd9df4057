"""YAML values to the types the config dataclasses declare, with an error saying what was expected."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal


def coerce_fields(group: type, values: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """`values` coerced to the annotated field types of dataclass `group`; problems appended."""
    return coerce_all(values, typing.get_type_hints(group), problems)


def coerce_all(values: dict[str, Any], types_by_key: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    coerced = {}
    for key, value in values.items():
        try:
            coerced[key] = coerce(value, types_by_key[key])
        except (TypeError, ValueError) as e:
            problems.append(f"'{key}': {e}")
    return coerced


def coerce(value: Any, hint: Any) -> Any:
    """`value` converted to the annotated type, or TypeError/ValueError saying what was expected."""
    if value is None or hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        errors = []
        for option in options:
            try:
                return coerce(value, option)
            except (TypeError, ValueError) as e:
                errors.append(str(e))
        raise ValueError(errors[0] if len(errors) == 1 else f"got {value!r}, which fits none of {hint}")
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ValueError(f"got {value!r}; choose one of {', '.join(map(str, choices))}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise TypeError(f"expected true or false, got {value!r}")
    if hint in (int, float):
        if isinstance(value, bool):
            raise TypeError(f"expected a number, got {value!r}")
        try:
            number = float(value) if isinstance(value, str) else value
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
        if not isinstance(number, (int, float)):
            raise TypeError(f"expected a number, got {value!r}")
        if hint is int and float(number) != int(number):
            raise ValueError(f"expected a whole number, got {value!r}")
        return hint(number)
    if hint is str:
        if isinstance(value, (dict, list)):
            raise TypeError(f"expected a string, got {value!r}")
        return str(value)
    return value  # enums, lists and dicts: the consumer (TrainingArguments) validates them
