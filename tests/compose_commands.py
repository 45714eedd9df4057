"""The services' commands of deployments/compose.yaml, as the tests run them on 127.0.0.1.

The compose file is the one place that says how each service starts. A test starter takes a service's
command from it (its `entrypoint` and `command`) and changes only what differs on a test machine: the
program's path, option values such as ports, folders and the listen address, and options of its own
appended at the end. Naming an option the compose file's command does not have is an error, so a
change there reaches the tests, and one the tests depend on cannot be made there unnoticed.

    command = service_command("mlflow", program=[mlflow], values={"--port": "5123"}, extra=["--no-ui"])
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

import yaml

DEPLOYMENTS = Path(__file__).resolve().parent.parent / "deployments"
COMPOSE_FILE = DEPLOYMENTS / "compose.yaml"
_INTERPOLATION = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


@cache
def compose_services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))["services"]


def compose_argv(service: str) -> list[str]:
    """The service's argv in its container: its entrypoint, when the compose file sets one, then its command."""
    entry = compose_services()[service]
    return [str(token) for token in [*entry.get("entrypoint", []), *entry["command"]]]


def service_command(service: str, *, program: Sequence[str], values: Mapping[str, str] | None = None,
                    extra: Sequence[str] = ()) -> list[str]:
    """The service's argv with its program replaced by `program`, each option of `values` given that
    value (`--name VALUE` and `-name=VALUE` forms both), and `extra` appended."""
    argv = compose_argv(service)
    command = [*program, *argv[1:]]
    for option, value in (values or {}).items():
        command = with_value(command, option, value, service=service)
    return [*command, *extra]


def with_value(command: list[str], option: str, value: str, *, service: str) -> list[str]:
    for i, token in enumerate(command):
        if token == option and i + 1 < len(command):
            return [*command[:i + 1], value, *command[i + 2:]]
        if token.startswith(f"{option}="):
            return [*command[:i], f"{option}={value}", *command[i + 1:]]
    raise KeyError(f"{COMPOSE_FILE}: the {service} service's command has no {option} option ({' '.join(command)}); "
                   "the tests set its value there, so put it back or change the test starter with it.")


def with_defaults(text: object) -> str:
    """A compose value as Compose interpolates it with no variable set: `${NAME:-default}` -> default."""
    return _INTERPOLATION.sub(lambda match: match.group(2) or "", str(text))
