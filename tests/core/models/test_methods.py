"""Fine-tuning methods on the tiny model: each trains, and exactly its own parameters move.

Every test loads the model and applies the method through `tuneline.core.models.loading`, trains a few
AdamW steps without weight decay on demo examples tokenized by the project, and compares every
parameter and buffer bit for bit with its value before training. Two tests go through the
worker's own `run_training` and compare the files it saves.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from conftest import tokenize_demo_alpaca
from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.models.loading import apply_finetuning, load_model, loraplus_optimizer, method_problems

REPO_ROOT = Path(__file__).resolve().parents[3]
ADAPTER_PARTS = ("lora_A", "lora_B", "lora_magnitude_vector")


@pytest.fixture(scope="module")
def tokenized(tiny_base: Path, tmp_path_factory) -> Path:
    """32 demo alpaca examples tokenized with the default template, as a training stage gets them."""
    return tokenize_demo_alpaca(tiny_base, tmp_path_factory.mktemp("tokenized") / "data", max_samples=32)


@pytest.fixture(scope="module")
def batch(tokenized: Path) -> dict[str, torch.Tensor]:
    """The first 8 training examples, padded into one batch."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq

    rows = load_from_disk(str(tokenized))["train"]
    tokenizer = AutoTokenizer.from_pretrained(tokenized / "tokenizer")
    collate = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
    return dict(collate([rows[i] for i in range(8)]))


def prepared(base: Path, finetuning: FinetuningConfig, model: ModelConfig | None = None, **training):
    torch.manual_seed(0)
    model = model or ModelConfig()
    return apply_finetuning(load_model(base, model=model, training=training), finetuning, model_config=model, training=training)


def snapshot(model) -> dict[str, torch.Tensor]:
    """Every parameter and buffer as stored (4-bit and 8-bit weights as their raw integer data)."""
    named = itertools.chain(model.named_parameters(remove_duplicate=False), model.named_buffers())
    return {name: tensor.detach().clone() for name, tensor in named}


def changed(before: dict[str, torch.Tensor], model) -> set[str]:
    after = snapshot(model)
    assert after.keys() == before.keys()
    return {name for name in before if not torch.equal(before[name], after[name])}


def trainable(model) -> set[str]:
    return {name for name, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}


def batch_loss(model, batch) -> float:
    with torch.no_grad():
        return model(**batch).loss.item()


