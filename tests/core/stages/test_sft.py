"""Stage sft's loss variants (DFT, EAFT, ASFT), NEFTune and the training-loop keys, on the tiny model
and the demo instructions: each trains a few steps, its loss falls, the loss is the one named
(recomputed here from the model's logits), and only the parameters the method trains move."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tuneline.core.errors import ConfigError
from tuneline.core.stages.kind import TrainerRequest
from tuneline.core.stages.registry import build_stage_config

REPO_ROOT = Path(__file__).resolve().parents[3]
DATA_DIR = REPO_ROOT / "data"


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_torch_thread):
    yield


def finetuning(**keys):
    return build_stage_config({"stage": "sft", **keys}).finetuning


def trainer_args(path: Path, **keys):
    from tuneline.core.training.arguments import training_arguments

    values = {"per_device_train_batch_size": 4, "lr_scheduler_type": "constant", "seed": 1, "report_to": "none",
              "logging_steps": 1}
    return training_arguments(str(path), {**values, **keys})


@pytest.fixture(scope="module")
def rows(tiny_base: Path, tmp_path_factory):
    """(DatasetDict with train and validation splits, tokenizer) of demo_alpaca, tokenized for sft."""
    from datasets import load_from_disk

    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.stages.registry import tokenize_stage_data

    output = tmp_path_factory.mktemp("sft_rows")
    config = build_stage_config({"stage": "sft", "model_name_or_path": str(tiny_base), "dataset_dir": str(DATA_DIR),
                                 "dataset": "demo_alpaca", "template": "chatml", "cutoff_len": 64, "max_samples": 64,
                                 "val_size": 8})
    tokenize_stage_data(config, tokenizer_path=tiny_base, output_dir=output)
    return load_from_disk(str(output)), load_tokenizer(output / "tokenizer")


@pytest.fixture(scope="module")
def warm_base(tiny_base: Path, rows, tmp_path_factory) -> Path:
    """The tiny base after 300 steps of full plain SFT on the same rows (a few seconds). DFT's loss,
    p x -log p per token, grows while p < 1/e, so from a random start it rises as the model learns;
    fine-tuning a model that already knows the answers is what it is for."""
    from transformers import DataCollatorForSeq2Seq, Trainer

    from tuneline.core.models.loading import load_model

    data, tokenizer = rows
    folder = tmp_path_factory.mktemp("warm_sft")
    model = load_model(tiny_base, vocab_size=len(tokenizer))
    args = trainer_args(folder / "run", learning_rate=3e-3, max_steps=300, lr_scheduler_type="linear", logging_steps=50,
                        per_device_train_batch_size=8)
    Trainer(model=model, args=args, train_dataset=data["train"],
            data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)).train()
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return folder / "model"


def build(tiny_base: Path, rows, method, args, *, train_rows: int | None = None):
    """The sft trainer on a fresh policy; with `train_rows`, trained on the first rows only (the fixed batch)."""
    from transformers import set_seed

    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.stages.causal_lm import build_language_model_trainer

    data, tokenizer = rows
    set_seed(1)
    model = apply_finetuning(load_model(tiny_base, vocab_size=len(tokenizer)), method)
    train = data["train"] if train_rows is None else data["train"].select(range(train_rows))
    return build_language_model_trainer(TrainerRequest(model=model, tokenizer=tokenizer, train_dataset=train,
                                                       eval_dataset=data["validation"], finetuning=method, args=args))


def fixed_batch(trainer) -> dict[str, torch.Tensor]:
    return trainer.data_collator([trainer.train_dataset[i] for i in range(8)])


def next_token_terms(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per trained position: the log-probabilities of the whole vocabulary and of the target, recomputed here."""
    log_probs = logits[:, :-1].float().log_softmax(-1)
    targets = labels[:, 1:]
    trained = targets != -100
    picked = log_probs.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return log_probs[trained], picked[trained]


def expected_loss(method, logits: torch.Tensor, labels: torch.Tensor, reference_logits: torch.Tensor | None = None) -> float:
    """The variant's loss written out from its definition, the batch's mean over trained tokens."""
    log_probs, target = next_token_terms(logits, labels)
    nll = -target
    if method.use_eaft_loss:
        top = log_probs.topk(20, dim=-1).values.log_softmax(-1)
        weight = (-(top.exp() * top).sum(-1) / 3.0) ** method.eaft_alpha
        return (nll * weight).mean().item()
    dft = (nll * target.exp()).mean().item()
    if not method.use_asft_loss:
        return dft
    reference, _ = next_token_terms(reference_logits, labels)
    kl = (reference.exp() * (reference - log_probs)).sum(-1).mean().item()
    return dft + method.asft_alpha * kl


