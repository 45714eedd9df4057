"""Reward modelling (stage rm): the chosen base with a one-output scoring head, trained on pairs.

LLaMA-Factory puts a value head on the causal LM (TRL's `AutoModelForCausalLMWithValueHead`, which
TRL 1.x no longer ships) and reads the value at the last non-padding token. tuneline loads the
base as transformers' `AutoModelForSequenceClassification` with `num_labels=1`, whose `score` head
reads the same position, and trains it with TRL's `RewardTrainer` on the pairwise loss
-log sigmoid(r_chosen - r_rejected). With LoRA the head trains in full and is saved inside the
adapter (`modules_to_save`), so base plus adapter folder is the whole reward model, which
`load_reward_model` loads back for a later stage (PPO) to `score` texts with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback, TrainingArguments
    from trl import RewardTrainer

# Names transformers gives the head of a sequence-classification model.
HEAD_NAMES = ("score", "classifier")


def load_reward_base(
    path: str | Path,
    *,
    model: ModelConfig | None = None,
    vocab_size: int | None = None,
    training: Mapping[str, Any] | None = None,
) -> PreTrainedModel:
    """The model at `path` with a one-output scoring head (new and random unless `path` saved one),
    in the compute dtype, quantized when asked, its embeddings resized to `vocab_size` if larger."""
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from trl.trainer.reward_trainer import suppress_seqcls_warning

    from tuneline.core.models.loading import attention_implementation, compute_dtype
    from tuneline.core.models.quantization import keep_4bit_layout_for_training, quantization_config, quantized_device_map

    model = model or ModelConfig()
    options = {"trust_remote_code": model.trust_remote_code, "revision": model.model_revision, "cache_dir": model.cache_dir}
    try:
        config = AutoConfig.from_pretrained(str(path), num_labels=1, **options)
        dtype = compute_dtype(training or {}, config=config)
        quantization = quantization_config(model, compute_dtype=dtype)
        with suppress_seqcls_warning():  # the new head is missing from a causal LM's weights, on purpose
            loaded = AutoModelForSequenceClassification.from_pretrained(
                str(path), config=config, dtype=dtype, attn_implementation=attention_implementation(model.flash_attn),
                quantization_config=quantization, device_map=quantized_device_map() if quantization else None,
                use_safetensors=None if model.allow_pickle_weights else True, **options,
            )
    except OSError as e:
        raise ConfigError(f"'model_name_or_path: {path}' could not be loaded as a reward model ({e}); point it at a "
                          "local model folder with safetensors weights.") from e
    if quantization is not None:
        keep_4bit_layout_for_training(loaded)
    if vocab_size is not None and vocab_size > loaded.get_input_embeddings().num_embeddings:
        loaded.resize_token_embeddings(vocab_size)
    return loaded


def head_name(model: PreTrainedModel) -> str:
    """The attribute holding the scoring head."""
    children = dict(model.named_children())
    for name in HEAD_NAMES:
        if name in children:
            return name
    raise ConfigError(f"{type(model).__name__} has no scoring head named {' or '.join(HEAD_NAMES)}; "
                      "stage rm needs a model family that transformers loads for sequence classification.")


def prepare_reward_model(
    model: PreTrainedModel,
    finetuning: FinetuningConfig,
    *,
    model_config: ModelConfig | None = None,
    training: Mapping[str, Any] | None = None,
) -> PreTrainedModel:
    """Make the chosen parameters trainable, the scoring head always among them.

    LoRA: adapters named in `adapter_name_or_path` (an SFT adapter, typically) are merged into the
    base first, then a new sequence-classification adapter trains with the head in full.
    """
    from peft import get_peft_model

    from tuneline.core.models.adapters import adapter_paths, load_adapter
    from tuneline.core.models.loading import apply_finetuning, method_problems, prepare_checkpointing, upcast_trainable

    model_config = model_config or ModelConfig()
    if finetuning.finetuning_type != "lora":
        model = apply_finetuning(model, finetuning, model_config=model_config, training=training)
        model.get_submodule(head_name(model)).requires_grad_(True)
        upcast_trainable(model)
        return model
    problems = method_problems(model_config, finetuning)
    if problems:
        raise ConfigError(problems)
    prepare_checkpointing(model, training or {})
    for path in adapter_paths(model_config):
        model = load_adapter(model, path, model_config=model_config, trainable=False).merge_and_unload()
    model = get_peft_model(model, reward_lora_config(model, finetuning))
    upcast_trainable(model)
    return model


def reward_lora_config(model: PreTrainedModel, finetuning: FinetuningConfig) -> LoraConfig:
    """tuneline's LoRA settings for a sequence classifier: the head is saved with the adapter, not adapted."""
    from peft import TaskType

    from tuneline.core.models.adapters import linear_module_names, lora_config

    base = lora_config(model, finetuning)
    head = head_name(model)
    targets = base.target_modules
    if isinstance(targets, str):  # "all-linear": every linear layer of the backbone
        targets = [name for name in linear_module_names(model) if name != head]
    return dataclasses.replace(base, task_type=TaskType.SEQ_CLS, target_modules=sorted(set(targets) - {head}),
                               modules_to_save=[*(base.modules_to_save or []), head])


