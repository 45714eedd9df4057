"""Preference stages (dpo with every pref_loss, kto) on the demo preference data, with tiny models.

The module's `sft_model` fine-tunes the session's tiny base in full for a few seconds on the demo
instructions, so it knows the house answer format, as a DPO run starts from an SFT model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tuneline.core.errors import ConfigError
from tuneline.core.stages.kind import TrainerRequest
from tuneline.core.stages.registry import build_stage_config

REPO_ROOT = Path(__file__).resolve().parents[3]
DATA_DIR = REPO_ROOT / "data"
PREFERENCE_FILES = ["dataset_info.json", "demo_preference.json", "demo_preference_heldout.json", "demo_kto.json"]



@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_torch_thread):
    yield

def finetuning(stage: str = "dpo", **keys):
    return build_stage_config({"stage": stage, **keys}).finetuning


def trainer_args(path: Path, **keys):
    from tuneline.core.training.arguments import training_arguments

    values = {"per_device_train_batch_size": 16, "lr_scheduler_type": "constant", "seed": 1, "report_to": "none"}
    return training_arguments(str(path), {**values, **keys})


def tokenize(base: Path, output: Path, **keys) -> Path:
    from tuneline.core.stages.registry import tokenize_stage_data

    config = build_stage_config({"model_name_or_path": str(base), "dataset_dir": str(DATA_DIR), "template": "chatml",
                                 "cutoff_len": 64, **keys})
    tokenize_stage_data(config, tokenizer_path=base, output_dir=output)
    return output


def load(path: Path):
    """(DatasetDict, tokenizer) of a tokenized folder."""
    from datasets import load_from_disk

    from tuneline.core.models.loading import load_tokenizer

    return load_from_disk(str(path)), load_tokenizer(path / "tokenizer")


@pytest.fixture(scope="module")
def pairs(tiny_base: Path, tmp_path_factory) -> Path:
    return tokenize(tiny_base, tmp_path_factory.mktemp("dpo_pairs"), stage="dpo", dataset="demo_preference",
                    eval_dataset="demo_preference_heldout")


@pytest.fixture(scope="module")
def feedback(tiny_base: Path, tmp_path_factory) -> Path:
    return tokenize(tiny_base, tmp_path_factory.mktemp("kto_rows"), stage="kto", dataset="demo_kto")


@pytest.fixture(scope="module")
def sft_model(tiny_base: Path, tmp_path_factory) -> Path:
    """The tiny base after 150 steps of full SFT on demo_alpaca (a few seconds)."""
    from transformers import DataCollatorForSeq2Seq, Trainer

    from tuneline.core.models.loading import load_model

    folder = tmp_path_factory.mktemp("sft")
    data, tokenizer = load(tokenize(tiny_base, folder / "data", stage="sft", dataset="demo_alpaca"))
    model = load_model(tiny_base, vocab_size=len(tokenizer))
    args = trainer_args(folder / "run", learning_rate=3e-3, max_steps=150, lr_scheduler_type="linear")
    Trainer(model=model, args=args, train_dataset=data["train"],
            data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)).train()
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return folder / "model"


def policy(path: Path, method, tokenizer):
    """The model at `path` made trainable by `method`, a new LoRA adapter seeded as the worker seeds it."""
    from transformers import set_seed

    from tuneline.core.models.loading import apply_finetuning, load_model

    set_seed(1)
    return apply_finetuning(load_model(path, vocab_size=len(tokenizer)), method)


# --- demo data ---------------------------------------------------------------------------


def test_demo_preference_data_is_reproducible_and_held_out(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(DATA_DIR / "generate_demo_data.py"), "--out-dir", str(tmp_path)], check=True,
                   capture_output=True)
    for name in PREFERENCE_FILES:
        assert (tmp_path / name).read_bytes() == (DATA_DIR / name).read_bytes(), name
    train = json.loads((DATA_DIR / "demo_preference.json").read_text())
    kto = json.loads((DATA_DIR / "demo_kto.json").read_text())
    heldout = json.loads((DATA_DIR / "demo_preference_heldout.json").read_text())
    answers = {row["output"] for row in json.loads((DATA_DIR / "demo_heldout.json").read_text())}
    assert len(train) == len(kto) == 400 and len(heldout) == len(answers) >= 50
    assert {row["chosen"] for row in heldout} == answers  # every held-out fact, its house answer chosen
    asked = {row[key] for row in train + kto for key in ("instruction", "input")}
    assert asked.isdisjoint(row["instruction"] for row in heldout)
    assert all(row["chosen"] != row["rejected"] for row in train + heldout)
    assert 150 < sum(row["kto_tag"] for row in kto) < 250


# --- conversions and settings ------------------------------------------------------------


def test_conversions_keep_tuneline_tokens(pairs: Path, feedback: Path) -> None:
    from datasets import Dataset

    from tuneline.core.data.preference_columns import dpo_pairs, kto_examples, odds_ratio_pairs, prompt_length, reward_pairs

    rows = load(pairs)[0]["train"].select(range(8))
    for row, pair in zip(rows, dpo_pairs(rows)):
        cut = prompt_length(row["chosen_labels"])
        assert 0 < cut == prompt_length(row["rejected_labels"])
        assert pair["prompt_ids"] + pair["chosen_ids"] == row["chosen_input_ids"]
        assert pair["prompt_ids"] + pair["rejected_ids"] == row["rejected_input_ids"]
    assert reward_pairs(rows)["chosen_ids"] == rows["chosen_input_ids"]
    assert odds_ratio_pairs(rows).to_dict() == rows.to_dict()
    examples = load(feedback)[0]["train"].select(range(8))
    for row, example in zip(examples, kto_examples(examples)):
        assert example["prompt_ids"] + example["completion_ids"] == row["input_ids"]
        assert example["KL_prompt_ids"] + example["KL_completion_ids"] == row["kl_input_ids"]
        assert len(example["KL_prompt_ids"]) == prompt_length(row["kl_labels"])
        assert example["label"] is row["kto_tags"]
    sft_rows = Dataset.from_dict({"input_ids": [[1, 2]], "attention_mask": [[1, 1]], "labels": [[-100, 2]]})
    with pytest.raises(ConfigError, match="stage kto needs .*kl_input_ids"):
        kto_examples(sft_rows)


@pytest.mark.parametrize(("keys", "fragment"), [
    ({"pref_loss": "kto_pair"}, "'pref_loss: kto_pair' is no longer offered"),
    ({"pref_loss": "orpo", "pref_ftx": 0.5}, "'pref_ftx' does not apply to 'pref_loss: orpo'"),
    ({"pref_loss": "simpo", "ref_model": "some/model"}, "needs no reference model"),
    ({"pref_loss": "hinge", "dpo_label_smoothing": 0.1}, "'dpo_label_smoothing' applies to 'pref_loss: sigmoid' or 'simpo'"),
    ({"dpo_label_smoothing": 0.5}, "must be in [0, 0.5)"),
    ({"stage": "kto", "pref_ftx": 0.1}, "'pref_ftx' is not supported with 'stage: kto'"),
])
def test_unusable_preference_settings_are_named_when_the_config_is_read(keys: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        build_stage_config({"stage": "dpo", **keys})
    assert any(fragment in problem for problem in error.value.problems), error.value.problems


@pytest.mark.slow
def test_kto_trains_on_batches_of_one_row(tiny_base: Path, feedback: Path, tmp_path: Path) -> None:
    """Each row brings its KL sequence, so a batch of one row trains with a KL term (TRL alone refuses it)."""
    from tuneline.core.stages.kto import build_kto_trainer

    data, tokenizer = load(feedback)
    method = finetuning("kto", finetuning_type="lora")
    trainer = build_kto_trainer(TrainerRequest(model=policy(tiny_base, method, tokenizer), tokenizer=tokenizer,
                                               train_dataset=data["train"], finetuning=method,
                                               args=trainer_args(tmp_path, per_device_train_batch_size=1, max_steps=3,
                                                                 learning_rate=1e-2, logging_steps=1)))
    assert full_logits_scoring(trainer.model.get_base_model())
    lora_b = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_B" in name}
    trainer.train()
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(steps) == 3 and trainer.state.train_batch_size == 1
    assert all(entry["loss"] == entry["loss"] and "kl" in entry for entry in steps)
    assert any(not torch.equal(p, dict(trainer.model.named_parameters())[name]) for name, p in lora_b.items())


def test_disable_shuffling_keeps_kto_rows_in_order(tiny_base: Path, feedback: Path, tmp_path: Path) -> None:
    """KTO shuffles its rows (TRL's trainer would not) unless disable_shuffling asks for them in order."""
    from torch.utils.data import RandomSampler, SequentialSampler

    from tuneline.core.stages.kto import build_kto_trainer
    from tuneline.core.training.arguments import training_arguments

    data, tokenizer = load(feedback)
    samplers = []
    for sequential in (False, True):
        method = finetuning("kto", finetuning_type="lora", disable_shuffling=sequential)
        args = training_arguments(str(tmp_path), {"per_device_train_batch_size": 4, "report_to": "none"}, sequential=sequential)
        trainer = build_kto_trainer(TrainerRequest(model=policy(tiny_base, method, tokenizer), tokenizer=tokenizer,
                                                   train_dataset=data["train"], finetuning=method, args=args))
        samplers.append(trainer._get_train_sampler())
    assert isinstance(samplers[0], RandomSampler) and isinstance(samplers[1], SequentialSampler)


def full_logits_scoring(model) -> bool:
    """Whether `core.training.full_logits_head` answers the model's fused-head calls."""
    return model.forward.__func__.__code__.co_qualname.startswith("prefer_full_logits")


# --- reference models --------------------------------------------------------------------


@pytest.mark.slow
def test_lora_reference_is_the_policy_with_its_adapter_off(sft_model: Path, pairs: Path, tmp_path: Path) -> None:
    """No reference model object, no copy of the adapter; TRL's reference log-probabilities are
    those of the SFT model itself, before and after training moves the policy."""
    from peft import PeftModel

    from tuneline.core.evaluation.preference import pair_logps
    from tuneline.core.models.loading import load_model
    from tuneline.core.stages.dpo import build_dpo_trainer

    data, tokenizer = load(pairs)
    method = finetuning(finetuning_type="lora", lora_rank=4)
    model = policy(sft_model, method, tokenizer)
    base_weights = sum(p.numel() for name, p in model.named_parameters() if "lora_" not in name)
    args = trainer_args(tmp_path, learning_rate=1e-2, max_steps=3, per_device_train_batch_size=4)
    trainer = build_dpo_trainer(TrainerRequest(model=model, tokenizer=tokenizer, train_dataset=data["train"], finetuning=method, args=args))
    assert trainer.ref_model is None and isinstance(trainer.model, PeftModel)
    assert list(trainer.model.peft_config) == ["default"]
    assert sum(p.numel() for name, p in trainer.model.named_parameters() if "lora_" not in name) == base_weights

    rows = data["train"].select(range(4))
    expected = pair_logps(load_model(sft_model, vocab_size=len(tokenizer)), rows)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])

    def reference_and_policy() -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        reference = trainer.compute_ref_log_probs(trainer.model, batch)
        return reference, pair_logps(trainer.model, rows).chosen

    reference, start = reference_and_policy()
    trainer.train()
    reference_after, trained = reference_and_policy()
    for logps in (reference, reference_after):
        assert torch.allclose(logps[0], expected.chosen, atol=1e-3)
        assert torch.allclose(logps[1], expected.rejected, atol=1e-3)
    assert torch.allclose(start, expected.chosen, atol=1e-3) and not torch.allclose(trained, expected.chosen, atol=1e-2)


