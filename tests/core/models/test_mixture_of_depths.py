"""Mixture-of-Depths on the tiny models: routed layers process capacity x T tokens, the routers learn,
a saved model loads back with its routers, and the settings that cannot work are config errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import train_steps
from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.models.loading import apply_finetuning, load_model
from tuneline.core.models.mixture_of_depths import CAPACITY, RoutedLayer, convert_to_mixture_of_depths, routed_count, routes_tokens
from tuneline.core.stages.preference import reference_model
from tuneline.core.stages.registry import build_stage_config

TEXTS = ["The quick brown fox jumps over the lazy dog, and the dog sleeps on in the warm afternoon sun by the river.",
         "Paris is the capital of France."]


@pytest.fixture(scope="module")
def token_batch(tiny_base: Path) -> dict[str, torch.Tensor]:
    """Two rows, the second right-padded: padding must never take a routed slot from a real token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return {**batch, "labels": labels}


def tokens_seen(model, layers: list[int]) -> tuple[dict[int, list[int]], list]:
    """Per layer, the sequence lengths its MLP is given (a forward hook on each)."""
    seen: dict[int, list[int]] = {index: [] for index in layers}
    hooks = [model.model.layers[index].mlp.register_forward_hook(
        lambda module, args, output, index=index: seen[index].append(args[0].shape[1])) for index in layers]
    return seen, hooks


