"""The documentation's reference tables and counts, written from the code's own tables.

    python docs/hooks/reference_tables.py            # exit 1, naming each block that differs from the code
    python docs/hooks/reference_tables.py --write    # rewrite those blocks in docs/*.md

A page marks a generated table with `<!-- generated: NAME -->` ... `<!-- end generated -->` and a
generated number with `<!-- count: NAME -->87<!-- end count -->`. The pages keep the generated text
(so they read whole on GitHub too), `mkdocs build` (this module is its hook, `hooks:` in mkdocs.yml)
fills every block from the code again and warns where the page's copy differs, which `--strict`
turns into a failure, and tests/docs/test_reference_tables.py compares the two without writing.

Hand-written tables of keys (a table whose first column is headed `key`) are checked instead: every
key their first column names must be one a stage config or a pipeline section reads. So are the
repository's files that a page names in backticks (`core/data/media/rows.py`, `tests/...`): each
must exist, at the repository's root or under `core/` (docs/ARCHITECTURE.md names them from there).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
COUNT = re.compile(r"(<!-- count: (?P<name>[a-z-]+) -->)(?P<body>[^<]*)(<!-- end count -->)")
REGENERATE = "python docs/hooks/reference_tables.py --write"
LLAMAFACTORY_TEMPLATES = 121  # the templates LLaMA-Factory 0.9.5 registers (tests/data/llamafactory_templates.json)


def _cell(text: str) -> str:
    """`text` inside one Markdown table cell: on one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


def _yaml_value(value: Any) -> str:
    """A default as a YAML file would write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value.strip() == value and value else json.dumps(value)
    if isinstance(value, (tuple, frozenset, set)):
        value = sorted(value) if not isinstance(value, tuple) else list(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _names(keys: list[str] | tuple[str, ...]) -> str:
    return ", ".join(_code(key) for key in keys)


def stage_kinds_table() -> str:
    from tuneline.core.stages.registry import KINDS

    rows = [(_code(kind.name), kind.summary, _code(kind.examples), _code(kind.output),
             _names(sorted(kind.references)) or "—", "yes" if kind.predicts else "—") for kind in KINDS.values()]
    return _table(("`stage`", "what it trains", "rows tokenized as", "output", "references it reads",
                   "`do_predict`"), rows)


def refused_stages_table() -> str:
    from tuneline.core.stages.registry import NOT_OFFERED

    rows = [(_code(name), why) for name, why in NOT_OFFERED.items()]
    return _table(("`stage`", "why, and what to use instead"), rows)


def templates_table() -> str:
    from tuneline.core.templates.catalog import TEMPLATES

    rows = [(_code(t.name), _code(t.media.plugin) if t.media else "—", "yes" if t.reasoning else "—",
             _code(t.tool_format)) for t in TEMPLATES.values()]
    return _table(("`template`", "media it expands", "reasoning", "`tool_format`"), rows)


def unwritten_templates_table() -> str:
    from tuneline.core.templates.unwritten import MEDIA_FORMATS, TEXT_FORMATS

    text = "a text format not written yet: `template: auto` is the way round"
    rows = [(_code(name), text) for name in sorted(TEXT_FORMATS)]
    rows += [(_code(name), f"the format of {family}, whose media tuneline does not expand yet")
             for name, family in sorted(MEDIA_FORMATS.items())]
    return _table(("LLaMA-Factory's `template`", "refused, because"), rows)


def refused_keys_table() -> str:
    from tuneline.core.config.llamafactory import REFUSED

    rows = []
    for refused in REFUSED:
        asking = [f"{key}: {value}" for key, values in refused.values.items() for value in values]
        what = refused.what + (f"; `{refused.command}` reads its keys" if refused.command else "")
        rows.append((what, _names(list(refused.defaults) + asking), refused.why or "—", refused.instead))
    return _table(("refused by name", "keys (and values) that ask for it", "why", "instead"), rows)


def needs_cuda_table() -> str:
    from tuneline.core.config.llamafactory import NEEDS_CUDA

    rows = [(table.what, _names(list(table.keys) + [f"{key}: {value}" for key, values in table.values.items()
                                                   for value in values])) for table in NEEDS_CUDA]
    return _table(("needs a CUDA GPU", "keys (and values) that ask for it"), rows)


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def keys_table() -> str:
    from tuneline.core.config.stage import GROUPS

    rows = []
    for group, config in GROUPS.items():
        for field in dataclasses.fields(config):
            default = _default(field)
            shown = "required" if default is dataclasses.MISSING else _code(_yaml_value(default))
            rows.append((_code(field.name), group, shown, field.metadata["help"]))
    return _table(("key", "group", "default", "what it does"), rows)


def stage_keys_table() -> str:
    from tuneline.core.stages.ignored_keys import STAGE_KEYS
    from tuneline.core.stages.registry import KINDS
    from tuneline.core.stages.stage_keys import READ_BY_NO_KIND

    rows = []
    for key in STAGE_KEYS:
        readers = [name for name, kind in KINDS.items() if key in kind.reads]
        rows.append((_code(key), ", ".join(readers) if readers else "none: " + READ_BY_NO_KIND.get(key, "—")))
    return _table(("key", "the stage kinds that read it"), rows)


TABLES: Mapping[str, Callable[[], str]] = {
    "stage-kinds": stage_kinds_table,
    "refused-stages": refused_stages_table,
    "templates": templates_table,
    "unwritten-templates": unwritten_templates_table,
    "refused-keys": refused_keys_table,
    "needs-cuda": needs_cuda_table,
    "keys": keys_table,
    "stage-keys": stage_keys_table,
}


def _count(name: str) -> int:
    from tuneline.core.config.stage import GROUPS
    from tuneline.core.stages.registry import KINDS
    from tuneline.core.templates.catalog import TEMPLATES
    from tuneline.core.templates.unwritten import MEDIA_FORMATS, TEXT_FORMATS

    counts = {"templates": len(TEMPLATES), "unwritten-templates": len(TEXT_FORMATS) + len(MEDIA_FORMATS),
              "llamafactory-written-templates": LLAMAFACTORY_TEMPLATES - len(TEXT_FORMATS) - len(MEDIA_FORMATS),
              "unwritten-text-templates": len(TEXT_FORMATS), "unwritten-media-templates": len(MEDIA_FORMATS),
              "stage-kinds": len(KINDS), "keys": sum(len(dataclasses.fields(config)) for config in GROUPS.values())}
    return counts[name]


def generate(markdown: str, *, source: str) -> str:
    """`markdown` with every generated block and count written from the code; an unknown name is a ValueError."""
    def table(match: re.Match[str]) -> str:
        if match["name"] not in TABLES:
            raise ValueError(f"{source}: no generated table '{match['name']}'; the tables are {', '.join(TABLES)}")
        return match.group(1) + TABLES[match["name"]]() + match.group(4)

    def count(match: re.Match[str]) -> str:
        try:
            return match.group(1) + str(_count(match["name"])) + match.group(4)
        except KeyError:
            raise ValueError(f"{source}: no generated count '{match['name']}'") from None

    return COUNT.sub(count, BLOCK.sub(table, markdown))


def stale_blocks(markdown: str, *, source: str) -> list[str]:
    """The generated blocks and counts of `markdown` whose text differs from the code's, by name."""
    fresh = generate(markdown, source=source)
    written = [(m["name"], m["body"]) for pattern in (BLOCK, COUNT) for m in pattern.finditer(markdown)]
    generated = [(m["name"], m["body"]) for pattern in (BLOCK, COUNT) for m in pattern.finditer(fresh)]
    return [name for (name, old), (_, new) in zip(written, generated) if old != new]


