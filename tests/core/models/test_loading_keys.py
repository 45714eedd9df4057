"""LLaMA-Factory's model-loading, precision and method keys on the tiny model: each changes what it
names (the config, the dtypes, the weights, the optimizer's groups, the saved files), checked on
the loaded model itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.models.config_patches import scale_rope
from tuneline.core.models.loading import apply_finetuning, load_model

# What LLaMA-Factory 0.9.5's configure_rope sets on a model of 1024 positions for (rope_scaling,
# model_max_length), printed by running it on such a config: the factor, the new length and the
# extra keys. (It leaves out rope_theta, which transformers 5 needs; tuneline keeps the model's.)
LLAMAFACTORY_ROPE = {
    ("linear", 2500): (3.0, 3072, {}),
    ("linear", None): (2.0, 2048, {}),
    ("dynamic", 2500): (3.0, 3072, {"original_max_position_embeddings": 1024}),
    ("yarn", 4096): (4.0, 4096, {"original_max_position_embeddings": 1024}),
    ("llama3", 2500): (3.0, 3072, {"original_max_position_embeddings": 1024, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0}),
}


@pytest.mark.parametrize(("rope", "length"), sorted(LLAMAFACTORY_ROPE, key=str))
def test_rope_scaling_sets_the_config_llamafactory_sets(tiny_base: Path, rope: str, length: int | None):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_base)
    theta = config.rope_parameters["rope_theta"]
    scale_rope(config, rope, model_max_length=length)
    factor, positions, extra = LLAMAFACTORY_ROPE[rope, length]
    assert config.max_position_embeddings == positions
    assert config.rope_parameters == {"rope_type": rope, "factor": factor, "rope_theta": theta, **extra}


def test_rope_scaling_reaches_the_loaded_model_and_is_left_off_for_a_length_it_takes(tiny_base: Path, capsys):
    plain = load_model(tiny_base)
    scaled = load_model(tiny_base, model=ModelConfig(rope_scaling="linear"), model_max_length=3000, trainable=True)
    assert scaled.config.max_position_embeddings == 3072
    # linear scaling divides every rotary frequency by the factor
    assert torch.allclose(scaled.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq / 3.0)
    unscaled = load_model(tiny_base, model=ModelConfig(rope_scaling="linear"), model_max_length=512, trainable=True)
    assert unscaled.config.max_position_embeddings == 1024
    assert torch.equal(unscaled.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq)
    assert "left unscaled" in capsys.readouterr().out


def test_rope_scaling_leaves_a_long_context_model_as_it_is_for_a_length_within_it():
    """Llama 3.1's config (llama3 RoPE, 8192 -> 131072 positions): 16384 tokens fit, as LLaMA-Factory measures."""
    from transformers import LlamaConfig

    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "rope_theta": 500000.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config = LlamaConfig(max_position_embeddings=131072, rope_parameters=dict(llama3))
    scale_rope(config, "linear", model_max_length=16384)
    assert config.max_position_embeddings == 131072 and config.rope_parameters == llama3
    scale_rope(config, "linear", model_max_length=200000)
    assert config.max_position_embeddings == 262144 and config.rope_parameters == {"rope_type": "linear", "factor": 2.0,
                                                                                    "rope_theta": 500000.0}


def test_rope_scaling_on_a_model_without_rope_names_the_key():
    from transformers import GPT2Config

    with pytest.raises(ConfigError, match="'rope_scaling: linear' needs a model with rotary position embeddings"):
        scale_rope(GPT2Config(), "linear", model_max_length=4096)


def test_precision_keys_upcast_norms_and_logits_turn_off_the_cache_and_print_the_parameters(tiny_base: Path, capsys):
    keys = ModelConfig(upcast_layernorm=True, upcast_lmhead_output=True, print_param_status=True)
    bf16 = {"bf16": True}
    model = apply_finetuning(load_model(tiny_base, model=keys, training=bf16, trainable=True), FinetuningConfig(),
                             model_config=keys, training=bf16)
    plain = apply_finetuning(load_model(tiny_base, training=bf16, trainable=True), FinetuningConfig(), training=bf16)
    norms = {name: p.dtype for name, p in model.named_parameters() if "norm" in name}
    assert len(norms) == 5 and set(norms.values()) == {torch.float32}  # two per layer and the final one
    assert {p.dtype for name, p in plain.named_parameters() if "norm" in name} == {torch.bfloat16}
    assert model.get_submodule("base_model.model.model.layers.0.self_attn.q_proj.base_layer").weight.dtype == torch.bfloat16
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # how the trainer runs with bf16
        assert model(input_ids=ids).logits.dtype == torch.float32
        assert plain(input_ids=ids).logits.dtype == torch.bfloat16
    with torch.no_grad():  # generation runs without autocast: the float32 norms still fit the bf16 layers
        assert model.generate(input_ids=ids, max_new_tokens=2, do_sample=False).shape == (1, 6)
    assert model.config.use_cache is False
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("name: ")]
    assert len(lines) == len(list(model.named_parameters()))
    assert ("name: base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight, dtype: torch.float32, "
            "device: cpu, trainable: True") in lines
    assert "name: base_model.model.model.norm.weight, dtype: torch.float32, device: cpu, trainable: False" in lines


