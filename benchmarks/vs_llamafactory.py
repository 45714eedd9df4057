"""Training speed and whole-command wall time of `tuneline train` against LLaMA-Factory 0.9.5, stage by stage.

    python benchmarks/vs_llamafactory.py [--lf-venv DIR] [--rounds 3] [--stages pt,sft,rm,dpo,kto,ppo] [--steps 8]

For each stage (pt, sft, rm, dpo, kto, ppo) one YAML in LLaMA-Factory's example style (LoRA rank 8
on every linear layer, the demo datasets of LLaMA-Factory's `data/` folder, one cutoff_len, batch
size and step count) is run by both tools, alternating: LLaMA-Factory, then tuneline, `--rounds`
times, so both see the same load on a shared machine. The runs' YAML files differ in `output_dir`
alone. Both load the same tiny model, which this script builds with the project's tiny base-model
builder and saves as a Hugging Face folder; stage ppo scores with a reward folder built from it that
both read (`reward_model_type: full`: sequence-classification weights for tuneline and the same head
as `value_head.safetensors` for LLaMA-Factory).

What is measured, the same way for both:
- training samples/s: steps x global batch / training-loop seconds, a sample being one row (a
  text block for pt, a pair for rm and dpo, one reply for kto, one prompt for ppo). The seconds are
  the `train_runtime` each tool writes to `train_results.json`, transformers' Trainer's own clock
  around its training loop in both. LLaMA-Factory's ppo loop writes no results file, so its loop
  (`CustomPPOTrainer.ppo_train`) is timed by wrapping that method, started through the same
  command-line entry point; tuneline's ppo `train_runtime` is the clock around its own loop.
- CPU: the user and system seconds of the whole command's processes, which vary less than wall time
  when other jobs share the machine (not part of the goal).
- wall: the whole command, from process start to exit (imports, tokenizing, model loading, training,
  saving). LLaMA-Factory's example YAML sets `overwrite_cache: true`, so it tokenizes on every run;
  tuneline's cache of tokenized data is emptied before every run, so it tokenizes on every run too
  (its table of the trainer's argument names, built once per transformers version, is kept).

LLaMA-Factory 0.9.5's ppo stops before training with TRL 0.24 (its trainer asks for TRL <= 0.9.6, a
check DISABLE_VERSION_CHECK does not lift), and with TRL 0.9.6 its other stages' modules fail to
import, so the table marks its ppo as failed and gives tuneline's ppo numbers alone.

The table gives each tool's median over the rounds (and the range, to show the noise), and the
ratios tuneline/LF. Goal: every samples/s ratio >= 1.0 and every wall ratio <= 1.0.
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py would shadow the standard library's `tokenize` while this folder leads the path.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LF_VENV_VARIABLE = "TUNELINE_LF_VENV"
DEFAULT_LF_VENV = "/work/lfvenv"
QUIET = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
         "MLFLOW_DISABLE_TELEMETRY": "true", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
STAGES = ("pt", "sft", "rm", "dpo", "kto", "ppo")
DATASETS = {"pt": "c4_demo", "sft": "alpaca_en_demo", "rm": "dpo_en_demo", "dpo": "dpo_en_demo", "kto": "kto_en_demo",
            "ppo": "alpaca_en_demo"}
LEARNING_RATES = {"pt": 1.0e-4, "sft": 1.0e-4, "rm": 1.0e-4, "dpo": 5.0e-6, "kto": 5.0e-6, "ppo": 1.0e-5}
# Small enough that a round of six stages fits in a few minutes on two shared cores.
TINY = {"vocab_size": 4096, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}
LF_PPO_TIMER = "lf_ppo_seconds.json"


def lf_python(venv: Path) -> Path:
    """The LF venv's python, after checking that it runs LLaMA-Factory; exits 2 with the fix otherwise."""
    python, cli = venv / "bin" / "python", venv / "bin" / "llamafactory-cli"
    if not python.is_file() or not cli.is_file():
        sys.exit(f"error: no LLaMA-Factory found in {venv} ({cli} is missing); install llamafactory==0.9.5 in a "
                 f"virtual environment and pass it as --lf-venv DIR or set {LF_VENV_VARIABLE}.")
    probe = subprocess.run([str(python), "-c", "import llamafactory; print(llamafactory.__version__)"], capture_output=True,
                           text=True, env={**os.environ, **QUIET})
    if probe.returncode != 0:
        sys.exit(f"error: {python} cannot import llamafactory:\n{probe.stderr.strip()[-800:]}\n"
                 f"Fix that environment or pass another one as --lf-venv DIR (or {LF_VENV_VARIABLE}).")
    version = probe.stdout.strip()
    if version != "0.9.5":
        print(f"note: {venv} holds LLaMA-Factory {version}; this comparison was written for 0.9.5", flush=True)
    return python


