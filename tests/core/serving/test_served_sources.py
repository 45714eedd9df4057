"""What `tuneline api`/`webchat`/`chat` serve: LLaMA-Factory's inference YAMLs read (model, adapter,
template, generation keys as defaults), folders resolved as `tuneline chat` resolves them, and the
engines refused with what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuneline.core.errors import ConfigError
from tuneline.core.serving.backends import backend_problems
from tuneline.core.serving.sources import served_model


def write_yaml(folder: Path, **keys) -> str:
    path = folder / "infer.yaml"
    path.write_text(yaml.safe_dump(keys))
    return str(path)


def adapter_folder(folder: Path, base: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


def test_llamafactory_inference_yaml_names_model_adapter_template_and_defaults(tmp_path: Path):
    adapter = adapter_folder(tmp_path / "saves" / "lora", "meta-llama/Meta-Llama-3-8B-Instruct")
    target = write_yaml(tmp_path, model_name_or_path="meta-llama/Meta-Llama-3-8B-Instruct", adapter_name_or_path=str(adapter),
                        template="llama3", infer_backend="huggingface", trust_remote_code=True, temperature=0.3,
                        default_system="Be kind.")
    served = served_model(target, overrides=["max_new_tokens=12"])
    assert (served.source.model, served.source.adapter, served.source.tokenizer) == (
        "meta-llama/Meta-Llama-3-8B-Instruct", adapter, str(adapter))
    assert served.template == "llama3" and served.keys.default_system == "Be kind." and served.model_config.trust_remote_code
    assert (served.generating.temperature, served.generating.max_new_tokens, served.name) == (0.3, 12, "lora")


def test_the_shipped_llamafactory_examples_read_or_name_what_is_missing(shared_dir: Path):
    examples = shared_dir / "llamafactory" / "examples" / "inference"
    hub = served_model(str(examples / "llama3.yaml"))
    assert hub.source.model == "meta-llama/Meta-Llama-3-8B-Instruct" and hub.template == "llama3"
    with pytest.raises(ConfigError, match="'adapter_name_or_path: saves/llama3-8b/lora/sft' holds no adapter_config.json"):
        served_model(str(examples / "llama3_lora_sft.yaml"))
    with pytest.raises(ConfigError) as raised:
        served_model(str(examples / "deepseek3_kt.yaml"))
    assert raised.value.problems == [problem for problem in raised.value.problems if "KTransformers" in problem]
    assert "'infer_backend: ktransformers', 'use_kt: True' and 'kt_optimize_rule: " in str(raised.value)
    assert "ask for KTransformers' CPU offloading" in str(raised.value) and "unknown" not in str(raised.value)


def test_folders_and_their_mistakes(tmp_path: Path):
    adapter = adapter_folder(tmp_path / "out", "base-model")
    served = served_model(str(adapter), template="chatml", overrides=["temperature=0.1"])
    assert (served.source.adapter, served.template, served.generating.temperature, served.name) == (adapter, "chatml", 0.1, "out")
    with pytest.raises(ConfigError, match="api TARGET '.*nowhere' does not exist"):
        served_model(str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="model_name_or_path set as an override"):
        served_model(str(adapter), overrides=["model_name_or_path=x"])
    with pytest.raises(ConfigError, match="'model_name_or_path' is not set"):
        served_model(write_yaml(tmp_path, template="chatml"))
    with pytest.raises(ConfigError, match="names 2 adapters; serving applies one"):
        served_model(write_yaml(tmp_path, model_name_or_path="m", adapter_name_or_path="a,b"))
    with pytest.raises(ConfigError, match="unknown key 'temprature'; did you mean 'temperature'"):
        served_model(write_yaml(tmp_path, model_name_or_path="m", temprature=0.5))


def test_gpu_engines_are_refused_with_what_is_missing(tmp_path: Path):
    missing = backend_problems("vllm", has_package=lambda _: False, has_cuda=lambda: False)
    assert [p.split(" needs ")[1][:20] for p in missing] == ["the vllm package, wh", "a CUDA GPU, and this"]
    assert "not driven by this version" in backend_problems("sglang", has_package=lambda _: True, has_cuda=lambda: True)[0]
    assert backend_problems("huggingface") == []
    with pytest.raises(ConfigError, match="'infer_backend: vllm' (needs|is not driven)"):  # which, depends on the machine
        served_model(write_yaml(tmp_path, model_name_or_path="m", infer_backend="vllm"))