def test_train_from_scratch_starts_the_trained_model_from_random_weights_only(tiny_base: Path):
    checkpoint = load_model(tiny_base)
    torch.manual_seed(1)  # the tiny base is itself a random start, of seed 0
    scratch = load_model(tiny_base, model=ModelConfig(train_from_scratch=True), trainable=True)
    reference = load_model(tiny_base, model=ModelConfig(train_from_scratch=True))  # references load the checkpoint
    weights = dict(checkpoint.named_parameters())
    assert {name: p.shape for name, p in scratch.named_parameters()} == {name: p.shape for name, p in weights.items()}
    matrices = [name for name, p in weights.items() if p.ndim == 2]
    assert matrices and all(not torch.equal(scratch.get_parameter(name), weights[name]) for name in matrices)
    assert all(torch.equal(reference.get_parameter(name), p) for name, p in weights.items())


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> Path:
    """A two-expert Mixtral, the smallest that routes."""
    from transformers import MixtralConfig, MixtralForCausalLM

    path = tmp_path_factory.mktemp("tiny_moe")
    config = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1, num_local_experts=2, num_experts_per_tok=1)
    torch.manual_seed(0)
    MixtralForCausalLM(config).save_pretrained(path)
    return path


def test_moe_aux_loss_coef_weighs_the_router_loss_into_the_training_loss(tiny_moe: Path, tiny_base: Path):
    keys = ModelConfig(moe_aux_loss_coef=0.25)
    model = load_model(tiny_moe, model=keys, trainable=True)
    assert model.config.router_aux_loss_coef == 0.25 and model.config.output_router_logits is True
    assert load_model(tiny_moe, model=keys).config.output_router_logits is False  # only the trained model
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
        cross_entropy = model(input_ids=ids, labels=ids, output_router_logits=False).loss
    assert out.aux_loss > 0 and torch.allclose(out.loss, cross_entropy + 0.25 * out.aux_loss)
    with pytest.raises(ConfigError, match="'moe_aux_loss_coef: 0.25'.*'llama' model"):
        load_model(tiny_base, model=keys, trainable=True)


def test_moe_aux_loss_coef_reaches_dbrx_and_glm4v_moe_configs():
    """DBRX keeps its router weight in ffn_config, GLM-4.5V in its text model's config."""
    from transformers import DbrxConfig
    from transformers.models.glm4v_moe.configuration_glm4v_moe import Glm4vMoeConfig

    from tuneline.core.models.config_patches import set_router_loss

    dbrx, glm = DbrxConfig(), Glm4vMoeConfig()
    set_router_loss(dbrx, 0.3)
    set_router_loss(glm, 0.2)
    assert dbrx.ffn_config.moe_loss_weight == 0.3 and dbrx.output_router_logits is True
    assert glm.text_config.router_aux_loss_coef == 0.2 and glm.text_config.output_router_logits is True


def test_adapter_folder_loads_each_adapter_from_that_subfolder(tiny_base: Path, tmp_path: Path):
    torch.manual_seed(0)
    saved = apply_finetuning(load_model(tiny_base), FinetuningConfig(lora_rank=2))
    for name, parameter in saved.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_()
    saved.save_pretrained(tmp_path / "run" / "best")
    keys = ModelConfig(adapter_name_or_path=str(tmp_path / "run"), adapter_folder="best")
    loaded = apply_finetuning(load_model(tiny_base), FinetuningConfig(lora_rank=2), model_config=keys)
    expected = {name: p for name, p in saved.named_parameters() if "lora_" in name}
    assert expected and all(torch.equal(loaded.get_parameter(name), p) for name, p in expected.items())
    with pytest.raises(ConfigError, match="'adapter_folder: missing' is not a folder inside"):
        apply_finetuning(load_model(tiny_base), FinetuningConfig(), model_config=ModelConfig(
            adapter_name_or_path=str(tmp_path / "run"), adapter_folder="missing"))