def build_models(folder: Path) -> tuple[Path, Path]:
    """The tiny base (policy) folder and a reward folder that both tools read as a full reward model."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from tuneline.core.models.tiny.text import BaseModelConfig, build_base_model

    texts = [json.loads(line)["text"] for line in (REPO_ROOT / "data/demo_pretrain.jsonl").read_text().splitlines()]
    base = folder / "base"
    build_base_model(texts, base, config=BaseModelConfig(**TINY))
    torch.manual_seed(0)
    reward = LlamaForSequenceClassification.from_pretrained(base, num_labels=1)
    reward_dir = folder / "reward"
    reward.save_pretrained(reward_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(base).save_pretrained(reward_dir)
    head = reward.score.weight.detach().clone().contiguous()  # LF's value head reads the same last hidden state
    save_file({"v_head.summary.weight": head, "v_head.summary.bias": torch.zeros(1)}, str(reward_dir / "value_head.safetensors"))
    return base, reward_dir


def stage_config(stage: str, *, base: Path, reward: Path, data_dir: Path, steps: int, batch: int, cutoff_len: int) -> dict:
    """LLaMA-Factory's example YAML for `stage` (examples/train_lora/llama3_lora_*.yaml), on the tiny model."""
    config = {
        "model_name_or_path": str(base), "stage": stage, "do_train": True,
        "finetuning_type": "lora", "lora_rank": 8, "lora_target": "all",
        "dataset": DATASETS[stage], "dataset_dir": str(data_dir), "template": "chatml", "cutoff_len": cutoff_len,
        "max_samples": max(64, steps * batch), "overwrite_cache": True,
        "logging_steps": max(1, steps // 2), "save_steps": 500, "plot_loss": True, "overwrite_output_dir": True,
        "report_to": "none",
        "per_device_train_batch_size": batch, "gradient_accumulation_steps": 1, "learning_rate": LEARNING_RATES[stage],
        "max_steps": steps, "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "seed": 42,
    }
    if stage == "dpo":
        config.update({"pref_beta": 0.1, "pref_loss": "sigmoid"})
    if stage == "kto":
        config.update({"pref_beta": 0.1})
    if stage == "ppo":
        config.update({"reward_model": str(reward), "reward_model_type": "full", "max_new_tokens": 32, "top_k": 0, "top_p": 0.9})
    return config


def write_yaml(config: dict, path: Path, output_dir: Path) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({**config, "output_dir": str(output_dir)}, sort_keys=False))
    return path


class RunFailed(Exception):
    """A tool's command exited with an error; the message holds the end of its log."""


def run_command(command: list[str], *, env: dict[str, str], log: Path) -> tuple[float, float]:
    """Run `command`, its output to `log`; its wall seconds and the CPU seconds of its process tree."""
    before = _children_cpu()
    started = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent).returncode
    seconds = time.perf_counter() - started
    if code != 0:
        tail = [line for line in log.read_text().splitlines() if line.strip()][-3:]
        raise RunFailed(f"{Path(command[0]).name} exited with {code}: " + " / ".join(tail)[-600:])
    return seconds, _children_cpu() - before


