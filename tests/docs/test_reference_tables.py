"""The documentation's generated tables and counts are the code's (docs/hooks/reference_tables.py).

Nothing is written: each page's copy is compared with what the generator makes of the code now, and
each table is checked to hold every entry of the code's table it is written from.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re

import pytest

from conftest import REPO_ROOT

DOCS = REPO_ROOT / "docs"


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("reference_tables", DOCS / "hooks/reference_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first_column(table: str) -> set[str]:
    """The names in backticks in the first cell of each row of a generated table."""
    return {m for row in table.splitlines()[2:] for m in re.findall(r"`([^`]+)`", row.split(" | ")[0])}


def test_pages_hold_the_tables_the_code_gives(generator):
    stale = {page.name: generator.stale_blocks(page.read_text(encoding="utf-8"), source=page.name)
             for page in generator.pages()}
    differing = {page: names for page, names in stale.items() if names}
    assert not differing, f"generated blocks differ from the code: {differing}; run `{generator.REGENERATE}`"


def test_every_table_and_count_is_used_on_a_page(generator):
    text = "".join(page.read_text(encoding="utf-8") for page in generator.pages())
    used = {m["name"] for pattern in (generator.BLOCK, generator.COUNT) for m in pattern.finditer(text)}
    assert set(generator.TABLES) <= used
    assert {"templates", "unwritten-templates", "keys"} <= used


def test_a_page_whose_copy_differs_is_named(generator):
    page = (DOCS / "templates.md").read_text(encoding="utf-8")
    edited = page.replace("| `alpaca` |", "| `alpaca_old` |", 1)
    edited = edited.replace("<!-- count: templates -->", "<!-- count: templates -->1", 1)
    assert edited != page
    assert generator.stale_blocks(edited, source="templates.md") == ["templates", "templates"]
    with pytest.raises(ValueError, match="no generated table 'tempaltes'"):
        generator.generate("<!-- generated: tempaltes -->\n<!-- end generated -->", source="x.md")


def test_tables_hold_every_entry_of_the_code(generator):
    from tuneline.core.config.llamafactory import NEEDS_CUDA, REFUSED
    from tuneline.core.config.stage import GROUPS
    from tuneline.core.stages.ignored_keys import STAGE_KEYS
    from tuneline.core.stages.registry import KINDS, NOT_OFFERED
    from tuneline.core.templates.catalog import TEMPLATES
    from tuneline.core.templates.unwritten import MEDIA_FORMATS, TEXT_FORMATS

    assert first_column(generator.stage_kinds_table()) == set(KINDS)
    assert first_column(generator.refused_stages_table()) == set(NOT_OFFERED)
    assert first_column(generator.templates_table()) == set(TEMPLATES)
    assert first_column(generator.unwritten_templates_table()) == TEXT_FORMATS | set(MEDIA_FORMATS)
    fields = {f.name for config in GROUPS.values() for f in dataclasses.fields(config)}
    assert first_column(generator.keys_table()) == fields
    assert first_column(generator.stage_keys_table()) == set(STAGE_KEYS)
    refused = generator.refused_keys_table()
    assert all(f"`{key}`" in refused for table in REFUSED for key in table.defaults)
    cuda = generator.needs_cuda_table()
    assert all(f"`{key}`" in cuda for table in NEEDS_CUDA for key in table.keys)


def test_a_default_is_written_as_yaml(generator):
    assert [generator._yaml_value(v) for v in (None, True, "", " x", 0.5, ("a", "b"))] == \
        ["null", "true", '""', '" x"', "0.5", '["a", "b"]']


def test_hand_written_key_tables_name_only_keys_a_config_reads(generator):
    known = generator.known_keys()
    unknown = {page.name: generator.unknown_keys(page.read_text(encoding="utf-8"), known=known)
               for page in generator.pages()}
    assert not any(unknown.values()), {page: keys for page, keys in unknown.items() if keys}
    table = ("| key | meaning |\n| --- | --- |\n| `lora_rank` | r |\n| `finetuning_type: oft`, `lora_rnak` | x |\n"
             "\n| `nope` | y |\n")
    assert generator.unknown_keys(table, known=known) == ["lora_rnak"]


def test_pages_name_only_files_the_repository_holds(generator):
    missing = {page.name: generator.missing_paths(page.read_text(encoding="utf-8")) for page in generator.pages()}
    assert not any(missing.values()), {page: paths for page, paths in missing.items() if paths}
    text = "`core/data/media/rows.py`, `core/data/media_rows.py`, `data/readers.py: read_rows`, `row 3 of data/x.jsonl`"
    assert generator.missing_paths(text) == ["core/data/media_rows.py"]