@pytest.mark.slow
def test_full_tuning_reference_is_a_frozen_copy_of_the_start(sft_model: Path, pairs: Path, tmp_path: Path) -> None:
    from tuneline.core.stages.dpo import build_dpo_trainer

    data, tokenizer = load(pairs)
    method = finetuning(finetuning_type="full")
    model = policy(sft_model, method, tokenizer)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    args = trainer_args(tmp_path, learning_rate=1e-3, max_steps=2, per_device_train_batch_size=4)
    trainer = build_dpo_trainer(TrainerRequest(model=model, tokenizer=tokenizer, train_dataset=data["train"], finetuning=method, args=args))
    reference = trainer.accelerator.unwrap_model(trainer.ref_model)
    assert reference is not trainer.model and not any(p.requires_grad for p in reference.parameters())
    trainer.train()
    assert all(torch.equal(p, start[name]) for name, p in reference.named_parameters())
    assert not all(torch.equal(p, start[name]) for name, p in trainer.model.named_parameters())


@pytest.mark.parametrize(("method", "identity_part"), [({"finetuning_type": "lora", "lora_rank": 4}, "lora_B"),
                                                     ({"finetuning_type": "oft", "oft_block_size": 16}, "oft_R")])
def test_a_continued_adapter_keeps_trls_copy_as_reference(tiny_base: Path, method: dict, identity_part: str) -> None:
    """A new adapter's copy equals the adapter switched off and is dropped; a trained one's is kept."""
    from peft import LoraConfig, OFTConfig

    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.stages.preference import drop_unneeded_ref_adapter

    config_class = OFTConfig if method["finetuning_type"] == "oft" else LoraConfig
    for trained in (False, True):
        model = apply_finetuning(load_model(tiny_base), finetuning(**method))
        if trained:
            with torch.no_grad():
                next(p for name, p in model.named_parameters() if identity_part in name).fill_(0.01)
        model.add_adapter("ref", config_class(**model.peft_config["default"].to_dict()))  # as TRL does
        assert drop_unneeded_ref_adapter(model) is not trained
        assert ("ref" in model.peft_config) is trained


