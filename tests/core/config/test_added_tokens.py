"""The added-token keys as a config reads them: LLaMA-Factory's lists and token file, and the
problems of a file that cannot be read or of keys that cannot go together."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneline.core.config.added_tokens import added_tokens
from tuneline.core.errors import ConfigError
from tuneline.core.stages.registry import build_stage_config

TOKENS_CFG = "llamafactory/examples/extras/multi_tokens/tokens_cfg.yaml"


def _model(**values):
    return build_stage_config({"stage": "sft", **values}).model


def test_lists_and_the_example_token_file_give_the_tokens_in_order(shared_dir: Path):
    listed = added_tokens(_model(add_tokens="<think>, </think>,", add_special_tokens=" <|a|>,<|b|>"))
    assert listed.plain == ("<think>", "</think>") and listed.special == ("<|a|>", "<|b|>") and not listed.descriptions

    from_file = added_tokens(_model(new_special_tokens_config=str(shared_dir / TOKENS_CFG), init_special_tokens="desc_init"))
    assert from_file.plain == () and len(from_file.special) == 16
    assert from_file.special[:3] == ("<|START_OF_SVG|>", "<|END_OF_SVG|>", "<|start_of_g|>")
    assert from_file.descriptions["<|end_of_style|>"] == "Ends a style definition block"
    assert not added_tokens(_model())


@pytest.mark.parametrize(("content", "expected"), [
    (None, "does not exist"),
    ('"<|a|>": "one"\n"<|b|>: "unclosed\n', "is not valid YAML"),
    ("- <|a|>\n- <|b|>\n", "holds a list"),
    ("", "holds nothing"),
    ('"<|a|>": 3\n', "quote each token and each description"),
])
def test_a_token_file_that_cannot_be_used_names_the_key_and_the_file(tmp_path: Path, content, expected):
    path = tmp_path / "tokens.yaml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        _model(new_special_tokens_config=str(path))
    assert len(error.value.problems) == 1
    assert f"'new_special_tokens_config: {path}'" in error.value.problems[0] and expected in error.value.problems[0]


def test_keys_that_cannot_go_together(shared_dir: Path):
    with pytest.raises(ConfigError) as error:
        _model(new_special_tokens_config=str(shared_dir / TOKENS_CFG), add_special_tokens="<|a|>")
    assert "'new_special_tokens_config' and 'add_special_tokens'" in str(error.value)
    for init in ("desc_init", "desc_init_w_noise"):
        with pytest.raises(ConfigError) as error:
            _model(add_special_tokens="<|a|>", init_special_tokens=init)
        assert f"'init_special_tokens: {init}'" in str(error.value) and "new_special_tokens_config" in str(error.value)