def test_loraplus_lr_embedding_is_the_learning_rate_of_the_embedding_lora_group(tiny_base: Path, tmp_path: Path):
    from transformers import TrainingArguments

    from tuneline.core.models.loading import loraplus_optimizer

    finetuning = FinetuningConfig(lora_target="q_proj,embed_tokens", loraplus_lr_ratio=16.0, loraplus_lr_embedding=3e-5)
    model = apply_finetuning(load_model(tiny_base), finetuning)
    optimizer = loraplus_optimizer(model, finetuning=finetuning, args=TrainingArguments(str(tmp_path), learning_rate=1e-3,
                                                                                        report_to=[]))
    names = {id(p): name for name, p in model.named_parameters()}
    groups = {group["lr"]: {names[id(p)] for p in group["params"]} for group in optimizer.param_groups if group["params"]}
    assert groups[3e-5] and all("lora_embedding_" in name for name in groups[3e-5])
    assert all("q_proj.lora_A" in name for name in groups[1e-3]) and all("q_proj.lora_B" in name for name in groups[16e-3])


def test_ref_and_reward_model_quantization_bit_load_them_in_4_bits(tiny_base: Path, tmp_path: Path):
    from bitsandbytes.nn import Linear4bit

    from tuneline.core.models.loading import load_reward_model, load_tokenizer
    from tuneline.core.stages.preference import reference_model

    policy = apply_finetuning(load_model(tiny_base), FinetuningConfig(finetuning_type="full"))
    reference = reference_model(policy, FinetuningConfig(stage="dpo", finetuning_type="full", ref_model=str(tiny_base),
                                                         ref_model_quantization_bit=4))
    assert any(isinstance(m, Linear4bit) for m in reference.modules())
    assert not any(p.requires_grad for p in reference.parameters()) and not reference.training
    load_model(tiny_base, head="score").save_pretrained(tmp_path / "rm")
    load_tokenizer(tiny_base).save_pretrained(tmp_path / "rm")
    reward, _ = load_reward_model(tmp_path / "rm", model=ModelConfig(quantization_bit=4))
    assert any(isinstance(m, Linear4bit) for m in reward.modules())
    with torch.no_grad():
        assert reward(input_ids=torch.tensor([[5, 6, 7]])).logits.shape == (1, 1)