# --- training ----------------------------------------------------------------------------


@pytest.mark.parametrize(("keys", "trainer_name", "objective"), [
    ({"pref_loss": "sigmoid"}, "TokenizedDPOTrainer", (["sigmoid"], [1.0])),
    ({"pref_loss": "hinge"}, "TokenizedDPOTrainer", (["hinge"], [1.0])),
    ({"pref_loss": "ipo"}, "TokenizedDPOTrainer", (["ipo"], [1.0])),
    ({"pref_loss": "sigmoid", "pref_ftx": 0.5, "dpo_label_smoothing": 0.1}, "TokenizedDPOTrainer",
     (["robust", "sft"], [1.0, 0.5])),
    ({"pref_loss": "simpo", "pref_ftx": 0.5, "simpo_gamma": 0.8}, "TokenizedCPOTrainer", ("simpo", 0.5, 0.8)),
    ({"pref_loss": "orpo", "pref_beta": 0.2}, "TokenizedORPOTrainer", None),
])
@pytest.mark.slow
def test_each_pref_loss_trains_a_few_steps(keys: dict, trainer_name: str, objective: tuple | None, sft_model: Path,
                                           pairs: Path, tmp_path: Path) -> None:
    from tuneline.core.stages.dpo import build_dpo_trainer

    data, tokenizer = load(pairs)
    method = finetuning(finetuning_type="lora", lora_rank=4, **keys)
    args = trainer_args(tmp_path, learning_rate=1e-2, max_steps=3, per_device_train_batch_size=4, logging_steps=1)
    trainer = build_dpo_trainer(TrainerRequest(model=policy(sft_model, method, tokenizer), tokenizer=tokenizer, train_dataset=data["train"],
                                eval_dataset=data["validation"], finetuning=method, args=args))
    assert type(trainer).__name__ == trainer_name
    assert trainer.beta == method.pref_beta
    if trainer_name == "TokenizedDPOTrainer":
        assert (trainer.loss_types, trainer.loss_weights) == objective
        assert full_logits_scoring(trainer.model.get_base_model())
    if trainer_name == "TokenizedCPOTrainer":
        assert (trainer.loss_type, trainer.cpo_alpha, trainer.simpo_gamma) == objective
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(p, start[name]) for name, p in trainer.model.named_parameters() if name in start)
    assert trainer.evaluate()["eval_loss"] > 0


