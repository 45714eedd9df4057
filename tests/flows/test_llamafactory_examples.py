"""LLaMA-Factory 0.9.5's example configs (`examples/{train_lora,train_full,train_qlora,extras,merge_lora,megatron}`)
run through `tuneline train` (`tuneline export` for merge_lora, `tuneline eval` for the eval example), each one as it ships but for:

- `model_name_or_path`: a tiny model of the config's family, built here from a real tokenizer
  (llama3 configs: a tiny LLaMA with the Llama-3 tokenizer; qwen configs: a tiny Qwen2 with the Qwen2.5
  one), or the output of the example it names (merge_lora/llama3_full_sft.yaml);
- `dataset_dir`: the shared copy of LLaMA-Factory's `data/`;
- the output paths (`output_dir`, `export_dir`, `tokenized_path`) and the paths that name another
  example's output (`adapter_name_or_path`, `reward_model`), which point at that example's run here;
- for the ones that train, `TRAIN_EDITS`: `max_steps: 2` and `max_samples: 16`, `cutoff_len: 128`
  (the examples' 2048 would make logits of 2048 x 128,256 values per row, a gigabyte each, on the
  preference and pre-training examples), `gradient_accumulation_steps: 1` (the examples' 8 would make
  each step 8 forward and backward passes through those logits), and no extra processes for
  tokenizing or loading batches (each would be a fork of this test process, costing more than the
  two steps), and `logging_nan_inf_filter: false` (transformers would log a NaN step's loss as the
  mean of the finite ones before it, 0 when there are none, so a run of NaN losses would end on a
  finite `train_loss`);
- what `Example.overrides` adds, said in its reason.

Each runs through the command's `main` in this process, the training worker included
(`in_process_launch`), from the folder that holds `examples/` and `data/`, as LLaMA-Factory's
examples are run from its repository's root, so their own relative paths (DeepSpeed configs) resolve.
`EXAMPLES` holds the expected outcome of each: it trains (exit 0, its outputs written), or it is
refused with exit 2 and a message naming what it needs; the run prints the table. An example that
trains also ends with a finite loss, and the run's own record of what it trained with (the
"training with:" line, `MethodRecord`) shows the example's method or optimizer (`RAN`).
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import math
import re
import shutil
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmark_files import write_mmlu
from conftest import assert_output_layout, train_in_this_process
from tuneline.core.training.method_record import LINE_PREFIX, MethodRecord

FOLDERS = ("train_lora", "train_full", "train_qlora", "extras", "merge_lora", "megatron")
NO_CHAIN: Mapping[str, str] = {}
SFT_ADAPTER = {"adapter_name_or_path": "train_lora/llama3_lora_sft.yaml"}


@dataclass(frozen=True)
class Example:
    outcome: str  # "trains", or "refused: <a substring of the exit-2 message>"
    reason: str
    base: str = "llama3"  # the tiny model given as model_name_or_path (see TinyBases)
    chain: Mapping[str, str] = field(default_factory=lambda: NO_CHAIN)  # key -> the example whose output it names
    overrides: Mapping[str, Any] = field(default_factory=dict)  # further changes, named in `reason`
    xfail: str | None = None  # why it does not reach `outcome` yet: "pending: <key>", or "gap: <what tuneline lacks>"


EXAMPLES: dict[str, Example] = {
    # train_lora
    "train_lora/llama3_lora_sft.yaml": Example("trains", "LoRA SFT"),
    "train_lora/llama3_lora_pretrain.yaml": Example("trains", "LoRA pre-training on c4_demo"),
    "train_lora/llama3_lora_reward.yaml": Example("trains", "LoRA reward model; logging_steps 10 -> 1 (its log checked)",
                                                  overrides={"logging_steps": 1}),
    "train_lora/llama3_lora_dpo.yaml": Example("trains", "LoRA DPO; logging_steps 10 -> 1 (its log checked)",
                                               overrides={"logging_steps": 1}),
    "train_lora/llama3_lora_kto.yaml": Example("trains", "LoRA KTO, one row per batch (each row's KL sequence paired "
                                               "when tokenizing); logging_steps 10 -> 1 (its log checked)",
                                               overrides={"logging_steps": 1}),
    "train_lora/llama3_lora_ppo.yaml": Example("trains", "LoRA PPO against the reward example's output; max_new_tokens "
                                               "512 -> 8 (a random tiny model rarely stops)",
                                               chain={"reward_model": "train_lora/llama3_lora_reward.yaml"},
                                               overrides={"max_new_tokens": 8}),
    "train_lora/llama3_preprocess.yaml": Example("trains", "tokenizes to tokenized_path (moved to the run's folder), "
                                                 "then trains"),
    "train_lora/llama3_lora_eval.yaml": Example("trains", "`tuneline eval` (llamafactory-cli eval) of the SFT example's "
                                                "adapter on mmlu_test, 5-shot, template fewshot; task_dir: a small MMLU "
                                                "in LLaMA-Factory's layout written here", chain=SFT_ADAPTER),
    "train_lora/llama3_lora_sft_ds3.yaml": Example("refused: DeepSpeed", "DeepSpeed ZeRO-3: not installed, needs CUDA"),
    "train_lora/llama4_lora_sft_ds3.yaml": Example("refused: DeepSpeed", "DeepSpeed ZeRO-3 (its mllm_demo images are "
                                                   "never read: refused before any data)"),
    "train_lora/llama3_lora_sft_ray.yaml": Example("refused: needs 4 GPU in all", "Ray Train on 4 workers of one GPU each, "
                                                   "which this machine's local Ray cluster lacks (dataset_dir REMOTE:... "
                                                   "replaced like every dataset_dir)"),
    "train_lora/deepseek2_lora_sft_kt.yaml": Example("refused: KTransformers", "KTransformers offloading (refused "
                                                     "before any model loads, so the tiny LLaMA stands in)"),
    "train_lora/deepseek3_lora_sft_kt.yaml": Example("refused: KTransformers", "KTransformers offloading"),
    "train_lora/qwen3moe_lora_sft_kt.yaml": Example("refused: KTransformers", "KTransformers offloading", base="qwen2"),
    "train_lora/gpt_lora_sft.yaml": Example("refused: unknown template 'gpt'", "LLaMA-Factory 0.9.5 has no template "
                                            "`gpt` either (its gpt-oss template is gpt_oss)"),
    # train_full
    "train_full/llama3_full_sft.yaml": Example("refused: DeepSpeed", "DeepSpeed ZeRO-3"),
    "train_full/qwen3_full_sft_autotp.yaml": Example("refused: only on a CUDA GPU", "use_v1_kernels (CUDA) and "
                                                     "DeepSpeed AutoTP", base="qwen2"),
    # train_qlora
    "train_qlora/llama3_lora_sft_otfq.yaml": Example("trains", "QLoRA: 4-bit bitsandbytes, which runs on the CPU"),
    "train_qlora/llama3_lora_sft_bnb_npu.yaml": Example("trains", "4-bit bitsandbytes; no key of it needs an NPU"),
    "train_qlora/llama3_lora_sft_gptq.yaml": Example("refused: quantized with gptq", "a GPTQ base needs optimum and "
                                                     "gptqmodel", base="llama3-gptq"),
    "train_qlora/llama3_lora_sft_awq.yaml": Example("refused: quantized with awq", "an AWQ base needs gptqmodel",
                                                    base="llama3-awq"),
    "train_qlora/llama3_lora_sft_aqlm.yaml": Example("refused: quantized with aqlm", "an AQLM base needs aqlm",
                                                     base="llama3-aqlm"),
    # extras
    "extras/adam_mini/qwen2_full_sft.yaml": Example("trains", "Adam-mini, full", base="qwen2"),
    "extras/muon/qwen2_full_sft.yaml": Example("trains", "Muon, full", base="qwen2"),
    "extras/dft/qwen2_full_sft.yaml": Example("trains", "DFT loss, full", base="qwen2"),
    "extras/badam/llama3_full_sft.yaml": Example("trains", "BAdam, layer mode"),
    "extras/galore/llama3_full_sft.yaml": Example("trains", "GaLore, layer-wise, on bfloat16 weights (pure_bf16)"),
    "extras/apollo/llama3_full_sft.yaml": Example("trains", "APOLLO, layer-wise, on bfloat16 weights (pure_bf16)"),
    "extras/llama_pro/llama3_freeze_sft.yaml": Example("trains", "LLaMA Pro: a tiny LLaMA of 8 layers expanded by 8",
                                                       base="llama3-pro"),
    "extras/loraplus/llama3_lora_sft.yaml": Example("trains", "LoRA+"),
    "extras/oft/llama3_oft_sft.yaml": Example("trains", "OFT, blocks of 32"),
    "extras/pissa/llama3_lora_sft.yaml": Example("trains", "PiSSA (fast SVD, converted to LoRA at the end)"),
    "extras/fsdp_qlora/llama3_lora_sft.yaml": Example("trains", "QLoRA; FSDP comes from the accelerate config at launch, "
                                                      "not from this file"),
    "extras/nlg_eval/llama3_lora_predict.yaml": Example("trains", "prediction alone with the SFT example's adapter; "
                                                        "max_new_tokens 1024 -> 8 (a random tiny model rarely stops)",
                                                        chain=SFT_ADAPTER, overrides={"max_new_tokens": 8}),
    "extras/mod/llama3_full_sft.yaml": Example("trains", "Mixture-of-Depths, full, on bfloat16 weights (pure_bf16)"),
    "extras/fp8/llama3_fp8_deepspeed_sft.yaml": Example("refused: FP8 training", "FP8 (CUDA) and DeepSpeed"),
    "extras/fp8/llama3_fp8_fsdp_sft.yaml": Example("refused: FP8 training", "FP8 (CUDA) and FSDP; its fsdp list and "
                                                   "fsdp_transformer_layer_cls_to_wrap are read into transformers 5's "
                                                   "fsdp_config"),
    "extras/qoft/llama3_oft_sft_bnb_npu.yaml": Example("trains", "OFT on a 4-bit bitsandbytes base, which runs on the "
                                                       "CPU; no key of it needs an NPU"),
    "extras/qoft/llama3_oft_sft_gptq.yaml": Example("refused: quantized with gptq", "a GPTQ base", base="llama3-gptq"),
    "extras/qoft/llama3_oft_sft_awq.yaml": Example("refused: quantized with awq", "an AWQ base", base="llama3-awq"),
    # merge_lora
    "merge_lora/llama3_lora_sft.yaml": Example("trains", "merges the SFT example's adapter", chain=SFT_ADAPTER),
    "merge_lora/llama3_full_sft.yaml": Example("trains", "exports the BAdam example's full weights (train_full's own "
                                               "needs DeepSpeed)",
                                               chain={"model_name_or_path": "extras/badam/llama3_full_sft.yaml"}),
    "merge_lora/llama3_gptq.yaml": Example("refused: export_quantization_bit", "GPTQ export: needs the gptq extra "
                                           "(optimum, gptqmodel) and a CUDA GPU"),
}

EXAMPLES.update({
    # multimodal: a tiny Qwen2.5-VL, and LLaMA-Factory's data with generated pictures as mllm_demo_data/
    "train_lora/qwen2_5vl_lora_sft.yaml": Example("trains", "LoRA SFT on mllm_demo (images), identity and alpaca_en_demo",
                                                  base="qwen2_5vl"),
    "extras/oft/qwen2_5vl_oft_sft.yaml": Example("trains", "OFT SFT on mllm_demo, identity and alpaca_en_demo",
                                                 base="qwen2_5vl"),
    "train_full/qwen2_5vl_full_sft.yaml": Example("refused: DeepSpeed", "DeepSpeed ZeRO-3", base="qwen2_5vl"),
    "train_lora/qwen2_5vl_lora_dpo.yaml": Example("trains", "LoRA DPO on image pairs: rlhf_v (a Hub dataset) named in "
                                                  "the test's dataset_dir as a local file of generated pairs in its "
                                                  "columns", base="qwen2_5vl"),
    "merge_lora/qwen2_5vl_lora_sft.yaml": Example("trains", "merges the multimodal SFT example's adapter; the image "
                                                  "processor travels with it", base="qwen2_5vl",
                                                  chain={"adapter_name_or_path": "train_lora/qwen2_5vl_lora_sft.yaml"}),
    # megatron: LLaMA-Factory runs these with USE_MCA=1 through MCoreAdapter; refused before any model loads, so the
    # tiny LLaMA stands in for Qwen2-VL and Qwen3-MoE
    "megatron/qwen2_vl_full.yaml": Example("refused: ask for Megatron-Core training (MCoreAdapter)",
                                           "Megatron-Core's parallelism and fused kernels (another engine, CUDA only)"),
    "megatron/qwen3_moe_full.yaml": Example("refused: ask for Megatron-Core training (MCoreAdapter)",
                                            "Megatron-Core's pipeline and expert parallelism (another engine, CUDA only)"),
})

# What the record of each example that trains must show: equal fields, and for `added_modules` the
# module classes that must be among them (the adapter layers; bitsandbytes' 4-bit layers under them).
LORA = ("peft.tuners.lora.layer.Linear",)
QLORA = ("peft.tuners.lora.bnb.Linear4bit", "bitsandbytes.nn.modules.Linear4bit")
OFT = ("peft.tuners.oft.layer.Linear",)
LAYERWISE = "tuneline.core.training.optimizers.projected.LayerwiseOptimizer"
DPO_LOSS = "trl.trainer.dpo_trainer.DPOTrainer.compute_loss"
RAN: dict[str, Mapping[str, Any]] = {
    "train_lora/llama3_lora_sft.yaml": {"added_modules": LORA, "optimizer": "torch.optim.adamw.AdamW"},
    "train_lora/llama3_lora_pretrain.yaml": {"added_modules": LORA},
    "train_lora/llama3_lora_reward.yaml": {"added_modules": LORA, "loss": "trl.trainer.reward_trainer.RewardTrainer.compute_loss"},
    "train_lora/llama3_lora_dpo.yaml": {"added_modules": LORA, "loss": DPO_LOSS},
    "train_lora/llama3_lora_kto.yaml": {"added_modules": LORA, "loss": "trl.trainer.kto_trainer.KTOTrainer.compute_loss"},
    "train_lora/llama3_lora_ppo.yaml": {"added_modules": LORA, "loss": "tuneline.core.stages.ppo.trainer.PPOTrainer._losses"},
    "train_lora/llama3_preprocess.yaml": {"added_modules": LORA},
    "train_qlora/llama3_lora_sft_otfq.yaml": {"added_modules": QLORA},
    "train_qlora/llama3_lora_sft_bnb_npu.yaml": {"added_modules": QLORA},
    "extras/adam_mini/qwen2_full_sft.yaml": {"optimizer": "adam_mini.adam_mini.Adam_mini"},
    "extras/muon/qwen2_full_sft.yaml": {"optimizer": "tuneline.core.training.optimizers.adaptive.MuonWithAdamW"
                                                     "[torch.optim.Muon, torch.optim.adamw.AdamW]"},
    "extras/dft/qwen2_full_sft.yaml": {"loss": "tuneline.core.training.losses.dft_loss"},
    "extras/badam/llama3_full_sft.yaml": {"optimizer": "badam.block_optim.BlockOptimizer"},
    "extras/galore/llama3_full_sft.yaml": {"optimizer": f"{LAYERWISE}[galore_torch.adamw.AdamW]"},
    "extras/apollo/llama3_full_sft.yaml": {"optimizer": f"{LAYERWISE}[apollo_torch.apollo.AdamW]"},
    "extras/llama_pro/llama3_freeze_sft.yaml": {"trainable_layers": list(range(1, 16, 2))},  # the 8 blocks added
    "extras/loraplus/llama3_lora_sft.yaml": {"added_modules": LORA},
    "extras/oft/llama3_oft_sft.yaml": {"added_modules": OFT},
    "extras/pissa/llama3_lora_sft.yaml": {"added_modules": LORA},
    "extras/fsdp_qlora/llama3_lora_sft.yaml": {"added_modules": QLORA},
    "extras/mod/llama3_full_sft.yaml": {"added_modules": ("tuneline.core.models.mixture_of_depths.RoutedLlamaDecoderLayer",)},
    "extras/qoft/llama3_oft_sft_bnb_npu.yaml": {"added_modules": (*OFT, "bitsandbytes.nn.modules.Linear4bit")},
    "train_lora/qwen2_5vl_lora_sft.yaml": {"added_modules": LORA},
    "extras/oft/qwen2_5vl_oft_sft.yaml": {"added_modules": OFT},
    "train_lora/qwen2_5vl_lora_dpo.yaml": {"added_modules": LORA, "loss": DPO_LOSS},
}

LEFT_OUT = {
    "extras/multi_tokens/tokens_cfg.yaml": "not a stage config: the token descriptions new_special_tokens_config reads",
}

TRAIN_EDITS = {"max_steps": 2, "max_samples": 16, "cutoff_len": 128, "gradient_accumulation_steps": 1,
               "preprocessing_num_workers": None, "dataloader_num_workers": 0, "logging_nan_inf_filter": False}
OUTPUT_KEYS = ("output_dir", "export_dir", "tokenized_path")
EVALUATED_FILES = ("results.json", "results.log")
TRAINED_FILES = ("all_results.json", "train_results.json")  # logging_steps 10 > max_steps: no log lines
PREDICTED_FILES = ("generated_predictions.jsonl", "predict_results.json")
EXPORTED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")


def examples_root(shared_dir: Path) -> Path:
    return shared_dir / "llamafactory"


def test_every_example_config_has_an_expected_outcome(shared_dir: Path):
    examples = examples_root(shared_dir) / "examples"
    found = {p.relative_to(examples).as_posix() for folder in FOLDERS for p in (examples / folder).rglob("*.yaml")}
    assert found == set(EXAMPLES) | set(LEFT_OUT), (sorted(found - set(EXAMPLES) - set(LEFT_OUT)),
                                                    sorted(set(EXAMPLES) | set(LEFT_OUT) - found))
    for name, example in EXAMPLES.items():
        assert example.outcome == "trains" or example.outcome.startswith("refused: "), name
        producers = [EXAMPLES.get(producer) for producer in example.chain.values()]
        assert all(p is not None and p.outcome == "trains" and not p.xfail for p in producers), name  # they must finish


# -- the tiny models ---------------------------------------------------------------------------

# The `quantization_config` of a checkpoint saved with each method: transformers picks the loader
# (and the package it needs) by `quant_method`.
PREQUANTIZED = {
    "llama3-gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128},
    "llama3-awq": {"quant_method": "awq", "bits": 4, "group_size": 128},
    "llama3-aqlm": {"quant_method": "aqlm", "in_group_size": 8, "out_group_size": 1, "num_codebooks": 1,
                    "nbits_per_codebook": 16},
}


class TinyBases:
    """The tiny models, each built the first time an example asks for it.

    hidden_size 32 and intermediate_size 64: OFT's blocks of 32 must divide every layer's input width.
    The GPTQ/AWQ/AQLM bases are the tiny LLaMA with the original's `quantization_config` in its
    config.json; the refusal comes from the checks transformers makes before any weight is read.
    """

    def __init__(self, root: Path, tokenizers: Path) -> None:
        self.root, self.tokenizers, self.built = root, tokenizers, {}

    def path(self, name: str) -> Path:
        if name not in self.built:
            self.built[name] = self._build(name, self.root / name)
        return self.built[name]

    def _build(self, name: str, folder: Path) -> Path:
        if name == "llama3":
            return build_tiny_model(self.tokenizers / "llama3", folder, family="llama", layers=2)
        if name == "qwen2":
            return build_tiny_model(self.tokenizers / "qwen2.5", folder, family="qwen2", layers=2)
        if name == "qwen2_5vl":  # hidden_size 32 as for the text bases (OFT's blocks of 32)
            from tuneline.core.models.tiny.vision import VisionModelConfig, build_vision_language_model

            config = VisionModelConfig(family="qwen2_5_vl", hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                       num_key_value_heads=1, max_position_embeddings=4096)
            build_vision_language_model(self.tokenizers / "qwen2.5", folder, config=config)
            return folder
        if name == "llama3-pro":
            from tuneline.core.models.expansion import expand_blocks

            deep = build_tiny_model(self.tokenizers / "llama3", self.root / "llama3-8-layers", family="llama", layers=8)
            expand_blocks(deep, folder, num_expand=8)
            return folder
        folder.mkdir(parents=True)
        source = self.path("llama3")
        for item in source.iterdir():
            if item.name != "config.json":
                (folder / item.name).symlink_to(item)
        config = json.loads((source / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "quantization_config": PREQUANTIZED[name]}))
        return folder


def build_tiny_model(tokenizer_dir: Path, folder: Path, *, family: str, layers: int) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if family == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096, tie_word_embeddings=True,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model_class(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# -- running the examples ----------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    exit_code: int
    message: str  # what the command wrote to stderr (or the traceback of an exception it let out)
    output: Path | None  # output_dir (train) or export_dir (export)
    printed: str = ""  # what it wrote to stdout

    def records(self) -> list[MethodRecord]:
        """The run's records of what it trained with (one per training run)."""
        return [MethodRecord.from_line(line) for line in self.printed.splitlines() if line.startswith(LINE_PREFIX)]


