"""Added tokens on the tiny model: one id each in the tokenized rows, embeddings grown in steps of
64 with the rows started as `init_special_tokens` says, and with LoRA exactly those rows trained,
saved with the adapter, reloaded, continued and merged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.models.vocabulary import NewTokens, grow_vocabulary

TOKENS_CFG = "llamafactory/examples/extras/multi_tokens/tokens_cfg.yaml"
PLAIN = ("<think>", "</think>")
ROWS = [
    {"instruction": "Draw a square <|start_of_rect|>.", "input": "",
     "output": "<think>a rect</think><|START_OF_SVG|><|start_of_rect|>width 3<|end_of_rect|><|END_OF_SVG|>"},
    {"instruction": "Write hello in a group.", "input": "",
     "output": "<think>group</think><|START_OF_SVG|><|start_of_g|><|start_of_text|>hello<|end_of_text|><|end_of_g|><|END_OF_SVG|>"},
]


def _config(shared_dir: Path, dataset_dir: Path, **values):
    from tuneline.core.stages.registry import build_stage_config

    return build_stage_config({"stage": "sft", "dataset": "svg", "dataset_dir": str(dataset_dir), "template": "default",
                               "cutoff_len": 96, "add_tokens": ",".join(PLAIN),
                               "new_special_tokens_config": str(shared_dir / TOKENS_CFG), **values})


@pytest.fixture(scope="module")
def tokenized(tiny_base: Path, shared_dir: Path, tmp_path_factory) -> Path:
    """The two rows tokenized with the plain tokens and the 16 of the example token file added."""
    from tuneline.core.stages.registry import tokenize_stage_data

    folder = tmp_path_factory.mktemp("svg")
    (folder / "svg.json").write_text(json.dumps(ROWS), encoding="utf-8")
    (folder / "dataset_info.json").write_text(json.dumps({"svg": {"file_name": "svg.json"}}), encoding="utf-8")
    output = folder / "tokenized"
    tokenize_stage_data(_config(shared_dir, folder), tokenizer_path=tiny_base, output_dir=output)
    return output


def test_added_tokens_are_one_id_each_in_the_rows_and_recorded(tokenized: Path, tiny_base: Path):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    base_length = len(AutoTokenizer.from_pretrained(tiny_base))
    tokenizer = AutoTokenizer.from_pretrained(tokenized / "tokenizer")
    new_tokens = NewTokens.read(tokenized)
    assert new_tokens.first_id == base_length and len(tokenizer) == base_length + 18
    assert new_tokens.tokens[:3] == (*PLAIN, "<|START_OF_SVG|>")  # plain ones first, then the file's in its order
    ids = {token: base_length + i for i, token in enumerate(new_tokens.tokens)}
    train = load_from_disk(str(tokenized))["train"]
    first, second = train["input_ids"]
    for row, written in ((ROWS[0], first), (ROWS[1], second)):
        text = row["instruction"] + row["output"]
        for token, token_id in ids.items():
            assert written.count(token_id) == text.count(token), token
    assert first.count(ids["<|start_of_rect|>"]) == 2  # in the prompt and in the reply
    described = tokenizer("Marks the beginning of an SVG document", add_special_tokens=False)["input_ids"]
    assert new_tokens.description_ids["<|START_OF_SVG|>"] == tuple(described)


def test_each_init_mode_starts_the_new_rows_as_documented(tokenized: Path, tiny_base: Path):
    from tuneline.core.models.loading import load_model

    new_tokens = NewTokens.read(tokenized)
    old = load_model(tiny_base).get_input_embeddings().weight.detach().clone()
    vocab, width = old.shape
    mean, spread = old.mean(dim=0), 1 / math.sqrt(width)
    svg = new_tokens.first_id + new_tokens.tokens.index("<|START_OF_SVG|>")
    described_mean = old[list(new_tokens.description_ids["<|START_OF_SVG|>"])].mean(dim=0)
    for init in ("noise_init", "desc_init", "desc_init_w_noise"):
        model = load_model(tiny_base)
        torch.manual_seed(0)
        rows = grow_vocabulary(model, vocab_size=vocab + 18, new_tokens=new_tokens, init=init)
        weight = model.get_input_embeddings().weight.detach()
        assert rows == tuple(range(vocab, vocab + 64)) and weight.shape[0] == vocab + 64  # 18 new, grown to a multiple of 64
        assert torch.equal(weight[:vocab], old) and model.get_output_embeddings().weight is model.get_input_embeddings().weight
        plain = weight[new_tokens.first_id]  # <think> has no description: noise_init in every mode
        assert 0.7 * spread < (plain - mean).std() < 1.3 * spread
        assert 0.7 * spread < (weight[vocab + 18:] - mean).std() < 1.3 * spread  # the rows past the tokens too
        offset = weight[svg] - (mean if init == "noise_init" else described_mean)
        if init == "desc_init":
            assert torch.allclose(offset, torch.zeros(width), atol=1e-6)
        else:
            assert 0.7 * spread < offset.std() < 1.3 * spread


def test_an_untied_output_head_gets_its_own_new_rows_and_trainable_tokens():
    from transformers import LlamaConfig, LlamaForCausalLM

    from tuneline.core.models.loading import apply_finetuning

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False))
    head = model.lm_head.weight.detach().clone()
    new_tokens = NewTokens(first_id=100, tokens=("<a>",), description_ids={"<a>": (3, 5)})
    rows = grow_vocabulary(model, vocab_size=101, new_tokens=new_tokens, init="desc_init")
    assert rows == tuple(range(100, 128)) and model.lm_head.weight.shape[0] == 128
    assert torch.allclose(model.lm_head.weight[100], head[[3, 5]].mean(dim=0))
    adapted = apply_finetuning(model, FinetuningConfig(finetuning_type="lora", lora_rank=2), new_token_rows=rows)
    assert adapted.peft_config["default"].trainable_token_indices == {"embed_tokens": list(rows), "lm_head": list(rows)}


@pytest.mark.slow
def test_lora_trains_exactly_the_new_rows_saves_reloads_and_merges_them(tokenized: Path, tiny_base: Path, tmp_path: Path,
                                                                        shared_dir: Path, one_torch_thread):
    from datasets import load_from_disk
    from peft import PeftModel
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq

    from conftest import train_steps
    from tuneline.core.errors import ConfigError
    from tuneline.core.models.export import merge_adapter, write_hf_folder
    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.stages.causal_lm import load_policy
    from tuneline.core.stages.kind import ModelRequest

    tokenizer = AutoTokenizer.from_pretrained(tokenized / "tokenizer")
    rows = load_from_disk(str(tokenized))["train"]
    batch = dict(DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)([rows[0], rows[1]]))
    torch.manual_seed(0)
    model = load_policy(ModelRequest(model_path=str(tiny_base), tokenizer=tokenizer, finetuning=FinetuningConfig(
        finetuning_type="lora", lora_rank=4), model_config=_config(shared_dir, tmp_path).model, training={},
        new_tokens=NewTokens.read(tokenized)))
    embedding = model.get_input_embeddings()
    start = embedding.token_adapter.trainable_tokens_delta["default"].detach().clone()
    losses, moved = train_steps(model, batch, steps=4)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert losses[-1] < losses[0] and moved == trainable
    assert {name.split(".")[-2] for name in trainable} == {"trainable_tokens_delta", "default"}
    assert sum(".lora_" not in name for name in trainable) == 1  # the new rows' values, besides the LoRA matrices
    trained = embedding.token_adapter.trainable_tokens_delta["default"].detach().clone()
    assert trained.shape == (64, 64) and not torch.equal(trained, start)

    model.save_pretrained(tmp_path / "adapter")
    tokenizer.save_pretrained(tmp_path / "adapter")  # as the stage saves it
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    reloaded = PeftModel.from_pretrained(load_model(tiny_base, vocab_size=len(tokenizer)), str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, adapted,
                              atol=1e-5)

    lora = FinetuningConfig(finetuning_type="lora", lora_rank=4)
    grown = load_model(tiny_base)
    rows = grow_vocabulary(grown, vocab_size=len(tokenizer))
    continued = apply_finetuning(grown, lora, model_config=ModelConfig(adapter_name_or_path=str(tmp_path / "adapter")),
                                 new_token_rows=rows)
    assert torch.equal(continued.get_input_embeddings().token_adapter.trainable_tokens_delta["default"], trained)
    plain = apply_finetuning(load_model(tiny_base), lora)  # an adapter made without the added tokens
    plain.save_pretrained(tmp_path / "plain")
    grown = load_model(tiny_base)
    with pytest.raises(ConfigError, match=r"was not trained with the added tokens \(embedding rows 1024\.\.1087\).*"
                                          "'create_new_adapter: true'"):
        apply_finetuning(grown, lora, model_config=ModelConfig(adapter_name_or_path=str(tmp_path / "plain")),
                         new_token_rows=grow_vocabulary(grown, vocab_size=len(tokenizer)))

    merge_adapter(tiny_base, tmp_path / "adapter", tmp_path / "merged")
    write_hf_folder(tmp_path / "merged", tmp_path / "export", template="default")
    exported = load_model(tmp_path / "export").eval()
    weights = exported.get_input_embeddings().weight.detach()
    base = load_model(tiny_base).get_input_embeddings().weight.detach()
    assert torch.equal(weights[:1024], base) and torch.equal(weights[1024:], trained)
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, adapted,
                              atol=1e-4)
    exported_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export")
    assert exported_tokenizer("<think>x<|END_OF_SVG|>", add_special_tokens=False)["input_ids"] == [1024, *exported_tokenizer(
        "x", add_special_tokens=False)["input_ids"], 1024 + 3]
