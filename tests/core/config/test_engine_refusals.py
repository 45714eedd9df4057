"""LLaMA-Factory's keys for engines tuneline does not run, Megatron-Core through MCoreAdapter (its
examples/megatron, which LLaMA-Factory runs with USE_MCA=1) and KTransformers (`use_kt` and its keys,
`infer_backend: ktransformers`), are refused in one paragraph per engine that names every key set and why,
never as unknown keys or as an unknown choice of a field; and no example config of LLaMA-Factory's meets either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tuneline.core.config import read_stage_config
from tuneline.core.config.llamafactory import REFUSED, REFUSED_KEYS, Refused
from tuneline.core.errors import ConfigError
from tuneline.core.stages.registry import build_stage_config

MEGATRON = next(refused for refused in REFUSED if refused.what.startswith("Megatron-Core"))
KTRANSFORMERS = next(refused for refused in REFUSED if refused.what.startswith("KTransformers"))
ENGINES = {"Megatron-Core": MEGATRON, "KTransformers": KTRANSFORMERS}
EXAMPLES_OF_ENGINES = {
    "megatron/qwen2_vl_full.yaml": MEGATRON,
    "megatron/qwen3_moe_full.yaml": MEGATRON,
    "train_lora/deepseek2_lora_sft_kt.yaml": KTRANSFORMERS,
    "train_lora/deepseek3_lora_sft_kt.yaml": KTRANSFORMERS,
    "train_lora/qwen3moe_lora_sft_kt.yaml": KTRANSFORMERS,
    "inference/deepseek2_lora_sft_kt.yaml": KTRANSFORMERS,
    "inference/deepseek3_kt.yaml": KTRANSFORMERS,
    "inference/deepseek3_lora_sft_kt.yaml": KTRANSFORMERS,
    "inference/qwen3moe_lora_sft_kt.yaml": KTRANSFORMERS,
}


def example_configs(shared_dir: Path) -> dict[str, dict[str, Any]]:
    """LLaMA-Factory's example configs that name a model, by their path under examples/."""
    examples = shared_dir / "llamafactory" / "examples"
    configs = {path.relative_to(examples).as_posix(): yaml.safe_load(path.read_text(encoding="utf-8"))
               for path in sorted(examples.rglob("*.yaml"))}
    return {name: raw for name, raw in configs.items() if isinstance(raw, dict) and "model_name_or_path" in raw}


def asking(raw: dict[str, Any], engine: Refused) -> list[str]:
    """The `'key: value'` texts of `raw` that ask for `engine`."""
    return [f"'{key}: {value}'" for key, value in raw.items()
            if (key in engine.defaults and value != engine.defaults[key]) or value in engine.values.get(key, ())]


def test_no_example_config_meets_an_unknown_key_or_choice(shared_dir: Path):
    configs = example_configs(shared_dir)
    assert len(configs) == 62
    for name, raw in configs.items():
        _, problems = read_stage_config(raw)
        assert not [p for p in problems if "unknown key" in p or "choose one of" in p], name


def test_the_examples_of_engines_tuneline_does_not_run_are_refused_naming_the_engine(shared_dir: Path):
    configs = example_configs(shared_dir)
    using = {name for name, raw in configs.items() if any(asking(raw, engine) for engine in ENGINES.values())}
    assert using == set(EXAMPLES_OF_ENGINES)
    for name, engine in EXAMPLES_OF_ENGINES.items():
        raw = configs[name]
        with pytest.raises(ConfigError) as refused:
            build_stage_config(raw, source=name)
        mine = [p for p in refused.value.problems if engine.what in p]
        assert len(mine) == 1 and "which tuneline does not offer" in mine[0] and engine.why in mine[0], name
        keys = asking(raw, engine)
        assert len(keys) >= 2 and all(key in mine[0] for key in keys), (name, mine[0])
        assert mine[0].startswith(", ".join(keys[:-1]) + " and " + keys[-1] + " ask for "), mine[0]
        assert not [p for p in refused.value.problems if "unknown key" in p or "choose one of" in p], name
    megatron = configs["megatron/qwen3_moe_full.yaml"]
    print(f"megatron/qwen3_moe_full.yaml: {read_stage_config(megatron)[1][0]}")


def probe(default: Any) -> Any:
    """A value away from `default` of the kind the key takes."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 2
    if isinstance(default, str):
        return default + "_other"
    return {"seed": 1} if isinstance(default, dict) else 2


@pytest.mark.parametrize("engine", ENGINES, ids=str)
def test_each_key_of_an_engine_alone_is_refused_with_the_engine(engine: str):
    refused = ENGINES[engine]
    assert len(refused.defaults) == (48 if refused is MEGATRON else 14)  # use_mca and MCoreAdapter's 47; 6 + 8 KT keys
    for key, default in refused.defaults.items():
        assert REFUSED_KEYS[key] is refused
        assert read_stage_config({key: default})[1] == [], key  # at its default it asks for nothing
        value = probe(default)
        problems = read_stage_config({key: value})[1]
        assert problems == [f"'{key}: {value}' asks for {refused.what}, which tuneline does not offer ({refused.why}); "
                            f"{refused.instead}. Remove the key."], key


def test_infer_backend_ktransformers_is_the_ktransformers_refusal_not_a_choice():
    config, problems = read_stage_config({"infer_backend": "ktransformers"})
    assert problems == [f"'infer_backend: ktransformers' asks for {KTRANSFORMERS.what}, which tuneline does not offer "
                        f"({KTRANSFORMERS.why}); {KTRANSFORMERS.instead}. Remove the key."]
    assert "CUDA" in KTRANSFORMERS.why and "CUDA" in MEGATRON.why and "USE_MCA=1" in MEGATRON.why
    assert config.inference.infer_backend == "huggingface"  # the value is refused, never read
    _, problems = read_stage_config({"infer_backend": "tensorrt"})  # any other engine stays an unknown choice
    assert len(problems) == 1 and "choose one of huggingface, vllm, sglang" in problems[0]