@pytest.mark.slow
def test_dpo_raises_heldout_preference_accuracy(sft_model: Path, pairs: Path, tmp_path: Path) -> None:
    """Full DPO (with LLaMA-Factory's SFT term, pref_ftx) from the SFT model: the chosen replies of
    held-out pairs gain likelihood over the rejected ones (the margin grows by well over 10 nats, the
    share of pairs ranked right stays at 0.7 or more, within 3 pairs of the start or above), and the
    implicit reward against the frozen starting copy ranks 0.65 of them or more."""
    from tuneline.core.evaluation.preference import evaluate_preference
    from tuneline.core.stages.dpo import build_dpo_trainer

    data, tokenizer = load(pairs)
    method = finetuning(finetuning_type="full", pref_beta=0.1, pref_ftx=1.0)
    model = policy(sft_model, method, tokenizer)
    before = evaluate_preference(model, data["validation"], beta=method.pref_beta)
    trainer = build_dpo_trainer(TrainerRequest(model=model, tokenizer=tokenizer, train_dataset=data["train"], finetuning=method,
                                args=trainer_args(tmp_path, learning_rate=1e-3, max_steps=100)))
    trainer.train()
    after = evaluate_preference(trainer.model, data["validation"], beta=method.pref_beta,
                                reference=trainer.accelerator.unwrap_model(trainer.ref_model))
    print(f"\nheld-out preference ({after['pairs']:.0f} pairs), SFT model -> after DPO: "
          f"logp_accuracy {before['logp_accuracy']:.3f} -> {after['logp_accuracy']:.3f}, "
          f"mean_logp_accuracy {before['mean_logp_accuracy']:.3f} -> {after['mean_logp_accuracy']:.3f}, "
          f"logp_margin {before['logp_margin']:.1f} -> {after['logp_margin']:.1f}; "
          f"reward_accuracy {after['reward_accuracy']:.3f}, reward_margin {after['reward_margin']:.3f}")
    assert "reward_accuracy" not in before  # a plain model has no reference to compare with
    # Spreads measured on the frozen code of c4e177d with these seeds (2 or 1 threads, AVX-512 or AVX2 kernels gave
    # the same: 0.783 -> 0.850, margin 26.2 -> 53.9, reward accuracy 0.833) and with the tiny base and training
    # seeded 2-7 and 13 instead; 60 pairs, so one pair is 0.017.
    # logp_accuracy 0.767-0.900 after, 0.717-0.783 before, a change of -1 (seed 6) to +8 pairs: the old `>= 0.8`
    # and `> before` failed at 0.767 (seed 6; seed 7 sat on 0.800). 0.7 leaves 0.07; losing at most 3 pairs leaves 2.
    pairs = after["pairs"]
    assert after["logp_accuracy"] >= 0.7 and round((before["logp_accuracy"] - after["logp_accuracy"]) * pairs) <= 3
    # the summed log-prob margin grew by 21.9-28.1 nats (26.2-30.7 -> 49.7-55.7); 10 leaves 12 (unchanged if DPO did nothing)
    assert after["logp_margin"] > before["logp_margin"] + 10.0
    # measured 0.767-0.917 (the old 0.8 failed at 0.767, seed 7); 0.65 leaves 0.12. No training scores 0 (ties miss).
    assert after["reward_accuracy"] >= 0.65