def batch_loss(trainer, batch) -> float:
    trainer.model.eval()
    with torch.no_grad():
        return trainer.compute_loss(trainer.model, dict(batch)).item()


def logits_of(model, batch) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def logged_losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


# --- rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(("keys", "fragment"), [
    ({"use_dft_loss": True, "use_eaft_loss": True}, "use_dft_loss: true and use_eaft_loss: true ask for different losses"),
    ({"asft_alpha": 0.5}, "'asft_alpha: 0.5' weighs the loss of 'use_asft_loss: true', which is not set"),
    ({"use_eaft_loss": True, "eaft_alpha": -1.0}, "'eaft_alpha' must be 0 or more"),
    ({"ref_model": "some/model"}, "stage sft reads 'ref_model' and 'ref_model_adapters' only for 'use_asft_loss: true'"),
    ({"stage": "pt", "use_dft_loss": True}, "'use_dft_loss' is a key of stage sft, which stage 'pt' does not read"),
    ({"stage": "dpo", "use_asft_loss": True}, "'use_asft_loss' is a key of stage sft, which stage 'dpo' does not read"),
])
def test_contradictory_or_ignored_loss_settings_are_named(keys: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        build_stage_config({"stage": "sft", **keys})
    assert any(fragment in problem for problem in error.value.problems), error.value.problems


def test_each_variant_is_read_with_its_weight() -> None:
    from tuneline.core.stages.causal_lm import loss_function

    assert loss_function(finetuning()) is None
    assert finetuning(use_eaft_loss=True, eaft_alpha=0.5).eaft_alpha == 0.5
    assert finetuning(use_asft_loss=True, asft_alpha=0.2, ref_model="some/model").ref_model == "some/model"


# --- training ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("keys", [{"use_dft_loss": True}, {"use_eaft_loss": True, "eaft_alpha": 0.5}])
def test_dft_and_eaft_train_lora_on_their_own_loss(keys: dict, warm_base: Path, rows, tmp_path: Path) -> None:
    method = finetuning(finetuning_type="lora", lora_rank=4, **keys)
    trainer = build(warm_base, rows, method, trainer_args(tmp_path, learning_rate=5e-3, max_steps=10,
                    per_device_train_batch_size=8), train_rows=8)
    batch = fixed_batch(trainer)
    before = batch_loss(trainer, batch)
    assert before == pytest.approx(expected_loss(method, logits_of(trainer.model, batch), batch["labels"]), rel=1e-5)
    assert before != pytest.approx(trainer.model(**batch).loss.item(), rel=1e-2)  # not the plain cross-entropy
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    after = batch_loss(trainer, batch)
    assert after == pytest.approx(expected_loss(method, logits_of(trainer.model, batch), batch["labels"]), rel=1e-5)
    assert after < before and logged_losses(trainer)[-1] < logged_losses(trainer)[0]
    moved = {name for name, p in trainer.model.named_parameters() if not torch.equal(p, start[name])}
    assert moved and all("lora_B" in name or "lora_A" in name for name in moved)
    assert "eval_perplexity" not in trainer.evaluate()  # a weighted loss is no log-likelihood


@pytest.mark.slow
def test_asft_with_lora_anchors_to_the_policy_with_its_adapter_off(warm_base: Path, rows, tmp_path: Path) -> None:
    from tuneline.core.models.loading import load_model

    method = finetuning(finetuning_type="lora", lora_rank=4, use_asft_loss=True, asft_alpha=0.5)
    trainer = build(warm_base, rows, method, trainer_args(tmp_path, learning_rate=5e-3, max_steps=10,
                    per_device_train_batch_size=8), train_rows=8)
    assert type(trainer).__name__ == "AnchoredSFTTrainer" and trainer.reference is None
    batch = fixed_batch(trainer)
    base_logits = logits_of(load_model(warm_base, vocab_size=len(rows[1])), batch)
    before = batch_loss(trainer, batch)
    assert before == pytest.approx(expected_loss(method, base_logits, batch["labels"], base_logits), rel=1e-5)
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    after = batch_loss(trainer, batch)
    policy_logits = logits_of(trainer.model, batch)
    expected = expected_loss(method, policy_logits, batch["labels"], base_logits)
    assert after == pytest.approx(expected, rel=1e-5)
    assert expected > expected_loss(finetuning(use_dft_loss=True), policy_logits, batch["labels"]) + 1e-4  # the anchor counts
    assert after < before and logged_losses(trainer)[-1] < logged_losses(trainer)[0]
    moved = {name for name, p in trainer.model.named_parameters() if not torch.equal(p, start[name])}
    assert moved and all("lora_" in name for name in moved)


@pytest.mark.slow
def test_asft_with_full_tuning_anchors_to_a_frozen_copy_of_the_start(warm_base: Path, rows, tmp_path: Path) -> None:
    method = finetuning(finetuning_type="full", use_asft_loss=True, asft_alpha=0.1)
    trainer = build(warm_base, rows, method, trainer_args(tmp_path, learning_rate=1e-3, max_steps=4,
                    per_device_train_batch_size=8), train_rows=8)
    reference = trainer.accelerator.unwrap_model(trainer.reference)
    assert reference is not trainer.model and not any(p.requires_grad for p in reference.parameters())
    reference_start = {name: p.detach().clone() for name, p in reference.named_parameters()}
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    batch = fixed_batch(trainer)
    before = batch_loss(trainer, batch)
    trainer.train()
    after = batch_loss(trainer, batch)
    assert after == pytest.approx(expected_loss(method, logits_of(trainer.model, batch), batch["labels"],
                                                logits_of(reference, batch)), rel=1e-5)
    assert after < before
    assert all(torch.equal(p, reference_start[name]) for name, p in reference.named_parameters())
    assert all(not torch.equal(p, start[name]) for name, p in trainer.model.named_parameters() if p.requires_grad)


@pytest.mark.slow
def test_neftune_adds_bounded_noise_to_the_embeddings_while_training_only(tiny_base: Path, rows, tmp_path: Path) -> None:
    from transformers import TrainerCallback

    alpha = 5.0
    method = finetuning(finetuning_type="lora", lora_rank=4)
    trainer = build(tiny_base, rows, method, trainer_args(tmp_path, learning_rate=1e-2, max_steps=8, neftune_noise_alpha=alpha))
    embedding = trainer.model.get_input_embeddings()
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Watch(TrainerCallback):  # registered once training began, after NEFTune's own hook
        def on_train_begin(self, args, state, control, **kwargs):
            self.handle = embedding.register_forward_hook(lambda m, i, out: seen.append((i[0].detach(), out.detach())))

        def on_train_end(self, args, state, control, **kwargs):
            self.handle.remove()

    trainer.add_callback(Watch())
    batch = fixed_batch(trainer)
    before = trainer.model(**batch).loss.item()
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert len(seen) == 8
    for ids, noisy in seen:
        noise = noisy - embedding.weight[ids].detach()
        bound = alpha / (noisy.size(1) * noisy.size(2)) ** 0.5
        assert noise.abs().max() <= bound * (1 + 1e-5) and noise.abs().max() > 0.5 * bound
    trainer.model.train()
    assert torch.equal(embedding(batch["input_ids"]), embedding.weight[batch["input_ids"]])  # hook gone after training
    trainer.model.eval()
    assert trainer.model(**batch).loss.item() < before
    moved = {name for name, p in trainer.model.named_parameters() if not torch.equal(p, start[name])}
    assert moved and all("lora_" in name for name in moved)


@pytest.mark.slow
def test_tuneline_train_runs_the_variant_and_the_training_loop_keys(small_sft, one_torch_thread) -> None:
    """One `tuneline train` through the worker's run: DFT, rows in order, token accuracy, early stopping and
    LLaMA-Factory's effective tokens per second all reach the run and its results. It runs the command's
    `main` in this process, the worker's run without its start (a process would spend seconds on imports)."""
    import json

    from conftest import run_cli_here, train_in_this_process

    with pytest.MonkeyPatch.context() as patch:
        train_in_this_process(patch)
        result = run_cli_here("train", str(small_sft.config), "output_dir=keys", "use_dft_loss=true", "compute_accuracy=true",
                              "disable_shuffling=true", "include_effective_tokens_per_second=true", "val_size=4",
                              "eval_strategy=steps", "eval_steps=2", "metric_for_best_model=eval_loss",
                              "early_stopping_steps=2", cwd=small_sft.config.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = small_sft.config.parent / "keys"
    results = json.loads((out / "all_results.json").read_text())
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and "eval_perplexity" not in results
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["EarlyStoppingCallback"]["args"]["early_stopping_patience"] == 2
    assert any("eval_accuracy" in entry for entry in state["log_history"])
    from datasets import load_from_disk

    cached = [load_from_disk(str(p.parent)) for p in (small_sft.config.parent / "cache").rglob("dataset_dict.json")]
    train = next(data for data in cached if "validation" in data and len(data["validation"]) == 4)["train"]  # this run's
    tokens = sum(len(ids) for ids in train["input_ids"])
    assert results["effective_tokens_per_sec"] == pytest.approx(tokens * results["epoch"] / results["train_runtime"], rel=1e-3)
