"""Stage keys stand for the code that computes the results: the digest covers every module of the library,
so changing a training module (not only the store's own) gives every stage a new key."""

from __future__ import annotations

from pathlib import Path

from tuneline.core.store.fingerprints import LIBRARY_ROOT, code_digest, source_digest


def test_the_digest_covers_the_whole_library():
    assert (LIBRARY_ROOT / "stages" / "registry.py").is_file() and (LIBRARY_ROOT / "store" / "fingerprints.py").is_file()
    assert code_digest() == source_digest(LIBRARY_ROOT)


def test_a_change_to_any_module_or_its_place_changes_the_digest(tmp_path: Path):
    (tmp_path / "store").mkdir()
    (tmp_path / "training").mkdir()
    (tmp_path / "store" / "keys.py").write_text("KEY = 1\n")
    trainer = tmp_path / "training" / "trainer.py"
    trainer.write_text("STEPS = 3\n")
    before = source_digest(tmp_path)
    trainer.write_text("STEPS = 4\n")
    changed = source_digest(tmp_path)
    trainer.rename(tmp_path / "store" / "trainer.py")
    moved = source_digest(tmp_path)
    (tmp_path / "store" / "notes.txt").write_text("not code")
    assert len({before, changed, moved}) == 3 and source_digest(tmp_path) == moved