def train_steps(model, batch, *, steps: int = 4, lr: float = 1e-2, optimizer=None) -> tuple[float, float]:
    """Loss on `batch` before and after `steps` optimizer steps on it."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = optimizer or torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    first = batch_loss(model, batch)
    for _ in range(steps):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    return first, batch_loss(model, batch)


def gradients(model, batch) -> dict[str, torch.Tensor]:
    model.train()
    model.zero_grad()
    model(**batch).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


def relative_error(reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> float:
    difference = sum((reference[k] - other[k]).pow(2).sum() for k in reference) ** 0.5
    return float(difference / sum(g.pow(2).sum() for g in reference.values()) ** 0.5)


def logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


LORA_VARIANTS = {
    "lora": {},
    "rslora": {"use_rslora": True},
    "dora": {"use_dora": True},
    "pissa": {"pissa_init": True},
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(LORA_VARIANTS))
def test_lora_variants_train_only_their_adapter(tiny_base: Path, batch, variant: str):
    model = prepared(tiny_base, FinetuningConfig(lora_rank=4, **LORA_VARIANTS[variant]))
    before = snapshot(model)
    first, last = train_steps(model, batch)
    adapter = {name for name in before if any(part in name for part in ADAPTER_PARTS)}
    assert last < first
    assert adapter and changed(before, model) == trainable(model) == adapter
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    assert q_proj.scaling["default"] == (8 / 4**0.5 if variant == "rslora" else 8 / 4)  # lora_alpha defaults to 2 x rank
    assert any("lora_magnitude_vector" in name for name in adapter) == (variant == "dora")


@pytest.mark.slow
def test_pissa_keeps_the_function_at_start_and_its_saved_adapter_reloads(tiny_base: Path, batch, tmp_path: Path):
    """With the exact SVD (`pissa_iter: -1`) a reload recomputes the same residual base."""
    from peft import PeftModel

    base_logits = logits(load_model(tiny_base), batch)
    model = prepared(tiny_base, FinetuningConfig(lora_rank=4, pissa_init=True, pissa_iter=-1))
    assert torch.allclose(logits(model, batch), base_logits, atol=1e-4)
    assert all(p.abs().sum() > 0 for name, p in model.named_parameters() if "lora_B" in name)  # principal components, not zeros
    train_steps(model, batch, steps=3)
    model.save_pretrained(tmp_path / "pissa")
    reloaded = PeftModel.from_pretrained(load_model(tiny_base), str(tmp_path / "pissa"))
    assert torch.allclose(logits(reloaded, batch), logits(model, batch), atol=1e-4)


@pytest.mark.parametrize(("layers", "modules", "extra", "expected"), [
    (1, "mlp", "norm", lambda name: name.startswith("model.layers.1.mlp.") or "norm" in name),  # every layer's norms too
    (-1, "all", None, lambda name: name.startswith("model.layers.0.")),
])
@pytest.mark.slow
def test_freeze_trains_only_the_chosen_modules_of_the_chosen_layers(tiny_base: Path, batch, layers, modules, extra, expected):
    finetuning = FinetuningConfig(finetuning_type="freeze", freeze_trainable_layers=layers,
                                  freeze_trainable_modules=modules, freeze_extra_modules=extra)
    model = prepared(tiny_base, finetuning)
    before = snapshot(model)
    first, last = train_steps(model, batch, lr=1e-3)
    chosen = {name for name, _ in model.named_parameters() if expected(name)}
    assert last < first
    assert chosen and changed(before, model) == trainable(model) == chosen


@pytest.mark.slow
def test_full_trains_every_parameter(tiny_base: Path, batch):
    model = prepared(tiny_base, FinetuningConfig(finetuning_type="full"))
    before = snapshot(model)
    first, last = train_steps(model, batch, lr=1e-3)
    assert last < first
    assert changed(before, model) == trainable(model) == {name for name, _ in model.named_parameters(remove_duplicate=False)}


def dequantized(model) -> dict[str, torch.Tensor]:
    from bitsandbytes.functional import dequantize_4bit
    from bitsandbytes.nn import Linear4bit

    layers = {name: m for name, m in model.named_modules() if isinstance(m, Linear4bit)}
    return {name: dequantize_4bit(m.weight.data, m.weight.quant_state) for name, m in layers.items()}


@pytest.mark.slow
@pytest.mark.parametrize("bits", [4, 8])
def test_qlora_trains_the_adapter_and_leaves_the_quantized_base_untouched(tiny_base: Path, batch, bits: int):
    model = prepared(tiny_base, FinetuningConfig(lora_rank=4), ModelConfig(quantization_bit=bits))
    before, base_weights = snapshot(model), dequantized(model)
    first, last = train_steps(model, batch)
    adapter = {name for name in before if "lora_A" in name or "lora_B" in name}
    assert last < first
    assert adapter and changed(before, model) == trainable(model) == adapter
    assert all(torch.equal(weight, dequantized(model)[name]) for name, weight in base_weights.items())
    assert (len(base_weights) == 14) == (bits == 4)


@pytest.mark.slow
def test_oft_on_a_4_bit_base_trains_its_rotations_and_leaves_the_base_untouched(tiny_base: Path, batch):
    """peft's OFT wraps bitsandbytes' Linear4bit layers, as LLaMA-Factory's QOFT examples train them."""
    from bitsandbytes.nn import Linear4bit
    from peft.tuners.oft.layer import Linear as OFTLinear

    model = prepared(tiny_base, FinetuningConfig(finetuning_type="oft", oft_target="q_proj,v_proj"), ModelConfig(quantization_bit=4))
    attention = model.get_base_model().model.layers[0].self_attn
    assert isinstance(attention.q_proj, OFTLinear) and isinstance(attention.q_proj.get_base_layer(), Linear4bit)
    before, base_weights = snapshot(model), dequantized(model)
    first, last = train_steps(model, batch)
    rotations = {name for name, _ in model.named_parameters() if ".oft_R." in name}  # not its index buffers
    assert last < first
    assert rotations and changed(before, model) == trainable(model) == rotations
    assert len(base_weights) == 14 and all(torch.equal(weight, dequantized(model)[name]) for name, weight in base_weights.items())