@pytest.mark.slow
def test_kto_trains_and_its_loss_falls(sft_model: Path, feedback: Path, pairs: Path, tmp_path: Path) -> None:
    """LoRA KTO from the SFT model: its loss falls, in training and on a fixed set of its rows, with
    the policy's adapter switched off as the reference."""
    from tuneline.core.evaluation.preference import evaluate_preference
    from tuneline.core.stages.kto import build_kto_trainer

    data, tokenizer = load(feedback)
    method = finetuning("kto", finetuning_type="lora", lora_rank=8, kto_chosen_weight=1.0, kto_rejected_weight=1.2)
    trainer = build_kto_trainer(TrainerRequest(model=policy(sft_model, method, tokenizer), tokenizer=tokenizer, train_dataset=data["train"],
                                eval_dataset=data["train"].select(range(64)), finetuning=method,
                                args=trainer_args(tmp_path, learning_rate=5e-3, max_steps=60, logging_steps=1)))
    assert trainer.ref_model is None and list(trainer.model.peft_config) == ["default"]
    assert (trainer.desirable_weight, trainer.undesirable_weight) == (1.0, 1.2)
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    heldout = evaluate_preference(trainer.model, load(pairs)[0]["validation"], beta=method.pref_beta)
    print(f"\nKTO training loss {sum(losses[:5]) / 5:.4f} (first 5 steps) -> {sum(losses[-10:]) / 10:.4f} (last 10); "
          f"on 64 of its rows {before['eval_loss']:.4f} -> {after['eval_loss']:.4f}, reward margin "
          f"{before['eval_rewards/margins']:.3f} -> {after['eval_rewards/margins']:.3f}; held-out pairs: "
          f"reward_accuracy {heldout['reward_accuracy']:.3f}, logp_accuracy {heldout['logp_accuracy']:.3f}")
    assert sum(losses[-10:]) / 10 < sum(losses[:5]) / 5
    assert after["eval_loss"] < before["eval_loss"]
    # measured 1.00-1.55 and 0.604 (seed 6) over the default seeds and seeds 2-7, 13; 0.3 leaves 0.30. No training scores 0.
    assert after["eval_rewards/margins"] > 0.3