def _children_cpu() -> float:
    """User and system seconds of every finished child process, theirs included (each waits for its own)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_lf(python: Path, stage: str, yaml_path: Path, output: Path) -> dict:
    env = {**os.environ, **QUIET}
    if stage == "ppo":
        command = [str(python), str(Path(__file__).resolve()), "--lf-timed-ppo", str(yaml_path)]
    else:
        command = [str(python.parent / "llamafactory-cli"), "train", str(yaml_path)]
    wall, cpu = run_command(command, env=env, log=yaml_path.with_suffix(".log"))
    if stage == "ppo":
        runtime = json.loads((output / LF_PPO_TIMER).read_text())["train_runtime"]
    else:
        runtime = json.loads((output / "train_results.json").read_text())["train_runtime"]
    return {"train_runtime": runtime, "wall": wall, "cpu": cpu}


def run_tuneline(yaml_path: Path, output: Path, cache: Path) -> dict:
    # No tokenized data kept from an earlier run, as LLaMA-Factory's overwrite_cache does; the table of the
    # trainer's argument names that tuneline keeps per transformers version (built once an install) stays.
    shutil.rmtree(cache / "artifacts", ignore_errors=True)
    script = Path(sys.executable).parent / "tuneline"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "tuneline.flows.cli"]
    env = {**os.environ, **QUIET, "TUNELINE_CACHE": str(cache)}
    wall, cpu = run_command([*command, "train", str(yaml_path)], env=env, log=yaml_path.with_suffix(".log"))
    runtime = json.loads((output / "all_results.json").read_text())["train_runtime"]
    return {"train_runtime": runtime, "wall": wall, "cpu": cpu}


def lf_timed_ppo(yaml_path: str) -> None:
    """Inside LF's venv: `llamafactory-cli train YAML` with its ppo training loop timed (it writes no results file)."""
    import yaml
    from llamafactory.cli import main as cli_main
    from llamafactory.train.ppo.trainer import CustomPPOTrainer

    output = Path(yaml.safe_load(Path(yaml_path).read_text())["output_dir"])
    loop = CustomPPOTrainer.ppo_train

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        result = loop(self, *args, **kwargs)
        seconds = time.perf_counter() - started
        if self.is_world_process_zero():
            output.mkdir(parents=True, exist_ok=True)
            (output / LF_PPO_TIMER).write_text(json.dumps({"train_runtime": seconds}))
        return result

    CustomPPOTrainer.ppo_train = timed
    sys.argv = ["llamafactory-cli", "train", yaml_path]
    cli_main()


def measure(stages: list[str], *, python: Path, folder: Path, rounds: int, steps: int, batch: int, cutoff_len: int,
            data_dir: Path) -> dict[str, dict[str, list[dict]]]:
    """Per stage and tool, one result per round: samples/s, train_runtime and wall, or the failure."""
    base, reward = build_models(folder)
    results: dict[str, dict[str, list[dict]]] = {}
    for stage in stages:
        config = stage_config(stage, base=base, reward=reward, data_dir=data_dir, steps=steps, batch=batch, cutoff_len=cutoff_len)
        runs: dict[str, list[dict]] = {"lf": [], "tuneline": []}
        for index in range(rounds):
            for tool in ("lf", "tuneline"):
                if runs[tool] and "failed" in runs[tool][-1]:
                    continue  # a tool that failed once fails the same way again
                output = folder / f"{stage}-{tool}-{index}"
                yaml_path = write_yaml(config, folder / f"{stage}-{tool}-{index}.yaml", output)
                try:
                    run = (run_lf(python, stage, yaml_path, output) if tool == "lf"
                           else run_tuneline(yaml_path, output, folder / "cache"))
                except RunFailed as e:
                    runs[tool].append({"failed": str(e)})
                    print(f"  {stage} round {index + 1} {tool:8s}: failed: {e}", flush=True)
                    continue
                run["samples_per_s"] = steps * batch / run["train_runtime"]
                runs[tool].append(run)
                print(f"  {stage} round {index + 1} {tool:8s}: {run['samples_per_s']:7.2f} samples/s, "
                      f"train {run['train_runtime']:6.1f} s, wall {run['wall']:6.1f} s, CPU {run['cpu']:6.1f} s", flush=True)
                shutil.rmtree(output, ignore_errors=True)
        results[stage] = runs
    return results