@pytest.mark.slow
@pytest.mark.parametrize("bits", [4, 8])
def test_qlora_gradients_after_evaluation_and_generation_equal_those_before(tiny_base: Path, batch, bits: int):
    model = prepared(tiny_base, FinetuningConfig(lora_rank=4), ModelConfig(quantization_bit=bits))
    train_steps(model, batch, steps=1)  # B matrices leave zero, so every adapter gradient is non-zero
    before = snapshot(model)
    reference = gradients(model, batch)
    model.eval()
    with torch.no_grad():
        model(**batch)
    model.generate(input_ids=batch["input_ids"][:1, :8], attention_mask=batch["attention_mask"][:1, :8],
                   max_new_tokens=2, do_sample=False)
    assert relative_error(reference, gradients(model, batch)) < 1e-3
    assert changed(before, model) == set()  # the quantized weights kept their training layout


@pytest.mark.slow
def test_loraplus_gives_b_matrices_the_larger_learning_rate(tiny_base: Path, batch, tmp_path: Path):
    from transformers import Seq2SeqTrainingArguments

    finetuning = FinetuningConfig(lora_rank=4, loraplus_lr_ratio=16.0)
    model = prepared(tiny_base, finetuning)
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), learning_rate=1e-3, weight_decay=0.0, report_to=[])
    optimizer = loraplus_optimizer(model, finetuning=finetuning, args=args)
    name_of = {id(p): name for name, p in model.named_parameters()}
    rate = {name_of[id(p)]: group["lr"] for group in optimizer.param_groups for p in group["params"]}
    assert rate.keys() == trainable(model)
    assert all(lr == pytest.approx(1.6e-2 if "lora_B" in name else 1e-3) for name, lr in rate.items())
    before = snapshot(model)
    first, last = train_steps(model, batch, optimizer=optimizer)
    assert last < first
    assert changed(before, model) == trainable(model)
    assert loraplus_optimizer(model, finetuning=FinetuningConfig(), args=args) is None


@pytest.mark.slow
def test_saved_adapter_is_continued_or_merged_under_a_new_one(tiny_base: Path, batch, tmp_path: Path):
    model = prepared(tiny_base, FinetuningConfig(lora_rank=4))
    train_steps(model, batch, steps=3)
    model.save_pretrained(tmp_path / "adapter")
    saved = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    trained = logits(model, batch)
    adapter = ModelConfig(adapter_name_or_path=str(tmp_path / "adapter"))

    continued = prepared(tiny_base, FinetuningConfig(lora_rank=16), adapter)  # the saved adapter's own rank wins
    assert trainable(continued) == saved.keys()
    assert all(torch.equal(p, saved[name]) for name, p in continued.named_parameters() if p.requires_grad)
    assert torch.allclose(logits(continued, batch), trained, atol=1e-5)

    fresh = prepared(tiny_base, FinetuningConfig(lora_rank=4, create_new_adapter=True), adapter)
    assert trainable(fresh) == saved.keys()
    assert all(not p.any() for name, p in fresh.named_parameters() if "lora_B" in name)
    assert torch.allclose(logits(fresh, batch), trained, atol=1e-4)  # the old adapter now lives in the base weights
    merged = fresh.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.equal(merged, load_model(tiny_base).model.layers[0].self_attn.q_proj.weight)


def test_gradient_checkpointing_gives_lora_the_same_gradients(tiny_base: Path, batch):
    def lora(**training):
        model = prepared(tiny_base, FinetuningConfig(lora_rank=4), **training)
        torch.manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
        return model

    plain = lora()
    checkpointed = lora(gradient_checkpointing=True)
    # As the trainer does, in the strict form: reentrant checkpointing needs inputs that require grad.
    checkpointed.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    reference, seen = gradients(plain, batch), gradients(checkpointed, batch)
    assert checkpointed.config.use_cache is False
    assert checkpointed.get_input_embeddings()(batch["input_ids"]).requires_grad  # frozen, yet its output carries grad
    assert not plain.get_input_embeddings()(batch["input_ids"]).requires_grad
    assert all(g.abs().sum() > 0 for g in seen.values())
    assert relative_error(reference, seen) < 1e-5


