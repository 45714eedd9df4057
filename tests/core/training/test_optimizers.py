"""The memory-saving optimizers on the tiny model, through the sft kind's own trainer.

Each training test runs a few steps of full (or freeze) SFT with one optimizer and checks that the
loss on a fixed batch fell, that the trainer holds that optimizer's class from its package, and
that exactly the parameters it should train moved, in the way it moves them. The fast tests check
every rule of what goes together, as the config is read and as the launch is planned.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from conftest import tokenize_demo_alpaca
from tuneline.core.config import OptimizerConfig
from tuneline.core.errors import ConfigError
from tuneline.core.stages.registry import build_stage_config
from tuneline.core.training.optimizers import parallel_problems

REPO_ROOT = Path(__file__).resolve().parents[3]
LAYER = "model.layers."


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_torch_thread):
    yield


@pytest.fixture(scope="module")
def tokenized(tiny_base: Path, tmp_path_factory) -> Path:
    return tokenize_demo_alpaca(tiny_base, tmp_path_factory.mktemp("tokenized") / "data", max_samples=16)


class FirstStep(TrainerCallback):
    """Keeps the gradients the first optimizer step takes and every parameter as that step left it."""

    def __init__(self) -> None:
        self.after_first: dict[str, torch.Tensor] = {}
        self.first_gradients: dict[str, torch.Tensor] = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            self.first_gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == 1:
            self.after_first = snapshot(model)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {name for name in before if not torch.equal(before[name], after[name])}


def train(tiny_base: Path, tokenized: Path, output: Path, *, method: dict | None = None, steps: int = 6, **keys):
    """(trainer, parameters before, after the first step, after training, fixed-batch loss before, after)."""
    from datasets import load_from_disk
    from transformers import DataCollatorForSeq2Seq

    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.stages.kind import ModelRequest, TrainerRequest
    from tuneline.core.stages.sft import SFT
    from tuneline.core.training.arguments import training_arguments

    training = {"max_steps": steps, "per_device_train_batch_size": 4, "learning_rate": 1e-2, "weight_decay": 0.0,
                "lr_scheduler_type": "constant", "logging_steps": 1, "seed": 0, "report_to": "none",
                **{k: v for k, v in keys.items() if not k.startswith(("use_", "galore_", "apollo_", "badam_"))}}
    config = build_stage_config({"stage": "sft", "finetuning_type": "full", **(method or {}), **keys})
    data, tokenizer = load_from_disk(str(tokenized)), load_tokenizer(tokenized / "tokenizer")
    torch.manual_seed(0)
    model = SFT.load_model(ModelRequest(model_path=str(tiny_base), tokenizer=tokenizer, finetuning=config.finetuning,
                                        model_config=config.model, training=training))
    keeper = FirstStep()
    trainer = SFT.build_trainer(TrainerRequest(model=model, tokenizer=tokenizer, train_dataset=data["train"],
                                               finetuning=config.finetuning, args=training_arguments(str(output), training),
                                               callbacks=[keeper], optimizer=config.optimizer))
    batch = dict(DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)([data["train"][i] for i in range(8)]))
    before, loss_before = snapshot(model), fixed_loss(model, batch)
    trainer.train()
    trainer.first_gradients = keeper.first_gradients  # for the tests that compare the first update with them
    return trainer, before, keeper.after_first, snapshot(model), loss_before, fixed_loss(model, batch)


def fixed_loss(model, batch) -> float:
    with torch.no_grad():
        return model(**batch).loss.item()


def in_layers(names, *parts: str) -> set[str]:
    return {name for name in names if name.startswith(LAYER) and any(part in name for part in parts)}


def rank(delta: torch.Tensor) -> int:
    return int(torch.linalg.matrix_rank(delta.float(), rtol=1e-4))


# -- training ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("layerwise", [False, True], ids=["galore", "galore_layerwise"])
def test_galore_projects_the_targeted_matrices_and_trains_the_rest_with_adamw(tiny_base, tokenized, tmp_path, layerwise):
    from galore_torch import GaLoreAdamW

    from tuneline.core.training.optimizers.projected import LayerwiseOptimizer

    trainer, before, first, after, loss_before, loss_after = train(
        tiny_base, tokenized, tmp_path, use_galore=True, galore_target="q_proj,down_proj", galore_rank=4,
        galore_update_interval=100, galore_layerwise=layerwise, optim="adamw_torch", lr_scheduler_type="cosine")
    assert loss_after < loss_before
    targeted = in_layers(before, "q_proj", "down_proj")
    assert len(targeted) == 4
    if layerwise:
        assert type(trainer.optimizer.optimizer) is LayerwiseOptimizer
        per_parameter = trainer.optimizer.optimizer.per_parameter
        assert {type(o) for o in per_parameter.values()} == {GaLoreAdamW}
        assert len(per_parameter) == len(before)  # every trainable parameter has its own
        # each stepped at the Trainer's scheduled rate: the sixth and last step at the cosine's value
        # for step 5 of 6.
        last = pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi * 5 / 6)))
        assert [group["lr"] for o in per_parameter.values() for group in o.param_groups] == [last] * len(before)
    else:
        assert type(trainer.optimizer.optimizer) is GaLoreAdamW
        projected = {id(p) for group in trainer.optimizer.param_groups if "rank" in group for p in group["params"]}
        assert projected == {id(p) for name, p in trainer.model.named_parameters() if name in targeted}
    assert moved(before, after) == set(before)
    # One projection (refreshed every 100 steps) over the run: every update of a targeted matrix lies
    # in the same rank-4 space; the other matrices get AdamW's full-rank updates.
    for name in targeted:
        assert rank(after[name] - before[name]) <= 4, name
    for name in in_layers(before, "k_proj", "up_proj", "o_proj"):
        assert rank(first[name] - before[name]) > 4, name


@pytest.mark.slow
def test_apollo_scales_adamw_like_updates_of_the_targeted_matrices(tiny_base, tokenized, tmp_path):
    from apollo_torch import APOLLOAdamW

    trainer, before, first, after, loss_before, loss_after = train(
        tiny_base, tokenized, tmp_path, use_apollo=True, apollo_target="mlp", apollo_rank=4, apollo_scale=1.0,
        apollo_update_interval=100)
    assert loss_after < loss_before
    assert type(trainer.optimizer.optimizer) is APOLLOAdamW
    targeted = in_layers(before, "mlp.")
    projected = [p for group in trainer.optimizer.param_groups if "rank" in group for p in group["params"]]
    assert {id(p) for p in projected} == {id(p) for name, p in trainer.model.named_parameters() if name in targeted}
    assert all("projector" in trainer.optimizer.optimizer.state[p] for p in projected)
    assert moved(before, after) == set(before)
    # APOLLO scales the raw gradient per channel: a matrix's first update is minus its gradient with
    # each row (or each column) multiplied by one factor, where AdamW's would divide entry by entry.
    for name in targeted:
        ratio = (before[name] - first[name]) / trainer.first_gradients[name]
        per_row = ratio.std(dim=1) / ratio.mean(dim=1).abs()
        per_column = ratio.std(dim=0) / ratio.mean(dim=0).abs()
        assert float(ratio.min()) > 0 and min(float(per_row.max()), float(per_column.max())) < 1e-2, name


@pytest.mark.slow
def test_badam_layer_mode_trains_one_decoder_layer_at_a_time(tiny_base, tokenized, tmp_path):
    from badam import BlockOptimizer

    trainer, before, first, after, loss_before, loss_after = train(
        tiny_base, tokenized, tmp_path, steps=4, use_badam=True, badam_mode="layer", badam_switch_mode="ascending",
        badam_switch_interval=2, badam_start_block=1)
    assert loss_after < loss_before
    assert type(trainer.optimizer.optimizer) is BlockOptimizer
    # Steps 1-2 train layer 1 alone; then the blocks switch (ascending, two layers) to layer 0.
    assert moved(before, first) == {name for name in before if name.startswith(f"{LAYER}1.")}
    assert moved(before, after) == {name for name in before if name.startswith(LAYER)}



@pytest.mark.slow
def test_badam_switch_interval_minus_one_keeps_the_first_block_and_its_adam_state(tiny_base, tokenized, tmp_path):
    # badam switches when (step + 1) % interval == 0, which -1 makes true at every step
    trainer, before, _, after, loss_before, loss_after = train(
        tiny_base, tokenized, tmp_path, steps=3, use_badam=True, badam_switch_interval=-1, badam_start_block=1)
    assert loss_after < loss_before
    assert moved(before, after) == {name for name in before if name.startswith(f"{LAYER}1.")}
    states = trainer.optimizer.optimizer.base_optimizer.state.values()
    assert states and {int(state["step"]) for state in states} == {3}  # one block's Adam state, never reset

@pytest.mark.slow
def test_badam_ratio_mode_updates_the_chosen_share_of_each_layer_matrix(tiny_base, tokenized, tmp_path):
    from badam import BlockOptimizerRatio

    trainer, before, first, after, loss_before, loss_after = train(
        tiny_base, tokenized, tmp_path, use_badam=True, badam_mode="ratio", badam_update_ratio=0.25, learning_rate=3e-2)
    assert loss_after < loss_before
    assert type(trainer.optimizer.optimizer) is BlockOptimizerRatio
    assert moved(before, after) == set(before) - {"model.embed_tokens.weight"}  # the embedding (and its tied head) frozen
    for name in in_layers(before, "proj"):
        changed_entries = int((after[name] != before[name]).sum())
        assert changed_entries <= int(before[name].numel() * 0.25), name


@pytest.mark.slow
def test_adam_mini_trains_every_parameter_with_one_second_moment_per_block(tiny_base, tokenized, tmp_path):
    from adam_mini import Adam_mini

    trainer, before, _, after, loss_before, loss_after = train(tiny_base, tokenized, tmp_path, use_adam_mini=True,
                                                               learning_rate=5e-3)
    assert loss_after < loss_before
    optimizer = trainer.optimizer.optimizer
    assert type(optimizer) is Adam_mini
    assert moved(before, after) == set(before)
    by_name = dict(trainer.model.named_parameters())
    second_moments = {name: optimizer.state[p]["vmean"].numel() for name, p in by_name.items() if "vmean" in optimizer.state[p]}
    # One second-moment value per attention head for queries and keys (2 query heads, 1 key head),
    # per output neuron for the other matrices, per token for the embedding.
    for name in in_layers(before, "proj"):
        rows = by_name[name].shape[0]
        expected = 2 if "q_proj" in name else 1 if "k_proj" in name else rows
        assert second_moments[name] == expected, name
    assert second_moments["model.embed_tokens.weight"] == by_name["model.embed_tokens.weight"].shape[0]


@pytest.mark.slow
def test_muon_orthogonalises_the_hidden_matrices_and_trains_the_rest_with_adamw(tiny_base, tokenized, tmp_path):
    from tuneline.core.training.optimizers.adaptive import MuonWithAdamW

    trainer, before, first, after, loss_before, loss_after = train(tiny_base, tokenized, tmp_path, use_muon=True,
                                                                   learning_rate=5e-3)
    assert loss_after < loss_before
    optimizer = trainer.optimizer.optimizer
    assert type(optimizer) is MuonWithAdamW
    muon, adamw = optimizer.parts
    assert type(muon) is torch.optim.Muon and type(adamw) is torch.optim.AdamW
    names = {id(p): name for name, p in trainer.model.named_parameters()}
    hidden = {names[id(p)] for group in muon.param_groups for p in group["params"]}
    assert hidden == {name for name in before if name.startswith(LAYER) and before[name].ndim == 2}
    assert {names[id(p)] for group in adamw.param_groups for p in group["params"]} == set(before) - hidden
    assert moved(before, after) == set(before)
    # Muon's first step is the orthogonalised gradient at LLaMA-Factory's scale, 0.2 * sqrt(max(rows,
    # columns)) times the learning rate: its leading singular values sit near that size (Newton-Schulz
    # leaves them within about 0.5-1.5 of it); an AdamW step of sign-like entries would be tens of times larger.
    for name in hidden:
        singular = torch.linalg.svdvals(first[name] - before[name])
        scale = 5e-3 * 0.2 * max(before[name].shape) ** 0.5
        leading = singular[: len(singular) // 4]
        assert 0.5 < float(leading.min()) / scale and float(leading.max()) / scale < 1.6, name


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", [{"use_muon": True}, {"use_galore": True, "galore_rank": 4}], ids=["muon", "galore"])
def test_the_worker_trains_a_job_and_resumes_its_checkpointed_optimizer_state(tiny_base, tokenized, tmp_path, optimizer):
    from safetensors.torch import load_file

    from tuneline.core.training.job import TrainJob
    from tuneline.core.worker.run import run_training

    def job(steps: int) -> TrainJob:
        return TrainJob(model_path=str(tiny_base), dataset_path=str(tokenized), output_dir=str(tmp_path / "out"),
                        finetuning={"stage": "sft", "finetuning_type": "full"}, optimizer=optimizer,
                        training={"max_steps": steps, "per_device_train_batch_size": 4, "learning_rate": 5e-3,
                                  "save_steps": 2, "logging_steps": 1, "seed": 0})

    first = run_training(job(2))
    # Read as the Trainer reads it when resuming: tensors and allowed classes only.
    saved = torch.load(tmp_path / "out/checkpoint-2/optimizer.pt", weights_only=True)
    if "use_muon" in optimizer:
        assert len(saved["parts"]) == 2 and saved["parts"][0]["state"]  # Muon's momenta, then AdamW's moments
    else:
        assert any("projector" in state for state in saved["state"].values())
    resumed = run_training(job(4))
    assert resumed["train_loss"] < first["train_loss"]
    base, trained = load_file(tiny_base / "model.safetensors"), load_file(tmp_path / "out/model.safetensors")
    assert all(not torch.equal(base[name], trained[name]) for name in base)


@pytest.mark.slow
def test_a_trl_stage_trains_with_badam_through_its_own_trainer(tiny_base, tmp_path):
    from badam import BAdamCallback, BlockOptimizer
    from datasets import load_from_disk

    from tuneline.core.evaluation.reward import evaluate_reward_model
    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.stages.kind import ModelRequest, TrainerRequest
    from tuneline.core.stages.registry import tokenize_stage_data
    from tuneline.core.stages.rm import RM
    from tuneline.core.training.arguments import training_arguments

    config = build_stage_config({"stage": "rm", "finetuning_type": "full", "dataset": "demo_preference",
                                 "dataset_dir": str(REPO_ROOT / "data"), "template": "chatml", "cutoff_len": 64,
                                 "max_samples": 16, "use_badam": True, "badam_start_block": 0, "badam_switch_mode": "fixed"})
    tokenize_stage_data(config, tokenizer_path=tiny_base, output_dir=tmp_path / "pairs")
    pairs, tokenizer = load_from_disk(str(tmp_path / "pairs"))["train"], load_tokenizer(tmp_path / "pairs/tokenizer")
    training = {"max_steps": 6, "per_device_train_batch_size": 8, "learning_rate": 1e-2, "weight_decay": 0.0,
                "lr_scheduler_type": "constant", "seed": 0, "report_to": "none"}
    torch.manual_seed(0)
    model = RM.load_model(ModelRequest(model_path=str(tiny_base), tokenizer=tokenizer, finetuning=config.finetuning,
                                       model_config=config.model, training=training))
    trainer = RM.build_trainer(TrainerRequest(model=model, tokenizer=tokenizer, train_dataset=pairs, finetuning=config.finetuning,
                                              args=training_arguments(str(tmp_path / "out"), training), optimizer=config.optimizer))
    before, margin_before = snapshot(model), evaluate_reward_model(model, tokenizer, pairs)["margin"]
    trainer.train()
    assert evaluate_reward_model(model, tokenizer, pairs)["margin"] > margin_before
    assert type(trainer.optimizer.optimizer) is BlockOptimizer
    assert any(isinstance(callback, BAdamCallback) for callback in trainer.callback_handler.callbacks)
    assert moved(before, snapshot(model)) == {name for name in before if name.startswith(f"{LAYER}0.")}


def test_a_projection_target_that_names_no_linear_layer_is_a_config_error_listing_them(tiny_base):
    from transformers import TrainingArguments

    from tuneline.core.models.loading import load_model
    from tuneline.core.training.optimizers import stage_optimizer

    args = TrainingArguments(output_dir="unused", report_to=[])
    with pytest.raises(ConfigError, match="'galore_target: attention' names no trainable linear layer.*q_proj"):
        stage_optimizer(load_model(tiny_base), optimizer=OptimizerConfig(use_galore=True, galore_target="attention"), args=args)


def test_badam_keeps_the_trainable_weights_in_half_precision(tiny_base):
    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.stages.kind import ModelRequest
    from tuneline.core.stages.sft import SFT

    def trainable_dtypes(**keys) -> set[torch.dtype]:
        config = build_stage_config({"stage": "sft", "finetuning_type": "full", "bf16": True, **keys})
        model = SFT.load_model(ModelRequest(model_path=str(tiny_base), tokenizer=load_tokenizer(tiny_base),
                                            finetuning=config.finetuning, model_config=config.model,
                                            training=config.training, optimizer=config.optimizer))
        return {p.dtype for p in model.parameters() if p.requires_grad}

    # BAdam's block optimizer keeps float32 copies of the active block only; the others upcast.
    assert trainable_dtypes(use_badam=True) == {torch.bfloat16}
    assert trainable_dtypes(use_muon=True) == {torch.float32}


# -- rules -------------------------------------------------------------------------------------

def problems(**keys) -> str:
    with pytest.raises(ConfigError) as error:
        build_stage_config({"stage": "sft", "finetuning_type": "full", **keys})
    return str(error.value)


@pytest.mark.parametrize("key", ["use_galore", "use_apollo", "use_badam"])
def test_lora_cannot_train_with_galore_apollo_or_badam(key):
    assert f"'{key}: true' trains the model's own weights" in problems(finetuning_type="lora", **{key: True})


def test_two_of_galore_apollo_badam_are_refused_naming_both_and_every_problem_at_once():
    message = problems(finetuning_type="lora", use_galore=True, use_badam=True, loraplus_lr_ratio=16.0)
    assert "'use_galore: true' and 'use_badam: true' each choose the optimizer" in message
    assert "'finetuning_type: lora' trains adapters" in message
    assert "'loraplus_lr_ratio: 16.0' each choose the optimizer" in message


def test_adam_mini_and_muon_together_are_refused():
    assert "'use_adam_mini: true' and 'use_muon: true' each choose the optimizer" in problems(use_adam_mini=True,
                                                                                             use_muon=True)


@pytest.mark.parametrize("name", ["galore", "apollo"])
def test_layerwise_projection_refuses_gradient_accumulation_and_unknown_optims(name):
    message = problems(**{f"use_{name}": True, f"{name}_layerwise": True, "gradient_accumulation_steps": 4, "optim": "sgd"})
    assert f"'{name}_layerwise: true' steps each weight" in message and "'gradient_accumulation_steps: 4'" in message
    assert "not 'optim: sgd'" in message


def test_galore_and_apollo_refuse_deepspeed_and_every_optimizer_refuses_fsdp(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 2}}')
    assert "'use_galore: true' cannot train under DeepSpeed" in problems(use_galore=True, deepspeed=str(ds))
    assert "'use_muon: true' cannot train under FSDP" in problems(use_muon=True, fsdp="full_shard")
    own = tmp_path / "own.json"
    own.write_text('{"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3}}')
    assert "names one of its own, which would replace it" in problems(use_badam=True, deepspeed=str(own))


def test_bad_values_and_ppo_are_named():
    assert "'galore_rank: 0' must be a positive" in problems(use_galore=True, galore_rank=0)
    assert "'badam_update_ratio: 0.0' must be a share" in problems(use_badam=True, badam_mode="ratio", badam_update_ratio=0.0)
    assert "stage ppo trains in a loop of its own" in problems(stage="ppo", use_adam_mini=True, reward_model="rm")
    message = problems(use_badam=True, badam_start_block=-1, badam_switch_mode=None)
    assert "'badam_start_block: -1' must be a layer index" in message and "'badam_switch_mode' must be" in message
    for interval in (0, -2, None):
        assert f"'badam_switch_interval: {interval}' must be a positive number of steps, or -1" in problems(
            use_badam=True, badam_switch_interval=interval)
    never = build_stage_config({"stage": "sft", "finetuning_type": "full", "use_badam": True, "badam_switch_interval": -1})
    assert never.optimizer.badam_switch_interval == -1



@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_galore_with_an_8bit_optim_is_refused_up_front_where_its_step_would_fail():
    for optim in ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit"):
        message = problems(use_galore=True, optim=optim, galore_layerwise=optim == "adamw_8bit")
        assert (f"'use_galore: true' with 'optim: {optim}' steps with galore-torch's 8-bit AdamW, which runs only on a "
                "CUDA GPU, and this machine has none; set 'optim: adamw_torch'") in message
    # why: galore-torch's 8-bit step synchronises CUDA; bitsandbytes' own 8-bit AdamW steps on the CPU
    import bitsandbytes
    import galore_torch

    projected, plain = (torch.nn.Parameter(torch.randn(64, 64)) for _ in range(2))
    projected.grad, plain.grad = torch.randn(64, 64), torch.randn(64, 64)
    with pytest.raises(AssertionError, match="CUDA"):
        galore_torch.GaLoreAdamW8bit([{"params": [projected], "rank": 4, "update_proj_gap": 10, "scale": 0.25,
                                       "proj_type": "std"}]).step()
    # transformers registers 32-bit overrides for embeddings by parameter id in bitsandbytes' global
    # manager; an earlier test's freed parameter may share this one's id
    bitsandbytes.optim.GlobalOptimManager.get_instance().initialize()
    before, eight_bit = plain.detach().clone(), bitsandbytes.optim.AdamW8bit([plain], lr=1e-2)
    eight_bit.step()
    assert not torch.equal(plain.detach(), before) and eight_bit.state[plain]["state1"].dtype == torch.uint8
    assert build_stage_config({"stage": "sft", "finetuning_type": "full", "optim": "adamw_bnb_8bit"}).training["optim"] \
        == "adamw_bnb_8bit"

def test_the_optimizer_keys_are_read_without_error_when_alone():
    config = build_stage_config({"stage": "sft", "finetuning_type": "freeze", "use_badam": True, "badam_mode": "ratio"})
    assert config.optimizer.use_badam and config.optimizer.badam_mode == "ratio"


def test_several_processes_refuse_layerwise_projection_and_ratio_badam_and_need_zero3_for_layer_badam(tmp_path):
    zero3, zero2 = tmp_path / "zero3.json", tmp_path / "zero2.json"
    zero3.write_text('{"zero_optimization": {"stage": 3}}')
    zero2.write_text('{"zero_optimization": {"stage": 2}}')
    layerwise = OptimizerConfig(use_galore=True, galore_layerwise=True)
    assert parallel_problems(layerwise, {}, world_size=1) == []
    assert "'galore_layerwise: true'" in parallel_problems(layerwise, {}, world_size=2)[0]
    assert "'apollo_layerwise: true'" in parallel_problems(OptimizerConfig(use_apollo=True, apollo_layerwise=True), {},
                                                           world_size=2)[0]
    assert "'badam_mode: ratio'" in parallel_problems(OptimizerConfig(use_badam=True, badam_mode="ratio"), {}, world_size=4)[0]
    layer = OptimizerConfig(use_badam=True)
    assert "DeepSpeed ZeRO-3" in parallel_problems(layer, {"deepspeed": str(zero2)}, world_size=2)[0]
    assert parallel_problems(layer, {"deepspeed": str(zero3)}, world_size=2) == []


def test_the_launch_refuses_what_several_processes_cannot_train(tmp_path):
    from tuneline.core.training.distributed import LaunchPlan
    from tuneline.core.training.job import TrainJob
    from tuneline.core.worker.launch import prepare_job

    job = TrainJob(model_path="m", dataset_path="d", output_dir=str(tmp_path), finetuning={}, training={},
                   optimizer={"use_badam": True, "badam_mode": "ratio"})
    assert prepare_job(job, LaunchPlan()).world_size == 1
    with pytest.raises(ConfigError, match="'badam_mode: ratio' cannot train on 2 processes"):
        prepare_job(job, LaunchPlan(nproc_per_node=2, torchrun=True))
