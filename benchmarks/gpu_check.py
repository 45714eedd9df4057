"""GPU throughput check: tuneline's trainer against plain TRL SFTTrainer, then QLoRA, on one GPU.

    bash benchmarks/gpu_check.sh            # Qwen2.5-0.5B-shaped, bf16, seq 2048, 30 steps
    python benchmarks/gpu_check.py --tiny   # the same path on a tiny model, for a CPU dry run

Needs no network: the model is a randomly initialised Qwen2.5-0.5B-shaped network (its published
dimensions) and the tokenizer is trained here on the project's demo data. The data is a generated
alpaca dataset tokenized by tuneline with the chatml template and packed into sequences of
`--seq-len` tokens. Three runs of `--steps` optimizer steps each, LoRA r=16 on every linear layer:
tuneline (its worker's `run_training`, in this process so peak memory can be read), TRL's
SFTTrainer with its own packing on the same tokenized rows, and tuneline with 4-bit QLoRA. It
prints one table: tokens/s, an MFU estimate (6 x parameters x tokens/s / the GPU's dense bf16 peak)
and peak memory.
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize` while this folder leads the path.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse
import dataclasses
import json
import random
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# Qwen2.5-0.5B's published configuration.
QWEN25_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
              "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 4096, "max_position_embeddings": 4096, "tie_word_embeddings": True}
# Dense bf16 peak FLOP/s by device name (vendor data sheets; without sparsity).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
WORDS = ("model data train token answer question river mountain city green blue quick slow small large bright dark "
         "early late north south water fire light sound number letter story").split()


def build_model(folder: Path, shape: dict, *, dtype: str) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tuneline.core.models.tiny.text import train_tokenizer

    texts = [json.loads(line)["text"] for line in (REPO_ROOT / "data/demo_pretrain.jsonl").read_text().splitlines()]
    tokenizer = train_tokenizer(texts, vocab_size=2048)
    path = folder / "model"
    torch.manual_seed(0)
    config = Qwen2Config(**shape, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_dataset(folder: Path, rows: int) -> None:
    draw = random.Random(0)
    sentence = lambda n: " ".join(draw.choice(WORDS) for _ in range(n)).capitalize() + "."  # noqa: E731
    records = [{"instruction": sentence(draw.randint(8, 40)), "input": "",
                "output": " ".join(sentence(draw.randint(5, 25)) for _ in range(draw.randint(4, 60)))} for _ in range(rows)]
    (folder / "gen.json").write_text(json.dumps(records))
    (folder / "dataset_info.json").write_text(json.dumps({"gen": {"file_name": "gen.json"}}))


def stage_values(folder: Path, model: Path, args, *, quantization_bit: int | None = None) -> dict:
    values = {"model_name_or_path": str(model), "stage": "sft", "finetuning_type": "lora", "lora_rank": 16, "lora_alpha": 32,
              "lora_target": "all", "dataset": "gen", "dataset_dir": str(folder), "template": "chatml",
              "cutoff_len": args.seq_len, "packing": True, "per_device_train_batch_size": args.batch,
              "max_steps": args.steps, "learning_rate": 1.0e-4, "logging_steps": 10, "report_to": "none", "seed": 42,
              "bf16": args.dtype == "bfloat16", "output_dir": str(folder / f"out-{time.monotonic_ns()}")}
    if quantization_bit:
        values["quantization_bit"] = quantization_bit
    return values


def tokenize(values: dict, folder: Path, name: str) -> Path:
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    output = folder / name
    tokenize_stage_data(build_stage_config(values), tokenizer_path=values["model_name_or_path"], output_dir=output)
    return output


def run_tuneline(values: dict, dataset: Path) -> dict:
    from tuneline.core.stages.registry import build_stage_config
    from tuneline.core.training.job import TrainJob
    from tuneline.core.worker.run import run_training

    config = build_stage_config(values)
    job = TrainJob(model_path=values["model_name_or_path"], dataset_path=str(dataset), output_dir=values["output_dir"],
                   finetuning=dataclasses.asdict(config.finetuning), model=dataclasses.asdict(config.model),
                   training={k: v for k, v in config.training.items() if k != "output_dir"})
    _reset_memory()
    metrics = run_training(job)
    tokens = _packed_tokens(dataset, steps=values["max_steps"], batch=values["per_device_train_batch_size"])
    return {"tokens_per_s": tokens / metrics["train_runtime"], "peak_gib": _peak_gib(), "params": _params(values)}


def run_trl(values: dict, unpacked: Path) -> dict:
    import torch
    from datasets import load_from_disk
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    dtype = torch.bfloat16 if values["bf16"] else torch.float32
    model = AutoModelForCausalLM.from_pretrained(values["model_name_or_path"], dtype=dtype)
    args = SFTConfig(output_dir=values["output_dir"] + "-trl", per_device_train_batch_size=values["per_device_train_batch_size"],
                     max_steps=values["max_steps"], learning_rate=values["learning_rate"], logging_steps=10, report_to=[],
                     save_strategy="no", max_length=values["cutoff_len"], packing=True, bf16=values["bf16"], seed=42,
                     disable_tqdm=True, dataloader_pin_memory=torch.cuda.is_available(),
                     gradient_checkpointing=False)  # as tuneline runs here
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=args, train_dataset=load_from_disk(str(unpacked))["train"],
                         processing_class=AutoTokenizer.from_pretrained(unpacked / "tokenizer"), peft_config=lora)
    _reset_memory()
    metrics = trainer.train().metrics
    return {"tokens_per_s": float(metrics["num_tokens"]) / metrics["train_runtime"], "peak_gib": _peak_gib(),
            "params": _params(values)}


def _packed_tokens(dataset: Path, *, steps: int, batch: int) -> int:
    """Non-padding tokens in `steps` x `batch` packs, estimated from the first ones (the trainer
    shuffles whole packs, and packs differ little in fill). Padding trails each pack."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(dataset / "tokenizer").pad_token_id
    train = load_from_disk(str(dataset))["train"]
    count = min(len(train), steps * batch)
    filled = 0
    for example in train.select(range(count)):
        ids, labels = example["input_ids"], example["labels"]
        end = len(ids)
        while end and ids[end - 1] == pad and labels[end - 1] == -100:
            end -= 1
        filled += end
    return filled * (steps * batch) // count