def test_export_writes_infer_dtype_weights_the_use_kv_cache_setting_and_scaled_rope(tiny_base: Path, tmp_path: Path):
    from safetensors import safe_open

    from tuneline.core.pipeline.stage_runs import export_folder, export_length
    from tuneline.core.stages.registry import build_stage_config

    export = export_folder(build_stage_config({
        "model_name_or_path": str(tiny_base), "export_dir": str(tmp_path / "export"), "template": "default", "export_size": 1,
        "infer_dtype": "bfloat16", "use_kv_cache": False, "rope_scaling": "yarn"}))
    config = json.loads((export / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["use_cache"] is False
    assert config["max_position_embeddings"] == 2048 and config["rope_parameters"]["factor"] == 2.0
    # LLaMA-Factory's export scales to cutoff_len only when it was set and the merge runs on the CPU
    assert export_length(build_stage_config({"cutoff_len": 4096})) == 4096
    assert export_length(build_stage_config({})) is None
    assert export_length(build_stage_config({"cutoff_len": 4096, "export_device": "auto"})) is None
    with safe_open(str(export / "model.safetensors"), framework="pt") as weights:
        assert {weights.get_tensor(name).dtype for name in weights.keys()} == {torch.bfloat16}


def test_an_auto_dtype_export_and_a_merge_write_the_dtype_the_base_was_saved_in(tiny_base: Path, tmp_path: Path):
    """A CPU loads every model in float32; LLaMA-Factory's export writes the saved dtype all the same."""
    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from tuneline.core.models.export import auto_export_dtype
    from tuneline.core.pipeline.stage_runs import export_folder, merge_into
    from tuneline.core.stages.registry import build_stage_config

    base = tmp_path / "bf16"
    load_model(tiny_base).to(torch.bfloat16).save_pretrained(base)
    AutoTokenizer.from_pretrained(tiny_base).save_pretrained(base)
    assert auto_export_dtype(base) == torch.bfloat16 and auto_export_dtype(tiny_base) == torch.float32  # float32 on a CPU
    adapter = get_peft_model(load_model(base), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    adapter.save_pretrained(tmp_path / "adapter")
    AutoTokenizer.from_pretrained(tiny_base).save_pretrained(tmp_path / "adapter")
    merge_into(tmp_path / "merged", start_model=str(base), adapter=str(tmp_path / "adapter"))
    export = export_folder(build_stage_config({"model_name_or_path": str(base), "export_dir": str(tmp_path / "export"),
                                               "template": "default", "export_size": 1}))
    for folder in (tmp_path / "merged", export):
        with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
            assert {weights.get_tensor(name).dtype for name in weights.keys()} == {torch.bfloat16}, folder


def test_a_merge_keeps_the_rope_scaling_its_adapter_trained_with(tiny_base: Path, tmp_path: Path):
    """The pipeline's merge of a stage trained with rope_scaling at cutoff_len 3000 (1024 positions)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    from tuneline.core.pipeline.stage_runs import merge_into

    adapter = get_peft_model(load_model(tiny_base), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    adapter.save_pretrained(tmp_path / "adapter")
    AutoTokenizer.from_pretrained(tiny_base).save_pretrained(tmp_path / "adapter")
    merge_into(tmp_path / "merged", start_model=str(tiny_base), adapter=str(tmp_path / "adapter"),
               model_config=ModelConfig(rope_scaling="linear"), model_max_length=3000)
    config = json.loads((tmp_path / "merged/config.json").read_text())
    assert config["max_position_embeddings"] == 3072 and config["rope_parameters"]["rope_type"] == "linear"
    assert config["rope_parameters"]["factor"] == 3.0
    merge_into(tmp_path / "plain", start_model=str(tiny_base), adapter=str(tmp_path / "adapter"))
    assert json.loads((tmp_path / "plain/config.json").read_text())["max_position_embeddings"] == 1024


def test_a_resumed_pissa_convert_run_without_its_starting_adapter_stops_before_training(tmp_path: Path):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from tuneline.core.training.pissa_conversion import PissaConversion

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    with pytest.raises(ConfigError, match="'pissa_convert: true' needs the adapter as PiSSA started it"):
        PissaConversion().on_train_begin(args, TrainerState(global_step=4), TrainerControl(), model=None)


@pytest.mark.slow
def test_pissa_convert_saves_a_plain_lora_adapter_equal_to_the_trained_pissa_model(tiny_base: Path, tmp_path: Path):
    """A few Trainer steps with the fast SVD (pissa_iter 2): the converted adapter, on the unchanged
    base, computes what the trained PiSSA model computes."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.training.callbacks import loop_callbacks

    finetuning = FinetuningConfig(lora_rank=4, pissa_init=True, pissa_iter=2, pissa_convert=True)
    torch.manual_seed(0)
    model = apply_finetuning(load_model(tiny_base, trainable=True), finetuning)
    assert model.peft_config["default"].init_lora_weights == "pissa_niter_2"
    tokenizer = load_tokenizer(tiny_base)
    rows = Dataset.from_dict({"input_ids": [tokenizer("a short demo text to learn, again and again")["input_ids"]] * 8})
    args = TrainingArguments(str(tmp_path / "out"), max_steps=3, learning_rate=1e-2, per_device_train_batch_size=4,
                             report_to=[], save_strategy="no", use_cpu=True)
    Trainer(model=model, args=args, train_dataset=rows, data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
            callbacks=loop_callbacks(finetuning)).train()
    ids = torch.tensor([rows[0]["input_ids"]])
    model.eval()
    with torch.no_grad():
        trained = model(input_ids=ids).logits
        converted = PeftModel.from_pretrained(load_model(tiny_base), str(tmp_path / "out/pissa_converted")).eval()
        assert torch.allclose(converted(input_ids=ids).logits, trained, atol=1e-4)
        assert not torch.allclose(load_model(tiny_base)(input_ids=ids).logits, trained, atol=1e-2)  # training moved it
        assert torch.equal(model(input_ids=ids).logits, trained)  # converting left the trained model as it was
    saved = json.loads((tmp_path / "out/pissa_converted/adapter_config.json").read_text())
    assert not list((tmp_path / "out").glob(".*.partial"))  # both folders renamed into place
    assert saved["r"] == 8 and saved["init_lora_weights"] is True



def test_the_stage_cutoff_reaches_the_policy_and_its_reference_as_ropes_training_length(tiny_base: Path, tmp_path: Path):
    """cutoff_len travels in the job (as LLaMA-Factory's model_max_length) to the loaders of the stage kinds."""
    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.pipeline.stage_runs import train_job
    from tuneline.core.stages.kind import ModelRequest
    from tuneline.core.stages.preference import reference_model
    from tuneline.core.stages.registry import build_stage_config, stage_kind
    from tuneline.core.training.job import TrainJob

    config = build_stage_config({"stage": "dpo", "finetuning_type": "full", "cutoff_len": 2500, "rope_scaling": "dynamic",
                                 "ref_model": str(tiny_base)})
    job = TrainJob.read(train_job(config, start_model=str(tiny_base), dataset_path="data", output_dir="out",
                                  training={}).write(tmp_path / "job.json"))
    assert job.model_max_length == 2500
    policy = stage_kind("dpo").load_model(ModelRequest(
        model_path=job.model_path, tokenizer=load_tokenizer(tiny_base), finetuning=config.finetuning,
        model_config=config.model, training=job.training, model_max_length=job.model_max_length))
    reference = reference_model(policy, config.finetuning, model_config=config.model, model_max_length=job.model_max_length)
    for model in (policy, reference):
        assert model.config.max_position_embeddings == 3072 and model.config.rope_parameters["rope_type"] == "dynamic"
