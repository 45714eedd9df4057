"""The tokenize stage's key follows every setting that changes the tokens: the added tokens, the
content of a new_special_tokens_config file (not its path) and split_special_tokens."""

from __future__ import annotations

from pathlib import Path

from tuneline.core.pipeline.keys import tokenize_key
from tuneline.core.pipeline.spec import TrainingStage
from tuneline.core.stages.registry import build_stage_config


def _key(**values) -> str:
    config = build_stage_config({"stage": "sft", "dataset": "demo_alpaca", "template": "default", **values})
    key, _ = tokenize_key(TrainingStage(name="sft", parent=None, config=config), tokenizer_key="tok", fingerprints={})
    return key


def test_the_tokenize_key_changes_with_the_tokens_and_how_they_split(tmp_path: Path):
    first, moved, changed = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"
    first.write_text('"<|a|>": "first token"\n', encoding="utf-8")
    moved.write_text('"<|a|>": "first token"\n', encoding="utf-8")
    changed.write_text('"<|a|>": "another description"\n', encoding="utf-8")
    keys = {
        "plain": _key(),
        "add_tokens": _key(add_tokens="<think>"),
        "add_special_tokens": _key(add_special_tokens="<think>"),
        "split_special_tokens": _key(split_special_tokens=True),
        "token file": _key(new_special_tokens_config=str(first)),
        "changed token file": _key(new_special_tokens_config=str(changed)),
    }
    assert len(set(keys.values())) == len(keys), keys
    assert _key(new_special_tokens_config=str(moved)) == keys["token file"]  # the same tokens from another path
    assert _key(add_tokens="<think>") == keys["add_tokens"]