# --- loss variants: BCO mixed in, LD-DPO -------------------------------------------------


def completion_logps(model, input_ids: list[int], labels: list[int]) -> torch.Tensor:
    """Log-probability of each trained token of one sequence, recomputed here from the model's logits."""
    ids, targets = torch.tensor([input_ids]), torch.tensor(labels[1:])
    with torch.no_grad():
        log_probs = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
    trained = targets != -100
    return log_probs[trained].gather(-1, targets[trained][:, None])[:, 0]


def pair_scores(model, rows, *, ld_alpha: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probabilities of chosen and rejected replies; with `ld_alpha`, the tokens past the
    shorter reply's length weighed by it (LD-DPO)."""
    chosen, rejected = [], []
    for row in rows:
        c = completion_logps(model, row["chosen_input_ids"], row["chosen_labels"])
        r = completion_logps(model, row["rejected_input_ids"], row["rejected_labels"])
        shared = min(len(c), len(r)) if ld_alpha is not None else max(len(c), len(r))
        weight = 1.0 if ld_alpha is None else ld_alpha
        chosen.append(c[:shared].sum() + weight * c[shared:].sum())
        rejected.append(r[:shared].sum() + weight * r[shared:].sum())
    return torch.stack(chosen), torch.stack(rejected)


def expected_dpo_loss(policy, reference, rows, method) -> float:
    """Sigmoid DPO, plus BCO as (DPO + w x BCO) / (1 + w) when pref_bco_weight = w, written out."""
    chosen, rejected = pair_scores(policy, rows, ld_alpha=method.ld_alpha)
    ref_chosen, ref_rejected = pair_scores(reference, rows, ld_alpha=method.ld_alpha)
    chosen_reward, rejected_reward = method.pref_beta * (chosen - ref_chosen), method.pref_beta * (rejected - ref_rejected)
    dpo = -torch.nn.functional.logsigmoid(chosen_reward - rejected_reward).mean()
    bco = (-torch.nn.functional.logsigmoid(chosen_reward) - torch.nn.functional.logsigmoid(-rejected_reward)).mean()
    w = method.pref_bco_weight
    return ((dpo + w * bco) / (1 + w)).item()


@pytest.mark.parametrize(("keys", "fragment"), [
    ({"pref_bco_weight": -0.5}, "'pref_bco_weight' must be 0 or more"),
    ({"ld_alpha": 1.5}, "'ld_alpha' must be in [0, 1]"),
    ({"pref_loss": "orpo", "ld_alpha": 0.5}, "'ld_alpha' applies to pref_loss sigmoid, hinge or ipo, not 'orpo'"),
    ({"pref_loss": "simpo", "pref_bco_weight": 0.5}, "'pref_bco_weight' applies to pref_loss sigmoid, hinge or ipo"),
    ({"stage": "kto", "ld_alpha": 0.0}, "'ld_alpha' applies to stage dpo, not kto"),
    ({"stage": "kto", "pref_bco_weight": 0.3}, "'pref_bco_weight' applies to stage dpo, not kto"),
])
def test_unusable_loss_variant_settings_are_named(keys: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        build_stage_config({"stage": "dpo", **keys})
    assert any(fragment in problem for problem in error.value.problems), error.value.problems


def test_bco_weight_mixes_trls_bco_pair_as_llamafactory_weighs_it() -> None:
    from tuneline.core.stages.dpo import dpo_loss_terms

    assert dpo_loss_terms(finetuning(pref_bco_weight=0.25)) == (["sigmoid", "bco_pair"], [0.8, 0.2])
    assert dpo_loss_terms(finetuning(pref_bco_weight=1.0, pref_ftx=0.5, pref_loss="hinge")) == (
        ["hinge", "bco_pair", "sft"], [0.5, 0.5, 0.5])


@pytest.mark.slow
@pytest.mark.parametrize("keys", [{"pref_bco_weight": 0.5}, {"ld_alpha": 0.3}])
def test_bco_and_ld_dpo_train_lora_on_their_own_loss(keys: dict, sft_model: Path, pairs: Path, tmp_path: Path) -> None:
    """The trainer's loss on a fixed batch equals the objective written out here from the policy's and
    the SFT model's (the reference: the adapter off) log-probabilities, before and after training on it."""
    from tuneline.core.models.loading import load_model
    from tuneline.core.stages.dpo import build_dpo_trainer

    data, tokenizer = load(pairs)
    rows = data["train"].select(range(4))
    method = finetuning(finetuning_type="lora", lora_rank=4, **keys)
    args = trainer_args(tmp_path, learning_rate=1e-2, max_steps=5, per_device_train_batch_size=4, logging_steps=1)
    trainer = build_dpo_trainer(TrainerRequest(model=policy(sft_model, method, tokenizer), tokenizer=tokenizer,
                                               train_dataset=rows, finetuning=method, args=args))
    assert trainer.ld_alpha == method.ld_alpha
    reference = load_model(sft_model, vocab_size=len(tokenizer)).eval()
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])

    def trainer_loss() -> float:
        trainer.model.eval()
        with torch.no_grad():
            return trainer.compute_loss(trainer.model, dict(batch)).item()

    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    before = trainer_loss()
    assert before == pytest.approx(expected_dpo_loss(trainer.model, reference, rows, method), rel=1e-4)
    trainer.train()
    after = trainer_loss()
    expected = expected_dpo_loss(trainer.model, reference, rows, method)
    assert after == pytest.approx(expected, rel=1e-4)
    plain = expected_dpo_loss(trainer.model, reference, rows, finetuning())
    assert abs(expected - plain) > 1e-3  # the variant changes the loss
    assert after < before
    moved = {name for name, p in trainer.model.named_parameters() if not torch.equal(p, start[name])}
    assert moved and all("lora_" in name for name in moved)