@pytest.mark.slow
def test_convert_trains_the_routers_processes_capacity_tokens_and_loads_back(tiny_base: Path, token_batch, tmp_path: Path,
                                                                            one_torch_thread):
    config = build_stage_config({"stage": "sft", "model_name_or_path": str(tiny_base), "finetuning_type": "full",
                                 "mixture_of_depths": "convert"})
    torch.manual_seed(0)
    model = apply_finetuning(load_model(tiny_base, model=config.model), config.finetuning, model_config=config.model)
    routers = {name for name, _ in model.named_parameters() if ".mod_router." in name}
    assert routers == {"model.layers.1.mod_router.weight", "model.layers.1.mod_router.bias"}  # every other layer
    assert model.config.mixture_of_depths == {"capacity": CAPACITY, "routed_layers": [1]}

    length = token_batch["input_ids"].shape[1]
    seen, hooks = tokens_seen(model, [0, 1])
    losses, moved = train_steps(model, token_batch, steps=5, learning_rate=3e-3)
    for hook in hooks:
        hook.remove()
    assert losses[-1] < losses[0]
    assert seen[0] == [length] * 5 and seen[1] == [routed_count(length, CAPACITY)] * 5 == [length // 8] * 5
    assert routers <= moved
    assert all(model.get_parameter(name).grad.abs().sum() > 0 for name in routers)

    model.eval()
    with torch.no_grad():
        logits = model(**token_batch).logits
    model.save_pretrained(tmp_path)
    for asked in ("load", None):  # the config records the routing, so the key is not needed to get it back
        loaded = load_model(tmp_path, model=ModelConfig(mixture_of_depths=asked)).eval()
        with torch.no_grad():
            assert torch.equal(loaded(**token_batch).logits, logits)
    assert torch.equal(loaded.model.layers[1].mod_router.weight, model.model.layers[1].mod_router.weight)

    # Generation recomputes the whole text at each step, which routes exactly as the forward pass does.
    prompt = {key: token_batch[key][:1, :20] for key in ("input_ids", "attention_mask")}
    generated = loaded.generate(**prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
    ids = prompt["input_ids"]
    with torch.no_grad():
        for _ in range(3):
            ids = torch.cat([ids, loaded(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generated, ids)
    with pytest.raises(ConfigError, match="which a KV cache cannot follow"):
        loaded.generate(**prompt, max_new_tokens=3, do_sample=False, pad_token_id=0, use_cache=True)


def tiny_model(family: str, attention: str) -> torch.nn.Module:
    """A random 4-layer Qwen2 or Mistral (the latter with a sliding window of 16), converted."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class, extra = {"qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
                                        "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": 16})}[family]
    torch.manual_seed(0)
    config = config_class(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=256, attn_implementation=attention, **extra)
    return convert_to_mixture_of_depths(model_class(config)).eval()


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_routed_layers_take_the_top_tokens_with_their_own_positions_and_masks(family: str):
    model = tiny_model(family, "sdpa")
    assert [index for index, layer in enumerate(model.model.layers) if hasattr(layer, "mod_router")] == [1, 3]
    layer = model.model.layers[1]
    ids = torch.randint(3, 256, (2, 48))
    inputs = {}
    layer.register_forward_pre_hook(lambda module, args, kwargs: inputs.update(hidden=args[0]), with_kwargs=True)
    layer.register_forward_hook(lambda module, args, output: inputs.update(output=output))
    seen, _ = tokens_seen(model, [0, 1, 2, 3])
    with torch.no_grad():
        model(input_ids=ids)
    assert seen == {0: [48], 1: [6], 2: [48], 3: [6]}

    # The same layer by hand: the top-6 tokens of each row as a short sequence of their own, their
    # rotary embeddings computed from their positions, their mask (causal, within the sliding
    # window) from their positions.
    window = model.config.sliding_window or 48
    hidden = inputs["hidden"]
    with torch.no_grad():
        scores = hidden @ layer.mod_router.weight + layer.mod_router.bias
        chosen = scores.topk(6, dim=1).indices.sort(dim=1).values
        expected = hidden.clone()
        for row in range(2):
            picked, positions = hidden[row, chosen[row]][None], chosen[row]
            rotary = model.model.rotary_emb(picked, position_ids=positions[None])
            distance = positions[:, None] - positions[None, :]
            mask = ((distance >= 0) & (distance < window))[None, None]
            processed = super(RoutedLayer, layer).forward(picked, attention_mask=mask, position_embeddings=rotary)
            expected[row, chosen[row]] = picked[0] + scores[row, chosen[row], None] * (processed[0] - picked[0])
    assert torch.allclose(inputs["output"], expected, atol=1e-5)

    # With left padding, SDPA's boolean masks and eager attention's additive ones route alike;
    # padding takes a routed slot only from a row with fewer real tokens than slots (the last).
    ids = torch.randint(3, 256, (3, 48))
    mask = torch.ones_like(ids)
    mask[1, :30] = 0
    mask[2, :45] = 0
    eager = tiny_model(family, "eager")
    with torch.no_grad():
        sdpa_logits, eager_logits = (m(input_ids=ids, attention_mask=mask).logits for m in (model, eager))
    assert torch.allclose(sdpa_logits[mask.bool()], eager_logits[mask.bool()], atol=1e-4)
    assert not torch.isnan(sdpa_logits).any() and not torch.isnan(eager_logits).any()
    processed = (inputs["output"] != inputs["hidden"]).any(-1)
    assert processed.sum(1).tolist() == [6, 6, 6]
    assert processed[1, :30].sum() == 0 and processed[2, 45:].all()


def test_mixture_of_depths_settings_that_cannot_work_are_errors(tiny_base: Path, tmp_path: Path):
    with pytest.raises(ConfigError) as error:
        build_stage_config({"stage": "sft", "finetuning_type": "lora", "mixture_of_depths": "convert", "flash_attn": "fa2"})
    assert "'mixture_of_depths: convert' adds a new router to every other decoder layer, which only 'finetuning_type: " \
           "full' trains ('lora'" in str(error.value)
    assert "'mixture_of_depths: convert' routes tokens through the attention masks of SDPA" in str(error.value)
    build_stage_config({"stage": "sft", "finetuning_type": "lora", "mixture_of_depths": "load"})  # a trained MoD model
    build_stage_config({"stage": "sft", "finetuning_type": "full", "mixture_of_depths": "convert"})

    with pytest.raises(ConfigError, match="'mixture_of_depths: load' reads a Mixture-of-Depths model, and "
                                          f"'model_name_or_path: {tiny_base}' is an ordinary one"):
        load_model(tiny_base, model=ModelConfig(mixture_of_depths="load"))
    routed = convert_to_mixture_of_depths(load_model(tiny_base))
    routed.save_pretrained(tmp_path / "routed")
    with pytest.raises(ConfigError, match="is already a Mixture-of-Depths model; set 'mixture_of_depths: load'"):
        load_model(tmp_path / "routed", model=ModelConfig(mixture_of_depths="convert"))
    # the key is the policy's: a reference model loads as it was saved, routed or not
    for asked, ref_model, routes in (("load", tiny_base, False), ("convert", tmp_path / "routed", True)):
        reference = reference_model(routed, FinetuningConfig(ref_model=str(ref_model)),
                                    model_config=ModelConfig(mixture_of_depths=asked), vocab_size=None, training=None)
        assert routes_tokens(reference) is routes

    # A folder whose config records routing but whose weights lost the routers is refused, never
    # loaded as an ordinary model with the routing silently gone.
    from safetensors.torch import load_file, save_file

    weights = tmp_path / "routed/model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if ".mod_router." not in k}, weights, metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"its weights lack 2 router tensor\(s\), model.layers.1.mod_router.bias the first"):
        load_model(tmp_path / "routed")

    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(ConfigError, match="routes the decoder layers of the llama, mistral, qwen2 model families, and "
                                          "this model is 'gpt2'"):
        convert_to_mixture_of_depths(GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64)))


def test_a_scoring_model_converts_too():
    """Reward models (a one-output head, no generation config) route like causal LMs."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, num_labels=1, pad_token_id=0)
    model = convert_to_mixture_of_depths(LlamaForSequenceClassification(config)).eval()
    seen, _ = tokens_seen(model, [0, 1])
    with torch.no_grad():
        assert model(input_ids=torch.randint(1, 64, (2, 16))).logits.shape == (2, 1)
    assert seen == {0: [16], 1: [2]}
