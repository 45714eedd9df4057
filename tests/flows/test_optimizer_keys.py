"""Every optimizer and method key of LLaMA-Factory's table through `tuneline train`, as a user runs it.

Each row is a LLaMA-Factory SFT config on the tiny LLaMA (4 demo rows, one batch of 4, so each
step trains on the same rows and the first and last logged losses are comparable, 5 steps), run
through the command's `main` in this process with the real worker processes: the jobs that keep
bitsandbytes out of their process are forked from this process's warm worker, which all of them
share (its imports are paid once), and the ones whose optimizer package requires bitsandbytes
(GaLore, APOLLO) get a worker started ahead for them alone. The GaLore row runs as
`python -m tuneline.flows.cli train` in a process of its own, exactly as a user types it. The
whole table takes about 60 s of CPU.

For each row: exit 0, no traceback, the loss falls by `MARGIN` or more, and the run's own record
of what it trained with (`MethodRecord`, the "training with:" line) shows the optimizer, loss,
attention or modules the key names. The plain row shows that none of these is there by default.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO_ROOT, run_cli, tokenize_demo_alpaca
from tuneline.core.training.method_record import LINE_PREFIX, MethodRecord

STEPS = 5
MARGIN = 0.1  # first loss minus last; the smallest drop seen (LLaMA Pro's, 0.23) is more than twice as large
BASE_KEYS: dict[str, Any] = {
    "stage": "sft", "do_train": True, "finetuning_type": "full", "dataset": "demo_alpaca", "dataset_dir": str(REPO_ROOT / "data"),
    "template": "default", "cutoff_len": 48, "max_samples": 4, "per_device_train_batch_size": 4, "max_steps": STEPS,
    "learning_rate": 1.0e-2, "lr_scheduler_type": "constant", "logging_steps": 1, "seed": 0, "report_to": "none",
    "overwrite_output_dir": True, "preprocessing_num_workers": None, "dataloader_num_workers": 0,
}
PROJECTED = "tuneline.core.training.optimizers.projected"
ADAPTIVE = "tuneline.core.training.optimizers.adaptive"
ROUTED = "tuneline.core.models.mixture_of_depths"


@dataclass(frozen=True)
class Row:
    keys: dict[str, Any]
    used: dict[str, Any]  # the MethodRecord fields the run must show
    base: str = "tiny"  # "expanded": the tiny LLaMA expanded by LLaMA Pro's blocks
    own_process: bool = False  # `python -m tuneline.flows.cli train`, not `main` in this process
    modules: tuple[str, ...] = field(default_factory=tuple)  # module classes the run must have added
    # DFT's loss, each token's cross-entropy times its probability, rises while the model learns (-p log p
    # grows with p up to 1/e), and ASFT's adds a KL that starts at 0: for these the loss that must fall is
    # the plain cross-entropy of the trained rows, under the base and under the model the run saved.
    cross_entropy_checked: bool = False


ROWS: dict[str, Row] = {
    "plain (full, AdamW)": Row({}, {"optimizer": "torch.optim.adamw.AdamW", "loss": "transformers.trainer.Trainer.compute_loss",
                                    "attention": "sdpa", "added_modules": {}, "neftune_noise_alpha": None}),
    "use_galore": Row({"use_galore": True, "galore_rank": 8}, {"optimizer": "galore_torch.adamw.AdamW"}, own_process=True),
    "use_galore + galore_layerwise": Row({"use_galore": True, "galore_rank": 8, "galore_layerwise": True},
                                         {"optimizer": f"{PROJECTED}.LayerwiseOptimizer[galore_torch.adamw.AdamW]"}),
    "use_apollo": Row({"use_apollo": True, "apollo_rank": 8}, {"optimizer": "apollo_torch.apollo.AdamW"}),
    "use_badam (badam_mode: layer)": Row({"use_badam": True, "badam_mode": "layer", "badam_switch_mode": "ascending"},
                                         {"optimizer": "badam.block_optim.BlockOptimizer"}),
    "use_badam (badam_mode: ratio)": Row({"use_badam": True, "badam_mode": "ratio", "badam_update_ratio": 0.5},
                                         {"optimizer": "badam.block_optim.BlockOptimizerRatio"}),
    "use_adam_mini": Row({"use_adam_mini": True}, {"optimizer": "adam_mini.adam_mini.Adam_mini"}),
    "use_muon": Row({"use_muon": True}, {"optimizer": f"{ADAPTIVE}.MuonWithAdamW[torch.optim.Muon, torch.optim.adamw.AdamW]"}),
    "finetuning_type: oft": Row({"finetuning_type": "oft", "oft_block_size": 32}, {}, modules=("peft.tuners.oft.layer.Linear",)),
    "use_llama_pro": Row({"finetuning_type": "freeze", "use_llama_pro": True, "freeze_trainable_layers": 2},
                         {"trainable_layers": [1, 3]}, base="expanded"),
    "mixture_of_depths: convert": Row({"mixture_of_depths": "convert"}, {},
                                      modules=(f"{ROUTED}.RoutedLlamaDecoderLayer", f"{ROUTED}.TokenRouter")),
    "use_dft_loss": Row({"use_dft_loss": True}, {"loss": "tuneline.core.training.losses.dft_loss"}, cross_entropy_checked=True),
    "use_asft_loss": Row({"use_asft_loss": True}, {"loss": "tuneline.core.stages.sft_trainers.AnchoredSFTTrainer.compute_loss"},
                         cross_entropy_checked=True),
    "use_eaft_loss": Row({"use_eaft_loss": True}, {"loss": "tuneline.core.training.losses.eaft_loss(alpha=1.0)"}),
    "neftune_noise_alpha": Row({"neftune_noise_alpha": 5}, {"neftune_noise_alpha": 5.0}),
    "shift_attn (S^2-Attn)": Row({"shift_attn": True}, {"attention": "s2_sdpa"}),
}


@dataclass(frozen=True)
class RowRun:
    exit_code: int
    output: str  # standard output and error together
    losses: list[float]  # as logged, one per step
    record: MethodRecord | None
    falling: tuple[float, float] | None  # the loss that must fall: first and last logged, or the cross-entropy


@pytest.fixture(scope="module")
def row_runs(tiny_base: Path, tmp_path_factory) -> dict[str, RowRun]:
    """Every row, run as the module starts. The commands run here set defaults in os.environ once, and
    the warm worker serves only jobs of the environment it started with: the rows run in one go, and
    the environment is restored after the last, so that all of them share one warm worker."""
    from tuneline.core.worker.warm import stop_warm_worker

    folder = tmp_path_factory.mktemp("optimizer_keys")
    saved = dict(os.environ)
    os.environ["OMP_NUM_THREADS"] = "1"  # the workers' threads would spin-wait against each other on two cores
    try:
        runs = {name: run_row(name, row, folder=folder, tiny_base=tiny_base) for name, row in ROWS.items()}
    finally:
        stop_warm_worker()
        os.environ.clear()
        os.environ.update(saved)
    print("\n" + table(runs))
    return runs


def run_row(name: str, row: Row, *, folder: Path, tiny_base: Path) -> RowRun:
    slug = "".join(c if c.isalnum() else "_" for c in name)
    model = tiny_base if row.base == "tiny" else expanded_base(tiny_base, folder / "expanded")
    config = {**BASE_KEYS, "model_name_or_path": str(model), "output_dir": str(folder / slug), **row.keys}
    path = folder / f"{slug}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    if row.own_process:
        result = run_cli("train", str(path), cwd=folder)
        code, output = result.returncode, result.stdout + result.stderr
    else:
        code, output = train_here(path, cwd=folder)
    log = folder / slug / "trainer_log.jsonl"
    losses = [json.loads(line)["loss"] for line in log.read_text().splitlines()] if log.is_file() else []
    records = [MethodRecord.from_line(line) for line in output.splitlines() if line.startswith(LINE_PREFIX)]
    falling = (losses[0], losses[-1]) if losses else None
    if row.cross_entropy_checked and code == 0:
        rows = tokenize_demo_alpaca(tiny_base, folder / "rows", max_samples=4) if not (folder / "rows").is_dir() else folder / "rows"
        falling = (cross_entropy(tiny_base, rows), cross_entropy(folder / slug, rows))
    return RowRun(code, output, losses, records[0] if len(records) == 1 else None, falling)


def train_here(config: Path, *, cwd: Path) -> tuple[int, str]:
    """`tuneline train CONFIG` through the command's `main` in this process (its workers are processes of
    their own): the exit status and everything it printed. What it sets in os.environ is kept."""
    from tuneline.flows.cli import main

    printed = io.StringIO()
    os.environ["TUNELINE_CACHE"] = str(cwd / "cache")
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            try:
                code = main(["train", str(config)])
            except Exception:  # what the command would end in a traceback on
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(previous)
    return code, printed.getvalue()


def cross_entropy(model_dir: Path, tokenized: Path) -> float:
    """The model's mean cross-entropy over the trained tokens of the rows (one batch, as the runs train on)."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM, DataCollatorForSeq2Seq

    from tuneline.core.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tokenized / "tokenizer")
    tokenizer.padding_side = "right"
    rows = load_from_disk(str(tokenized))["train"]
    batch = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)(
        [{key: row[key] for key in ("input_ids", "attention_mask", "labels")} for row in rows])
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return model(**batch).loss.item()


