"""Training throughput of `tuneline train` against plain TRL SFTTrainer, on the same data and model.

    python benchmarks/train_throughput.py [--rows 512] [--cutoff-len 256] [--repeats 1]

Builds the project's tiny LLaMA-shaped base model, tokenizes the demo instructions once, then trains
one epoch of LoRA (r=16 on every linear layer) both ways with the same batches and optimizer
settings: `tuneline train` as a user runs it (its own worker process) and TRL's `SFTTrainer` in
this process on the same tokenized rows, with TRL's own collator. It prints the non-padding tokens
per second of each training loop (trainer-reported `train_runtime`, so process start and model
loading are left out of both), their ratio, the wall time of the whole `tuneline train` command, and
the share of padding in the batches without and with packing.
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize` while this folder leads the path.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
QUIET = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
         "MLFLOW_DISABLE_TELEMETRY": "true", "TOKENIZERS_PARALLELISM": "false"}
LORA = {"finetuning_type": "lora", "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.0, "lora_target": "all"}
TRAINING = {"per_device_train_batch_size": 8, "learning_rate": 1.0e-3, "num_train_epochs": 1.0, "seed": 42,
            "lr_scheduler_type": "cosine", "logging_steps": 5, "report_to": "none"}


def build_model(folder: Path) -> Path:
    from tuneline.core.data.dataset_info import get_dataset_attrs, load_rows
    from tuneline.core.models.tiny.text import BaseModelConfig, build_base_model

    data = REPO_ROOT / "data"
    texts = [m["content"] for attr in get_dataset_attrs(["demo_pretrain", "demo_alpaca"], data)
             for row in load_rows(attr, data) for m in [*row["prompt"], *row["response"]]]
    path = folder / "base"
    build_base_model(texts, path, config=BaseModelConfig())
    return path


def stage_config(model: Path, *, rows: int, cutoff_len: int, packing: bool = False) -> dict:
    return {"model_name_or_path": str(model), "stage": "sft", "do_train": True, **LORA, "dataset": "demo_alpaca,demo_sharegpt",
            "dataset_dir": str(REPO_ROOT / "data"), "template": "chatml", "cutoff_len": cutoff_len, "max_samples": rows,
            "packing": packing, **TRAINING}


def tokenized(config: dict) -> tuple[Path, dict]:
    """The tokenized dataset `tuneline train` uses for `config` (content-keyed cache) and its counters."""
    from tuneline.core.stages.registry import build_stage_config
    from tuneline.core.store.artifacts import read_manifest
    from tuneline.flows.single import tokenized_dataset

    path = tokenized_dataset(build_stage_config(config))
    return path, read_manifest(path)["metrics"]


def run_tuneline(folder: Path, config: dict) -> dict:
    import time

    import yaml

    output = folder / f"tuneline-{time.monotonic_ns()}"
    path = folder / "stage.yaml"
    path.write_text(yaml.safe_dump({**config, "output_dir": str(output)}))
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tuneline.flows.cli", "train", str(path)], capture_output=True, text=True,
                            env={**os.environ, **QUIET})
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"tuneline train failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    metrics = json.loads((output / "all_results.json").read_text())
    return {"train_runtime": metrics["train_runtime"], "wall": wall}


def run_trl(folder: Path, model_path: Path, dataset_path: Path, config: dict) -> dict:
    import torch
    from datasets import load_from_disk
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(dataset_path / "tokenizer")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    args = SFTConfig(
        output_dir=str(folder / "trl"), per_device_train_batch_size=TRAINING["per_device_train_batch_size"],
        learning_rate=TRAINING["learning_rate"], num_train_epochs=TRAINING["num_train_epochs"], seed=TRAINING["seed"],
        lr_scheduler_type=TRAINING["lr_scheduler_type"], logging_steps=TRAINING["logging_steps"], report_to=[],
        save_strategy="no", max_length=config["cutoff_len"], packing=False, disable_tqdm=True,
        dataloader_pin_memory=False, bf16=False, gradient_checkpointing=False,  # as tuneline runs: fp32, no checkpointing
    )
    peft_config = LoraConfig(r=LORA["lora_rank"], lora_alpha=LORA["lora_alpha"], lora_dropout=LORA["lora_dropout"],
                             target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=args, train_dataset=load_from_disk(str(dataset_path))["train"],
                         processing_class=tokenizer, peft_config=peft_config)
    return {"train_runtime": trainer.train().metrics["train_runtime"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512, help="rows of each demo dataset (two datasets)")
    parser.add_argument("--cutoff-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each trainer; the median is reported")
    args = parser.parse_args()
    os.environ.update(QUIET)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["TUNELINE_CACHE"] = str(folder / "cache")
        model = build_model(folder)
        config = stage_config(model, rows=args.rows, cutoff_len=args.cutoff_len)
        dataset_path, counters = tokenized(config)
        _, packed_counters = tokenized(stage_config(model, rows=args.rows, cutoff_len=args.cutoff_len, packing=True))
        tokens = counters["total_tokens"]
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(run_tuneline(folder, config))
            theirs.append(run_trl(folder, model, dataset_path, config))
        ours_rate = tokens / statistics.median(r["train_runtime"] for r in ours)
        trl_rate = tokens / statistics.median(r["train_runtime"] for r in theirs)
        print(f"sft LoRA r=16 (all linear), tiny LLaMA-shaped model, {counters['examples']} examples, "
              f"cutoff_len {args.cutoff_len}, batch {TRAINING['per_device_train_batch_size']}, 1 epoch, {torch_threads()} threads")
        print(f"tuneline train:        {ours_rate:10.0f} non-padding tokens/s (training loop)")
        print(f"TRL SFTTrainer:        {trl_rate:10.0f} non-padding tokens/s (training loop)")
        print(f"ratio (tuneline / TRL): {ours_rate / trl_rate:9.2f}  (goal >= 0.95)")
        print(f"tuneline train wall:   {statistics.median(r['wall'] for r in ours):10.1f} s (process start, loading, saving included)")
        print(f"padding share without packing: {counters['padding_ratio']:.3f}")
        print(f"padding share with packing:    {packed_counters['padding_ratio']:.3f}")


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
