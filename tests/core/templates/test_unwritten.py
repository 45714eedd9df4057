"""Every template LLaMA-Factory 0.9.5 registers is either written by tuneline or refused by name with
what it is for and the way round; never an unknown template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.templates.catalog import TEMPLATES
from tuneline.core.templates.conversation import get_template
from tuneline.core.templates.unwritten import MEDIA_FORMATS, TEXT_FORMATS

LLAMAFACTORY = json.loads((Path(__file__).resolve().parents[2] / "data/llamafactory_templates.json").read_text())["templates"]


@pytest.mark.parametrize("name", sorted(LLAMAFACTORY))
def test_each_llamafactory_template_is_written_or_refused_with_its_reason(name: str):
    if name in TEMPLATES:
        assert get_template(name).name == name
        return
    with pytest.raises(ConfigError) as refused:
        get_template(name)
    message = str(refused.value)
    assert f"template '{name}'" in message and "unknown template" not in message
    assert "LLaMA-Factory 0.9.5" in message and "template: auto" in message
    # the media formats are named by family, the text ones as text formats: as LLaMA-Factory's own plugins say
    assert (name in MEDIA_FORMATS) == (LLAMAFACTORY[name] != "BasePlugin")


def test_the_refusal_lists_name_only_llamafactorys_templates():
    assert set(TEXT_FORMATS) | set(MEDIA_FORMATS) <= set(LLAMAFACTORY) - set(TEMPLATES)
    assert not set(TEXT_FORMATS) & set(MEDIA_FORMATS)


def test_a_misspelt_template_is_still_an_unknown_one_with_a_guess():
    with pytest.raises(ConfigError, match="unknown template 'qwen2_vll'; did you mean 'qwen2_vl'"):
        get_template("qwen2_vll")