class ExampleRuns:
    """Each example run once, after the examples whose outputs it names."""

    def __init__(self, root: Path, lf_root: Path, bases: TinyBases) -> None:
        self.root, self.lf_root, self.bases = root, lf_root, bases
        self.outcomes: dict[str, Outcome] = {}
        self.configs: dict[str, dict[str, Any]] = {}  # as each example ran

    def media_data(self) -> Path:
        """LLaMA-Factory's data folder (linked) with the pictures mllm_demo names, which it does not ship:
        small generated ones (a few image tokens each, so the examples' rows fit cutoff_len 128). Its
        dataset_info.json is LLaMA-Factory's but for `rlhf_v`, a Hub dataset that cannot be downloaded
        here: it names a local file of image pairs in RLHF-V's columns instead (conversations, chosen,
        rejected, images)."""
        from PIL import Image, ImageDraw

        folder = self.root / "data_with_pictures"
        if not folder.is_dir():
            folder.mkdir()
            for item in (self.lf_root / "data").iterdir():
                if item.name != "dataset_info.json":
                    (folder / item.name).symlink_to(item)
            pictures = folder / "mllm_demo_data"
            pictures.mkdir()
            colours = {"red": (200, 40, 40), "green": (40, 160, 60), "blue": (40, 70, 200)}
            for index, colour in enumerate(colours.values(), start=1):
                image = Image.new("RGB", (56 + 28 * index, 56), colour)
                ImageDraw.Draw(image).ellipse([8, 8, 48, 48], fill=(240, 240, 240))
                image.save(pictures / f"{index}.jpg")
            names = list(colours)
            pairs = [{"conversations": [{"from": "human", "value": "<image>What colour is the background?"}],
                      "chosen": {"from": "gpt", "value": f"It is {name}."},
                      "rejected": {"from": "gpt", "value": f"It is {names[index - 1]}."},
                      "images": [f"mllm_demo_data/{index + 1}.jpg"]} for index, name in enumerate(names)]
            (folder / "rlhf_v_pairs.json").write_text(json.dumps(pairs * 3))
            info = json.loads((self.lf_root / "data" / "dataset_info.json").read_text())
            info["rlhf_v"] = {**{k: v for k, v in info["rlhf_v"].items() if k != "hf_hub_url"}, "file_name": "rlhf_v_pairs.json"}
            (folder / "dataset_info.json").write_text(json.dumps(info))
        return folder

    def config(self, name: str) -> dict[str, Any]:
        return self.configs[name]

    def run(self, name: str) -> Outcome:
        if name not in self.outcomes:
            self.outcomes[name] = self._run(name)
        return self.outcomes[name]

    def _run(self, name: str) -> Outcome:
        from tuneline.flows.cli import main

        example = EXAMPLES[name]
        config = yaml.safe_load((self.lf_root / "examples" / name).read_text())
        command = "export" if name.startswith("merge_lora/") else "eval" if "task" in config else "train"
        folder = self.root / re.sub(r"\W", "_", name.removesuffix(".yaml"))
        data = self.media_data() if example.base == "qwen2_5vl" else self.lf_root / "data"
        edits: dict[str, Any] = {"model_name_or_path": str(self.bases.path(example.base)), "dataset_dir": str(data)}
        if command == "train":
            edits.update(TRAIN_EDITS)
        if command == "eval":
            write_mmlu(folder / "evaluation")
            edits.update({"task_dir": str(folder / "evaluation"), "save_dir": str(folder / "save_dir")})
        edits.update({key: str(folder / key) for key in OUTPUT_KEYS if key in config})
        for key, producer in example.chain.items():
            upstream = self.run(producer)
            assert upstream.exit_code == 0 and upstream.output is not None, f"{name} needs {producer}: {upstream.message[-2000:]}"
            edits[key] = str(upstream.output)
        edits.update(example.overrides)
        path = folder.with_suffix(".yaml")
        self.configs[name] = {**config, **edits}
        path.write_text(yaml.safe_dump(self.configs[name], sort_keys=False))
        stderr, stdout = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
                code = main([command, str(path)])
        except Exception:  # what the command would have ended with status 1 on
            return Outcome(1, stderr.getvalue() + traceback.format_exc(), None, stdout.getvalue())
        output = edits.get({"train": "output_dir", "export": "export_dir", "eval": "save_dir"}[command])
        return Outcome(code, stderr.getvalue(), Path(output) if output else None, stdout.getvalue())