def _params(values: dict) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(values["model_name_or_path"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _reset_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def peak_flops() -> tuple[float | None, str]:
    import torch

    if not torch.cuda.is_available():
        return None, "cpu"
    name = torch.cuda.get_device_name()
    return next((flops for key, flops in PEAK_BF16.items() if key in name), None), name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model in float32, for a dry run on the CPU")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--skip-qlora", action="store_true")
    args = parser.parse_args()
    if args.tiny:
        args.steps, args.seq_len, args.batch = min(args.steps, 4), min(args.seq_len, 256), min(args.batch, 2)
    args.dtype = "float32" if args.tiny else "bfloat16"
    peak, device = peak_flops()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["TUNELINE_CACHE"] = str(folder / "cache")
        model = build_model(folder, TINY if args.tiny else QWEN25_05B, dtype=args.dtype)
        write_dataset(folder, rows=max(64, args.steps * args.batch * 8))
        values = stage_values(folder, model, args)
        packed = tokenize(values, folder, "packed")
        unpacked = tokenize({**values, "packing": False}, folder, "unpacked")
        rows = {"tuneline LoRA": run_tuneline(values, packed), "TRL SFTTrainer LoRA": run_trl(values, unpacked)}
        if not args.skip_qlora:
            rows["tuneline QLoRA 4-bit"] = run_tuneline(stage_values(folder, model, args, quantization_bit=4), packed)
    print(f"\ndevice {device}; {'tiny' if args.tiny else 'Qwen2.5-0.5B-shaped'} model, {args.dtype}, LoRA r=16 all linear, "
          f"seq {args.seq_len}, batch {args.batch}, packing on, {args.steps} steps")
    print(f"{'run':24} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9} {'vs TRL':>7}")
    baseline = rows["TRL SFTTrainer LoRA"]["tokens_per_s"]
    for name, row in rows.items():
        mfu = f"{6 * row['params'] * row['tokens_per_s'] / peak:.1%}" if peak else "n/a"
        memory = f"{row['peak_gib']:.2f}" if row["peak_gib"] is not None else "n/a"
        print(f"{name:24} {row['tokens_per_s']:10.0f} {mfu:>7} {memory:>9} {row['tokens_per_s'] / baseline:7.2f}")


if __name__ == "__main__":
    main()