def test_unknown_module_names_are_config_errors_that_list_the_real_ones(tiny_base: Path):
    with pytest.raises(ConfigError) as lora:
        prepared(tiny_base, FinetuningConfig(lora_target="q_proj,qkv_proj"))
    assert "'lora_target' names qkv_proj" in str(lora.value)
    assert "down_proj, embed_tokens, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj (or 'all')" in str(lora.value)

    with pytest.raises(ConfigError) as freeze:
        prepared(tiny_base, FinetuningConfig(finetuning_type="freeze", freeze_trainable_modules="mlps",
                                             freeze_extra_modules="final_norm"))
    assert len(freeze.value.problems) == 2
    assert "'mlps'" in freeze.value.problems[0] and "did you mean 'mlp'?" in freeze.value.problems[0]
    assert "input_layernorm, mlp, post_attention_layernorm, self_attn, or 'all'" in freeze.value.problems[0]
    assert "'final_norm'" in freeze.value.problems[1] and "embed_tokens, lm_head, norm." in freeze.value.problems[1]

    with pytest.raises(ConfigError, match="'additional_target': unknown module 'embed'"):
        prepared(tiny_base, FinetuningConfig(additional_target="embed"))


def test_nothing_trainable_is_a_config_error(tiny_base: Path):
    expected = "no parameter is trainable with 'freeze_trainable_layers: 0' and no freeze_extra_modules"
    with pytest.raises(ConfigError, match=expected):
        prepared(tiny_base, FinetuningConfig(finetuning_type="freeze", freeze_trainable_layers=0))


def test_settings_that_cannot_train_together_are_named_at_once():
    problems = method_problems(ModelConfig(quantization_bit=4, adapter_name_or_path="a,b"),
                               FinetuningConfig(pissa_init=True, create_new_adapter=True))
    assert len(problems) == 3
    assert "pissa_init" in problems[0] and "lists 2 adapters" in problems[1]
    assert "create_new_adapter" in problems[2]
    assert len(method_problems(ModelConfig(quantization_bit=8, adapter_name_or_path="a"),
                               FinetuningConfig(finetuning_type="full", loraplus_lr_ratio=16.0))) == 3
    assert method_problems(ModelConfig(quantization_bit=4, adapter_name_or_path="a"), FinetuningConfig()) == []


def run_stage(tiny_base: Path, tokenized: Path, output: Path, finetuning: dict, **training) -> dict:
    from tuneline.core.training.job import TrainJob
    from tuneline.core.worker.run import run_training

    job = TrainJob(model_path=str(tiny_base), dataset_path=str(tokenized), output_dir=str(output), finetuning=finetuning,
                   training={"max_steps": 8, "per_device_train_batch_size": 4, "logging_steps": 1, "seed": 0, **training})
    return run_training(job)


@pytest.mark.slow
def test_freeze_stage_saves_weights_that_differ_from_the_base_only_where_chosen(tiny_base: Path, tokenized: Path, batch,
                                                                              tmp_path: Path):
    from safetensors.torch import load_file

    run_stage(tiny_base, tokenized, tmp_path / "out", {"finetuning_type": "freeze", "freeze_trainable_layers": 1,
                                                       "freeze_trainable_modules": "self_attn"}, learning_rate=1e-3)
    base, saved = load_file(tiny_base / "model.safetensors"), load_file(tmp_path / "out/model.safetensors")
    assert base.keys() == saved.keys()
    moved = {name for name in base if not torch.equal(base[name], saved[name])}
    assert moved == {name for name in base if name.startswith("model.layers.1.self_attn.")}
    assert batch_loss(load_model(tmp_path / "out"), batch) < batch_loss(load_model(tiny_base), batch)


@pytest.mark.slow
def test_lora_stage_with_loraplus_and_checkpointing_saves_an_adapter_that_lowers_the_loss(tiny_base: Path, tokenized: Path,
                                                                                         batch, tmp_path: Path):
    from peft import PeftModel

    run_stage(tiny_base, tokenized, tmp_path / "out", {"finetuning_type": "lora", "lora_rank": 4, "loraplus_lr_ratio": 16.0},
              learning_rate=2e-3, gradient_checkpointing=True)
    assert json.loads((tmp_path / "out/adapter_config.json").read_text())["r"] == 4
    adapted = PeftModel.from_pretrained(load_model(tiny_base), str(tmp_path / "out"))
    assert batch_loss(adapted, batch) < batch_loss(load_model(tiny_base), batch)