def table(results: dict[str, dict[str, list[dict]]]) -> str:
    lines = [f"{'stage':<6} {'LF samples/s':>20} {'tuneline samples/s':>20} {'ratio':>6} {'LF wall s':>18} "
             f"{'tuneline wall s':>18} {'ratio':>6} {'LF CPU s':>18} {'tuneline CPU s':>18} {'ratio':>6}"]
    verdicts, failures = [], []
    for stage, runs in results.items():
        row = [f"{stage:<6}"]
        for tool in ("lf", "tuneline"):
            failures += [f"{stage} {tool}: {r['failed']}" for r in runs[tool][:1] if "failed" in r]
        for key, fmt, width in (("samples_per_s", "{:.2f}", 20), ("wall", "{:.1f}", 18), ("cpu", "{:.1f}", 18)):
            medians = []
            for tool in ("lf", "tuneline"):
                values = [r[key] for r in runs[tool] if key in r]
                medians.append(statistics.median(values) if values else None)
                cell = f"{fmt.format(medians[-1])} ({fmt.format(min(values))}-{fmt.format(max(values))})" if values else "failed"
                row.append(f"{cell:>{width}}")
            if None in medians:
                row.append(f"{'-':>6}")
                continue
            ratio = medians[1] / medians[0]
            row.append(f"{ratio:6.2f}")
            if key != "cpu":  # the CPU seconds are shown because they vary less with the machine's load
                verdicts.append(ratio >= 1.0 if key == "samples_per_s" else ratio <= 1.0)
        lines.append(" ".join(row))
    lines.append("")
    lines.append("medians over the rounds (min-max in brackets); goal, samples/s ratio >= 1.0 and wall ratio <= 1.0: "
                 + ("met" if verdicts and all(verdicts) else "not met") + " where both ran")
    lines += [f"failed: {line}" for line in failures]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lf-venv", default=os.environ.get(LF_VENV_VARIABLE, DEFAULT_LF_VENV),
                        help=f"virtual environment with llamafactory 0.9.5 (default: ${LF_VENV_VARIABLE} or {DEFAULT_LF_VENV})")
    parser.add_argument("--lf-data", default=str(REPO_ROOT.parent / "shared/llamafactory/data"),
                        help="LLaMA-Factory's data folder (dataset_info.json and the demo datasets)")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--cutoff-len", type=int, default=128)
    parser.add_argument("--lf-timed-ppo", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lf_timed_ppo:
        lf_timed_ppo(args.lf_timed_ppo)
        return
    stages = [s for s in args.stages.split(",") if s]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        sys.exit(f"error: --stages names {', '.join(unknown)}; choose among {', '.join(STAGES)}.")
    data_dir = Path(args.lf_data)
    if not (data_dir / "dataset_info.json").is_file():
        sys.exit(f"error: --lf-data {data_dir} holds no dataset_info.json; pass LLaMA-Factory's data folder.")
    python = lf_python(Path(args.lf_venv))
    os.environ.update(QUIET)
    import torch

    print(f"LoRA r=8 (all linear), tiny LLaMA-shaped model (hidden {TINY['hidden_size']}, {TINY['num_hidden_layers']} layers), "
          f"cutoff_len {args.cutoff_len}, batch {args.batch}, {args.steps} steps, {args.rounds} rounds LF then tuneline, "
          f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads", flush=True)
    with tempfile.TemporaryDirectory(prefix="vs_llamafactory-") as tmp:
        results = measure(stages, python=python, folder=Path(tmp), rounds=args.rounds, steps=args.steps, batch=args.batch,
                          cutoff_len=args.cutoff_len, data_dir=data_dir)
    print(table(results))


if __name__ == "__main__":
    main()