def expanded_base(tiny_base: Path, folder: Path) -> Path:
    """The tiny LLaMA's 2 layers expanded by 2 identity blocks (LLaMA Pro), which are layers 1 and 3."""
    from tuneline.core.models.expansion import expand_blocks

    if not folder.is_dir():
        expand_blocks(tiny_base, folder, num_expand=2)
    return folder


def table(runs: dict[str, RowRun]) -> str:
    lines = [f"{'key':32} {'first loss':>10} {'last loss':>10}  optimizer / module used"]
    for name, got in runs.items():
        used = "-" if got.record is None else shown(ROWS[name], got.record)
        first, last = (f"{got.falling[0]:.4f}", f"{got.falling[1]:.4f}") if got.falling else ("-", "-")
        if ROWS[name].cross_entropy_checked and got.losses:
            used += f" (cross-entropy; its own loss logged {got.losses[0]:.4f} -> {got.losses[-1]:.4f})"
        lines.append(f"{name:32} {first:>10} {last:>10}  {used}")
    return "\n".join(lines)


def shown(row: Row, record: MethodRecord) -> str:
    """What the record says about the row's key: its checked fields and modules, or the optimizer."""
    parts = [f"{key}={getattr(record, key)}" for key in row.used if key != "added_modules"]
    parts += [f"{module} x{record.added_modules.get(module, 0)}" for module in row.modules]
    return "; ".join(parts[:2]) if parts else f"optimizer={record.optimizer}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ROWS))