@pytest.fixture(scope="module")
def runs(shared_dir: Path, tmp_path_factory, one_torch_thread):
    root = tmp_path_factory.mktemp("lf_examples")
    lf_root = examples_root(shared_dir)
    runs = ExampleRuns(root, lf_root, TinyBases(root / "bases", shared_dir / "tokenizers"))
    started = time.process_time()
    gc.freeze()  # the trainers' gc.collect() calls would otherwise walk every object the imports made, each time
    with pytest.MonkeyPatch.context() as patch:
        train_in_this_process(patch)
        patch.setenv("TUNELINE_CACHE", str(root / "cache"))
        patch.chdir(lf_root)
        yield runs
    gc.unfreeze()
    print(f"\n{outcome_table(runs.outcomes)}\n{len(runs.outcomes)} examples in {time.process_time() - started:.0f} s of CPU")
    shutil.rmtree(root, ignore_errors=True)


def outcome_table(outcomes: Mapping[str, Outcome]) -> str:
    rows = [("file", "outcome", "expected", "reason")]
    for name, example in EXAMPLES.items():
        if name in outcomes:
            got = outcomes[name]
            seen = "trains" if got.exit_code == 0 else f"exit {got.exit_code}: {first_problem(got.message)}"
            expected = example.outcome + (" (xfail)" if example.xfail else "")
            rows.append((name, seen[:80], expected, example.reason + (f"; xfail: {example.xfail}" if example.xfail else "")))
    rows += [(name, "left out", "", why) for name, why in LEFT_OUT.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3] for row in rows)