KEY_CELL = re.compile(r"`([a-z][a-z0-9_]*)(?::[^`]*)?`")


def known_keys() -> set[str]:
    """Every key a stage config reads (with transformers' trainer arguments and the keys refused by
    name) and every key of a pipeline's `evaluate`, `export` and `register` sections."""
    from tuneline.core.config.reading import valid_keys
    from tuneline.core.pipeline.spec import EvaluateSettings, ExportSettings, RegisterSettings

    sections = (EvaluateSettings, ExportSettings, RegisterSettings)
    return valid_keys() | {f.name for section in sections for f in dataclasses.fields(section)}


def unknown_keys(markdown: str, *, known: set[str]) -> list[str]:
    """The keys named in the first column of `markdown`'s hand-written key tables that no config reads."""
    unknown, in_key_table = [], False
    for line in BLOCK.sub("", markdown).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")] if line.startswith("|") else []
        if not cells:
            in_key_table = False
        elif cells[0] == "key":
            in_key_table = True
        elif in_key_table and not set(cells[0]) <= set("-: "):
            unknown += [key for key in KEY_CELL.findall(cells[0]) if key not in known]
    return unknown


CODE_SPAN = re.compile(r"`([^`\n]+)`")
REPOSITORY_PATH = re.compile(r"((?:core|tests|flows|tasks|data|benchmarks|deployments|docs)/[\w./-]*\w)(?::\s*\w+)?")


def missing_paths(markdown: str) -> list[str]:
    """The repository files or folders named in `markdown`'s code spans that do not exist."""
    root = DOCS.parent
    named = [m.group(1) for span in CODE_SPAN.findall(markdown) if (m := REPOSITORY_PATH.fullmatch(span))]
    return [path for path in dict.fromkeys(named) if not (root / path).exists() and not (root / "core" / path).exists()]


def pages() -> Iterator[Path]:
    yield from sorted(DOCS.glob("**/*.md"))


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    """mkdocs' hook: the page with its tables filled from the code, and a warning where its copy is stale."""
    import logging

    source, log = page.file.src_uri, logging.getLogger("mkdocs.hooks.reference_tables")
    stale = stale_blocks(markdown, source=source)
    if stale:
        log.warning("docs/%s: the generated %s differ from the code; run `%s`", source, ", ".join(stale), REGENERATE)
    unknown = unknown_keys(markdown, known=_known_keys_once())
    if unknown:
        log.warning("docs/%s: its key tables name keys that no config reads: %s", source, ", ".join(unknown))
    missing = missing_paths(markdown)
    if missing:
        log.warning("docs/%s: names files the repository does not hold: %s", source, ", ".join(missing))
    return generate(markdown, source=source)


@functools.cache
def _known_keys_once() -> frozenset[str]:
    return frozenset(known_keys())


def main(argv: list[str]) -> int:
    write = argv == ["--write"]
    if argv and not write:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    stale_pages = []
    for path in pages():
        text = path.read_text(encoding="utf-8")
        stale = stale_blocks(text, source=str(path.relative_to(DOCS)))
        if stale and write:
            path.write_text(generate(text, source=str(path)), encoding="utf-8")
        if stale:
            stale_pages.append(f"{path.relative_to(DOCS.parent)}: {', '.join(stale)}")
    for line in stale_pages:
        print(("rewritten: " if write else "differs from the code: ") + line)
    return 0 if write or not stale_pages else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