def build_reward_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    train_dataset: Dataset,
    eval_dataset: Dataset | None = None,
    finetuning: FinetuningConfig,
    args: TrainingArguments,
    callbacks: Sequence[TrainerCallback] = (),
) -> RewardTrainer:
    """TRL's RewardTrainer, ready to train on tuneline's tokenized pairs (stage rm).

    Dropout stays as configured (LLaMA-Factory's reward trainer keeps it); sequences are not cut
    again, tokenization already applied `cutoff_len`.
    """
    from trl import RewardConfig, RewardTrainer

    from tuneline.core.data.preference_columns import reward_pairs
    from tuneline.core.models.loading import loraplus_optimizer
    from tuneline.core.training.trl_args import trl_config

    config = trl_config(RewardConfig, args, max_length=None, disable_dropout=False)
    return RewardTrainer(
        model=model,
        args=config,
        train_dataset=reward_pairs(train_dataset),
        eval_dataset=reward_pairs(eval_dataset) if eval_dataset is not None else None,
        processing_class=tokenizer,
        callbacks=list(callbacks),
        optimizers=(loraplus_optimizer(model, finetuning=finetuning, args=config), None),
    )


def score(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    input_ids: Sequence[Sequence[int]] | torch.Tensor,
    *,
    batch_size: int = 32,
) -> torch.Tensor:
    """One reward per tokenized text (prompt and reply rendered with the stage's template), as floats.

    Texts are padded on the right; the head reads each text's last non-padding token.
    """
    import torch

    rows = input_ids.tolist() if isinstance(input_ids, torch.Tensor) else [list(ids) for ids in input_ids]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    rewards = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            width = max(len(row) for row in batch)
            ids = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in batch]
            mask = [[1] * len(row) + [0] * (width - len(row)) for row in batch]
            output = model(input_ids=torch.tensor(ids, device=device), attention_mask=torch.tensor(mask, device=device))
            rewards.append(output.logits[:, 0].float().cpu())
    model.train(was_training)
    return torch.cat(rewards) if rewards else torch.empty(0)


def evaluate_reward_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, pairs: Dataset, *, batch_size: int = 32
) -> dict[str, float]:
    """On tokenized pairs: `accuracy` (share of pairs whose chosen reply scores strictly higher),
    `margin` (mean r_chosen - r_rejected), the mean rewards of each side, and the pair count."""
    from tuneline.core.data.preference_columns import check_columns

    check_columns(pairs, stage="rm")
    chosen = score(model, tokenizer, pairs["chosen_input_ids"], batch_size=batch_size)
    rejected = score(model, tokenizer, pairs["rejected_input_ids"], batch_size=batch_size)
    return {
        "accuracy": (chosen > rejected).float().mean().item(),
        "margin": (chosen - rejected).mean().item(),
        "chosen_reward": chosen.mean().item(),
        "rejected_reward": rejected.mean().item(),
        "pairs": float(len(chosen)),
    }


def load_reward_model(
    path: str | Path, *, base_model: str | Path | None = None, model: ModelConfig | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A trained reward model and its tokenizer, ready for `score`.

    `path` is a stage rm output: full weights, or a LoRA adapter whose base is `base_model`
    (default: the base recorded in the adapter's config). `model` holds the stage's model settings:
    the adapters its `adapter_name_or_path` lists were merged into the base before training, and
    are merged again here, then the reward adapter.
    """
    from tuneline.core.models.adapters import ADAPTER_CONFIG, adapter_paths, load_adapter
    from tuneline.core.models.loading import load_tokenizer

    folder = Path(path)
    model = model or ModelConfig()
    tokenizer = load_tokenizer(folder, model=model)
    if (folder / ADAPTER_CONFIG).is_file():
        from peft import PeftConfig, PeftModel

        base = base_model or PeftConfig.from_pretrained(str(folder)).base_model_name_or_path
        reward = load_reward_base(base, model=model, vocab_size=len(tokenizer))
        for adapter in adapter_paths(model):
            reward = load_adapter(reward, adapter, model_config=model, trainable=False).merge_and_unload()
        reward = PeftModel.from_pretrained(reward, str(folder)).merge_and_unload()
    else:
        reward = load_reward_base(folder, model=model, vocab_size=len(tokenizer))
    reward.config.pad_token_id = tokenizer.pad_token_id
    return reward.eval(), tokenizer
