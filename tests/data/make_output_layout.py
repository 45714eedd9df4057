"""LLaMA-Factory 0.9.5's output layout: the files `llamafactory-cli train` leaves in output_dir for each
of its stages (LoRA, 2 steps on CPU, a tiny Llama model built here on the llama3 tokenizer), and the keys
of its trainer_log.jsonl, into tests/data/output_layout.json (file names only, no contents). Each stage
runs twice, with and without a validation split, so that the files only evaluation writes are known.
Run with LLaMA-Factory's Python from the repository root:

    /work/lfvenv/bin/python tests/data/make_output_layout.py tests/data/output_layout.json

The file keeps what the script does not record (tuneline's own extras and its own stage kinds) as it was.
In the recorded arguments `{model}`, `{dataset_dir}` and `{output_dir}` stand for the tiny model,
LLaMA-Factory's demo data folder and the run's folder. A stage LLaMA-Factory cannot run here is named
in `not_run` with the reason.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

SHARED = Path(__file__).resolve().parents[3] / "shared"
TOKENIZER = "llama3"
COMMAND = ("/work/lfvenv/bin/python tests/data/make_output_layout.py tests/data/output_layout.json "
           "(LLaMA-Factory's llamafactory-cli train, once per stage with and once without val_size)")
COMMON = {
    "model_name_or_path": "{model}", "do_train": True, "finetuning_type": "lora", "lora_rank": 4, "lora_target": "all",
    "dataset_dir": "{dataset_dir}", "template": "llama3", "cutoff_len": 64, "max_samples": 16, "overwrite_cache": True,
    "preprocessing_num_workers": None, "dataloader_num_workers": 0, "output_dir": "{output_dir}", "logging_steps": 1,
    "save_steps": 2, "plot_loss": True, "overwrite_output_dir": True, "report_to": "none", "per_device_train_batch_size": 2,
    "learning_rate": 1.0e-4, "max_steps": 2, "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "seed": 7,
}
STAGES = {  # LLaMA-Factory's examples/train_lora/llama3_lora_*.yaml, each stage's own keys
    "pt": {"stage": "pt", "dataset": "c4_demo"},
    "sft": {"stage": "sft", "dataset": "alpaca_en_demo"},
    "rm": {"stage": "rm", "dataset": "dpo_en_demo"},
    "dpo": {"stage": "dpo", "dataset": "dpo_en_demo", "pref_beta": 0.1, "pref_loss": "sigmoid"},
    "kto": {"stage": "kto", "dataset": "kto_en_demo", "pref_beta": 0.1},
}
NOT_RUN = {
    "ppo": "LLaMA-Factory 0.9.5's PPO trainer requires trl>=0.8.6,<=0.9.6 (CustomPPOTrainer.__init__ checks it whatever "
           "DISABLE_VERSION_CHECK says, and drives trl's old PPOTrainer API), while its other stages run on the trl 0.24 "
           "and transformers 5.6 it installs with; `llamafactory-cli train` with stage ppo ends in that ImportError",
}
EVALUATION = {"val_size": 0.25, "per_device_eval_batch_size": 2, "eval_strategy": "steps", "eval_steps": 2}


def build_tiny_model(tokenizer_dir: Path, folder: Path) -> Path:
    """A two-layer Llama of hidden size 32 on a real tokenizer, saved with that tokenizer (the layout test
    builds the same model on the same tokenizer for `tuneline train`)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def arguments(stage: str, *, evaluate: bool) -> dict:
    return {**COMMON, **STAGES[stage], **(EVALUATION if evaluate else {})}


def train(stage: str, *, evaluate: bool, places: dict, folder: Path) -> Path:
    """Run `llamafactory-cli train` on the stage's arguments; the output folder."""
    output = folder / f"{stage}{'_eval' if evaluate else ''}"
    resolved = {key: value.format(**places, output_dir=output) if isinstance(value, str) else value
                for key, value in arguments(stage, evaluate=evaluate).items()}
    config = output.with_suffix(".yaml")
    config.write_text(yaml.safe_dump(resolved, sort_keys=False))
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "DISABLE_VERSION_CHECK": "1", "OMP_NUM_THREADS": "1"}
    cli = Path(sys.executable).parent / "llamafactory-cli"
    result = subprocess.run([str(cli), "train", str(config)], capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        sys.exit(f"llamafactory-cli train {stage} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return output


def files(folder: Path) -> list[str]:
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())


def log_keys(folder: Path) -> list[str]:
    lines = (folder / "trainer_log.jsonl").read_text(encoding="utf-8").splitlines()
    return sorted({key for line in lines for key in json.loads(line)})


def record_stages(folder: Path) -> dict:
    model = build_tiny_model(SHARED / "tokenizers" / TOKENIZER, folder / "tiny")
    places = {"model": str(model), "dataset_dir": str(SHARED / "llamafactory" / "data")}
    kinds = {}
    for stage in STAGES:
        plain = train(stage, evaluate=False, places=places, folder=folder)
        evaluated = train(stage, evaluate=True, places=places, folder=folder)
        kinds[stage] = {"arguments": arguments(stage, evaluate=True), "files": files(evaluated),
                        "files_only_with_eval": sorted(set(files(evaluated)) - set(files(plain))),
                        "log_keys": log_keys(evaluated)}
    return kinds


if __name__ == "__main__":
    target = Path(sys.argv[1])
    kept = json.loads(target.read_text(encoding="utf-8")) if target.is_file() else {}
    with tempfile.TemporaryDirectory() as scratch:
        recorded = record_stages(Path(scratch))
    layout = {
        "about": kept.get("about", ""), "llamafactory_version": "0.9.5", "command": COMMAND, "tokenizer": TOKENIZER,
        "kinds": recorded, "not_run": NOT_RUN, "tuneline": kept.get("tuneline", {}),
    }
    target.write_text(json.dumps(layout, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
