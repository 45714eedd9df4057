"""Loading the base model: dtype, attention, quantization, weight formats, remote code, hub ids."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.models.loading import apply_finetuning, load_model, trainable_summary


def dtypes(model, *, trainable: bool) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters() if p.requires_grad == trainable}


def test_dtype_follows_the_precision_keys_and_trainable_parameters_are_float32(tiny_base: Path):
    assert {p.dtype for p in load_model(tiny_base).parameters()} == {torch.float32}
    assert {p.dtype for p in load_model(tiny_base, training={"fp16": True}).parameters()} == {torch.float16}
    for finetuning in (FinetuningConfig(), FinetuningConfig(finetuning_type="freeze", freeze_trainable_layers=1)):
        model = apply_finetuning(load_model(tiny_base, training={"bf16": True}), finetuning)
        assert dtypes(model, trainable=True) == {torch.float32}
        assert dtypes(model, trainable=False) == {torch.bfloat16}


def test_attention_implementation_follows_flash_attn(tiny_base: Path):
    from transformers import AutoModelForCausalLM
    from transformers.utils import is_flash_attn_2_available

    def attention(flash_attn: str) -> str:
        return load_model(tiny_base, model=ModelConfig(flash_attn=flash_attn)).config._attn_implementation

    assert attention("disabled") == "eager"
    assert attention("sdpa") == "sdpa"
    assert attention("auto") == AutoModelForCausalLM.from_pretrained(tiny_base).config._attn_implementation
    if not is_flash_attn_2_available():
        with pytest.raises(ConfigError, match="'flash_attn: fa2' needs the flash-attn package"):
            attention("fa2")


def test_pickle_weights_are_refused_unless_allowed(tiny_base: Path, tmp_path: Path):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(tiny_base / "config.json", pickled)
    reference = load_model(tiny_base)
    torch.save(reference.state_dict(), pickled / "pytorch_model.bin")
    with pytest.raises(ConfigError) as refused:
        load_model(pickled)
    assert "holds only pickle weights (pytorch_model.bin)" in str(refused.value)
    assert "'allow_pickle_weights: true'" in str(refused.value)
    allowed = load_model(pickled, model=ModelConfig(allow_pickle_weights=True))
    assert all(torch.equal(p, q) for p, q in zip(allowed.state_dict().values(), reference.state_dict().values()))


def test_pickle_adapter_is_refused_unless_allowed(tiny_base: Path, tmp_path: Path):
    from safetensors.torch import load_file

    adapter = tmp_path / "adapter"
    torch.manual_seed(0)
    apply_finetuning(load_model(tiny_base), FinetuningConfig(lora_rank=4)).save_pretrained(adapter)
    torch.save(load_file(adapter / "adapter_model.safetensors"), adapter / "adapter_model.bin")
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"'adapter_name_or_path: .*' holds only pickle weights \(adapter_model.bin\)"):
        apply_finetuning(load_model(tiny_base), FinetuningConfig(), model_config=ModelConfig(adapter_name_or_path=str(adapter)))
    allowed = ModelConfig(adapter_name_or_path=str(adapter), allow_pickle_weights=True)
    assert "lora_A" in str(apply_finetuning(load_model(tiny_base), FinetuningConfig(), model_config=allowed))
    with pytest.raises(ConfigError, match="has no adapter_config.json"):
        apply_finetuning(load_model(tiny_base), FinetuningConfig(), model_config=ModelConfig(adapter_name_or_path=str(tmp_path)))


MODEL_CODE = '''
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM

Path({marker!r}).write_text("the model's own code ran")


class TinyCustomConfig(LlamaConfig):
    model_type = "tiny_custom"


class TinyCustomForCausalLM(LlamaForCausalLM):
    config_class = TinyCustomConfig
'''


def test_model_code_runs_only_with_trust_remote_code(tiny_base: Path, tmp_path: Path):
    folder, marker = tmp_path / "custom", tmp_path / "ran.txt"
    shutil.copytree(tiny_base, folder)
    (folder / "custom_model.py").write_text(MODEL_CODE.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="tiny_custom", auto_map={"AutoConfig": "custom_model.TinyCustomConfig",
                                                      "AutoModelForCausalLM": "custom_model.TinyCustomForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="ships its own model code, which runs only with 'trust_remote_code: true'"):
        load_model(folder)
    assert not marker.exists()
    assert type(load_model(folder, model=ModelConfig(trust_remote_code=True))).__name__ == "TinyCustomForCausalLM"
    assert marker.exists()


def test_unreachable_hub_id_is_a_config_error():
    expected = "'model_name_or_path: no-such-org/no-such-model' is neither a local folder nor reachable"
    with pytest.raises(ConfigError, match=expected):
        load_model("no-such-org/no-such-model")


def test_embeddings_grow_to_the_tokenizer_only(tiny_base: Path):
    assert load_model(tiny_base, vocab_size=1030).get_input_embeddings().num_embeddings == 1088  # in steps of 64 rows
    assert load_model(tiny_base, vocab_size=900).get_input_embeddings().num_embeddings == 1024
    # a quantized model's embeddings stay in full precision and grow the same way
    assert load_model(tiny_base, vocab_size=1030, model=ModelConfig(quantization_bit=4)).get_input_embeddings().num_embeddings == 1088


@pytest.mark.parametrize(("quant_type", "double"), [("nf4", True), ("fp4", False)])
def test_4bit_settings_reach_bitsandbytes_and_keep_the_training_layout(tiny_base: Path, quant_type: str, double: bool):
    from bitsandbytes.nn import Linear4bit

    model = load_model(tiny_base, model=ModelConfig(quantization_bit=4, quantization_type=quant_type, double_quantization=double))
    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    assert len(layers) == 14  # every linear layer of the two decoder layers; lm_head stays full precision
    assert {(m.weight.quant_state.quant_type, m.weight.quant_state.nested) for m in layers} == {(quant_type, double)}
    assert not any(m.support_avx512bf16_for_cpu for m in layers)


def test_8bit_and_unsupported_quantization_methods(tiny_base: Path):
    from bitsandbytes.nn import Linear8bitLt

    model = load_model(tiny_base, model=ModelConfig(quantization_bit=8))
    assert sum(isinstance(m, Linear8bitLt) for m in model.modules()) == 14
    with pytest.raises(ConfigError, match="'quantization_method: gptq' is not supported for on-the-fly quantization"):
        load_model(tiny_base, model=ModelConfig(quantization_bit=4, quantization_method="gptq"))


@pytest.mark.parametrize(("method", "package"), [("gptq", "optimum"), ("awq", "gptqmodel"), ("aqlm", "aqlm")])
def test_a_model_saved_quantized_without_its_package_is_a_config_error_naming_it(tiny_base: Path, tmp_path: Path,
                                                                               method: str, package: str):
    """transformers checks the package of a checkpoint's `quantization_config` before reading any
    weight; where it is missing, the message names the folder, the method and the package."""
    import importlib.util

    if importlib.util.find_spec(package):
        pytest.skip(f"{package} is installed here, so the {method} checkpoint gets past the package check")
    folder = tmp_path / method
    shutil.copytree(tiny_base, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": method, "bits": 4}}))
    with pytest.raises(ConfigError, match=rf"'model_name_or_path: {re.escape(str(folder))}' holds weights quantized with "
                                          rf"{method}, and loading them needs .*{package}"):
        load_model(folder)


def test_trainable_summary_counts_4bit_weights_as_the_values_they_hold(tiny_base: Path):
    full_precision = trainable_summary(apply_finetuning(load_model(tiny_base), FinetuningConfig()))
    quantized_config = ModelConfig(quantization_bit=4)
    quantized = trainable_summary(apply_finetuning(load_model(tiny_base, model=quantized_config), FinetuningConfig(),
                                                   model_config=quantized_config))
    assert re.fullmatch(r"trainable params: [\d,]+ \|\| all params: [\d,]+ \|\| trainable%: \d+\.\d{4}", quantized)
    assert quantized == full_precision == "trainable params: 16,384 || all params: 155,968 || trainable%: 10.5047"
