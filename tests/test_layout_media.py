"""The media columns are named in one place: no module of `core/`, `flows/` or `tasks/` outside
`core/data/media/` writes one of their names as a string; it imports the constant from
`core.data.media.columns` (docs/ARCHITECTURE.md, "data/media")."""

from __future__ import annotations

import ast
from pathlib import Path

from tuneline.core.data.media.columns import MEDIA_COLUMNS, MEDIA_TOKENS, PAIR_FILE_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
SEARCHED = ("core", "flows", "tasks")
MEDIA_PACKAGE = ROOT / "core" / "data" / "media"
MEDIA_NAMES = frozenset({*MEDIA_COLUMNS, *PAIR_FILE_COLUMNS.values(), MEDIA_TOKENS})


def media_literals(path: Path, *, root: Path = ROOT) -> list[str]:
    """Each string constant in `path` that is a media column's name, as `file:line "name"`."""
    text = path.read_text(encoding="utf-8")
    if not any(name in text for name in MEDIA_NAMES):  # most modules never mention media: no need to parse them
        return []
    tree = ast.parse(text)
    return [f"{path.relative_to(root)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MEDIA_NAMES]


def test_no_media_column_name_is_written_outside_the_media_package():
    files = [path for folder in SEARCHED for path in sorted((ROOT / folder).rglob("*.py"))
             if not path.is_relative_to(MEDIA_PACKAGE)]
    assert len(files) > 100
    found = [literal for path in files for literal in media_literals(path)]
    assert not found, "import the media column's constant from tuneline.core.data.media.columns instead:\n" + "\n".join(found)


def test_the_check_finds_a_column_name_in_a_dict_key_and_a_call(tmp_path: Path):
    written = tmp_path / "module.py"
    written.write_text('"""Holds images."""\nrow = {"videos": []}\nfiles = row.get("image_files")\nlabel = f"{1} audios"\n')
    assert media_literals(written, root=tmp_path) == ["module.py:2 'videos'", "module.py:3 'image_files'"]