def first_problem(message: str) -> str:
    """The first problem of an exit-2 message, without its "error: Invalid configuration in FILE" head."""
    lines = [line.strip(" -") for line in message.splitlines() if line.strip()]
    at = next((i for i, line in enumerate(lines) if line.startswith("error:")), None)
    if at is None:
        return lines[-1] if lines else ""
    head = re.sub(r"^error: (Invalid configuration( in \S+?)?( \(\d+ problems\))?:)?\s*", "", lines[at])
    return head or (lines[at + 1] if at + 1 < len(lines) else "")


def case(name: str):
    example = EXAMPLES[name]
    marks = [pytest.mark.xfail(strict=True, reason=example.xfail)] if example.xfail else []
    return pytest.param(name, marks=marks, id=name.removesuffix(".yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("name", [case(name) for name in EXAMPLES])
def test_example_config_trains_or_is_refused_naming_what_it_needs(runs: ExampleRuns, name: str):
    example, outcome = EXAMPLES[name], runs.run(name)
    assert "Traceback" not in outcome.message, outcome.message[-3000:]
    if example.outcome.startswith("refused: "):
        assert outcome.exit_code == 2, outcome.message[-3000:]
        assert example.outcome.removeprefix("refused: ") in outcome.message, outcome.message[-3000:]
        return
    assert outcome.exit_code == 0, outcome.message[-3000:]
    assert outcome.output is not None
    written = {p.name for p in outcome.output.iterdir()}
    assert set(expected_files(runs.config(name))) <= written, f"{name}: {outcome.output} holds {sorted(written)}"
    state = outcome.output / "trainer_state.json"
    if state.is_file():  # the trainer-based stages; ppo's own loop writes none
        assert json.loads(state.read_text())["global_step"] == 2  # max_steps: 2
    assert_ran_as_named(name, outcome)
    if example.base == "qwen2_5vl":  # a vision-language model's folder keeps its image processor
        assert "preprocessor_config.json" in written
    if name in LAYOUT_CHECKED:
        assert_output_layout(outcome.output, LAYOUT_CHECKED[name])


def assert_ran_as_named(name: str, outcome: Outcome) -> None:
    """A run that trained ended on a finite loss, and its record shows the example's method or optimizer."""
    records = outcome.records()
    if not (outcome.output / "train_results.json").is_file():  # it did not train (prediction, evaluation, export)
        assert not records and name not in RAN, (name, records)
        return
    loss = json.loads((outcome.output / "train_results.json").read_text())["train_loss"]
    assert math.isfinite(loss), f"{name}: train_loss {loss}"
    assert len(records) == 1, f"{name}: {len(records)} '{LINE_PREFIX}' lines"
    assert name in RAN, f"{name} trained with {records[0]}; say in RAN what it must show"
    for key, expected in RAN[name].items():
        seen = getattr(records[0], key)
        if key == "added_modules":
            assert set(expected) <= set(seen), f"{name}: {key} {seen}, expected {expected} among them"
        else:
            assert seen == expected, f"{name}: {key} {seen!r}, expected {expected!r}"


# the plain LoRA runs of the alignment stages write LLaMA-Factory's output layout file for file
LAYOUT_CHECKED = {"train_lora/llama3_lora_reward.yaml": "rm", "train_lora/llama3_lora_dpo.yaml": "dpo",
                  "train_lora/llama3_lora_kto.yaml": "kto"}


def expected_files(config: Mapping[str, Any]) -> tuple[str, ...]:
    """What a finished example leaves in its output folder."""
    if "export_dir" in config and "output_dir" not in config:
        return EXPORTED_FILES
    if "task" in config:
        return EVALUATED_FILES
    if config.get("do_predict") and not config.get("do_train"):
        return PREDICTED_FILES
    weights = "model.safetensors" if config.get("finetuning_type") in ("full", "freeze") else "adapter_model.safetensors"
    return (*TRAINED_FILES, weights)