def test_key_trains_through_tuneline_train_with_what_it_names(row_runs: dict[str, RowRun], name: str):
    row, got = ROWS[name], row_runs[name]
    assert got.exit_code == 0, got.output[-3000:]
    assert "Traceback" not in got.output, got.output[-3000:]
    assert got.record is not None, f"no single '{LINE_PREFIX}' line in the output:\n{got.output[-3000:]}"
    assert len(got.losses) == STEPS and got.falling is not None, got.losses
    first, last = got.falling
    assert last < first - MARGIN, (got.falling, got.losses)
    for key, expected in row.used.items():
        assert getattr(got.record, key) == expected, (key, got.record)
    for module in row.modules:
        assert got.record.added_modules.get(module, 0) > 0, (module, got.record.added_modules)


def test_every_optimizer_and_method_key_of_the_table_has_a_row():
    """The rows cover LLaMA-Factory's optimizer keys (`use_*` of OptimizerConfig, the layer-wise and
    BAdam mode switches) and method keys (LLaMA Pro, MoD, the SFT loss variants, NEFTune, S^2-Attn, OFT)."""
    from dataclasses import fields

    from tuneline.core.config import OptimizerConfig

    covered = {key for row in ROWS.values() for key, value in row.keys.items() if value is True}
    switches = {field.name for field in fields(OptimizerConfig) if field.name.startswith("use_")} | {"galore_layerwise"}
    methods = {"use_llama_pro", "use_dft_loss", "use_asft_loss", "use_eaft_loss", "shift_attn"}
    assert switches | methods <= covered, sorted(switches | methods - covered)
    valued = {(key, str(value)) for row in ROWS.values() for key, value in row.keys.items()}
    assert {("badam_mode", "layer"), ("badam_mode", "ratio"), ("finetuning_type", "oft"),
            ("mixture_of_depths", "convert"), ("neftune_noise_alpha", "5")} <= valued
