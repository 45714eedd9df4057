"""tuneline's tokenized preference columns in the shapes TRL's trainers take.

`tuneline data preprocess` writes LLaMA-Factory's columns: pairwise stages (rm, dpo) give
`chosen_*` and `rejected_*` input ids, attention masks and labels, whose -100 labels mark the
prompt that chosen and rejected share; kto gives one reply (`input_ids`, `labels`), a mismatched
one for the KL term (`kl_*`) and `kto_tags`. TRL 1.16 reads token ids under other names
(`chosen_ids`, `prompt_ids`, `completion_ids`, ...). The conversions below only rename and split,
never re-tokenize, so the trainers see exactly the tokens tuneline wrote. Results are kept in
memory: mapping a dataset loaded from disk would otherwise write cache files into the tokenized
artifact, which must not change once written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from tuneline.core.data.media.columns import PAIR_FILE_COLUMNS
from tuneline.core.errors import ConfigError, DataError

if TYPE_CHECKING:
    from datasets import Dataset

IGNORE_INDEX = -100
PAIRWISE_COLUMNS = ("chosen_input_ids", "chosen_attention_mask", "chosen_labels",
                    "rejected_input_ids", "rejected_attention_mask", "rejected_labels")
FEEDBACK_COLUMNS = ("input_ids", "attention_mask", "labels", "kl_input_ids", "kl_attention_mask", "kl_labels",
                    "kto_tags")


_TRAINED_BY = {"pairwise": "a pairwise stage (rm, dpo)", "feedback": "stage kto"}


def check_columns(dataset: Dataset, *, examples: Literal["pairwise", "feedback"]) -> None:
    """Refuse a tokenized dataset that lacks the columns of `examples` (rm/dpo: pairwise, kto: feedback)."""
    needed = FEEDBACK_COLUMNS if examples == "feedback" else PAIRWISE_COLUMNS
    missing = [name for name in needed if name not in dataset.column_names]
    if not missing:
        return
    source = ("rows with a 'kto_tag' column, tokenized with 'stage: kto'" if examples == "feedback"
              else "a dataset with '\"ranking\": true' in dataset_info.json, tokenized with stage rm or dpo")
    raise ConfigError(f"{_TRAINED_BY[examples]} needs the tokenized columns {', '.join(missing)}, which this "
                      f"dataset lacks (it has {', '.join(dataset.column_names)}); train on {source}.")


def prompt_length(labels: Sequence[int]) -> int:
    """How many leading positions are prompt (label -100)."""
    for position, label in enumerate(labels):
        if label != IGNORE_INDEX:
            return position
    return len(labels)


def reward_pairs(dataset: Dataset) -> Dataset:
    """`chosen_ids` and `rejected_ids` (prompt and reply together), as TRL's RewardTrainer takes them
    (and a pair's media files as `image_files`, ...)."""
    check_columns(dataset, examples="pairwise")
    return _map(dataset, lambda batch: {"chosen_ids": batch["chosen_input_ids"],
                                        "rejected_ids": batch["rejected_input_ids"], **_media_files(batch)})


def dpo_pairs(dataset: Dataset) -> Dataset:
    """`prompt_ids`, `chosen_ids` and `rejected_ids`, as TRL's DPOTrainer takes them (and a pair's
    images as `image_files`)."""
    check_columns(dataset, examples="pairwise")
    return _map(dataset, _split_pairs, with_indices=True)


def odds_ratio_pairs(dataset: Dataset) -> Dataset:
    """The six pairwise columns as they are: TRL's ORPO and CPO (SimPO) trainers read LLaMA-Factory's names
    (and a pair's media files as `image_files`, ...)."""
    check_columns(dataset, examples="pairwise")
    return _map(dataset, lambda batch: {**{name: batch[name] for name in PAIRWISE_COLUMNS}, **_media_files(batch)})


def kto_examples(dataset: Dataset) -> Dataset:
    """`prompt_ids`, `completion_ids`, `KL_completion_ids` and `label`, as TRL's KTOTrainer takes them,
    and `KL_prompt_ids`, which `TokenizedKTOTrainer` puts before `KL_completion_ids`.

    The KL sequence is tuneline's `kl_*` example split at its prompt (LLaMA-Factory's pairing of each
    prompt with the previous row's reply, cut to cutoff_len on its own), so the KL term sees exactly
    the tokens tokenization wrote.
    """
    check_columns(dataset, examples="feedback")
    return _map(dataset, _split_feedback)


def _split_pairs(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
    prompts, chosen, rejected = [], [], []
    for index, chosen_ids, chosen_labels, rejected_ids, rejected_labels in zip(
        indices, batch["chosen_input_ids"], batch["chosen_labels"], batch["rejected_input_ids"], batch["rejected_labels"]
    ):
        length = prompt_length(chosen_labels)
        if prompt_length(rejected_labels) != length or chosen_ids[:length] != rejected_ids[:length]:
            raise DataError(f"pairwise example {index} has different prompts before its chosen and rejected replies; "
                            "tokenize the dataset again with 'tuneline data preprocess' (stage dpo).")
        prompts.append(chosen_ids[:length])
        chosen.append(chosen_ids[length:])
        rejected.append(rejected_ids[length:])
    return {"prompt_ids": prompts, "chosen_ids": chosen, "rejected_ids": rejected, **_media_files(batch)}


def _split_feedback(batch: dict[str, list]) -> dict[str, list]:
    prompts, completions, kl_prompts, kl_completions = [], [], [], []
    for ids, labels, kl_ids, kl_labels in zip(batch["input_ids"], batch["labels"], batch["kl_input_ids"],
                                              batch["kl_labels"]):
        length, kl_length = prompt_length(labels), prompt_length(kl_labels)
        prompts.append(ids[:length])
        completions.append(ids[length:])
        kl_prompts.append(kl_ids[:kl_length])
        kl_completions.append(kl_ids[kl_length:])
    return {"prompt_ids": prompts, "completion_ids": completions, "KL_prompt_ids": kl_prompts,
            "KL_completion_ids": kl_completions, "label": [bool(tag) for tag in batch["kto_tags"]], **_media_files(batch)}


def _media_files(batch: dict[str, list]) -> dict[str, list]:
    """A batch's media files under other names: TRL takes `images` (and `videos`) columns for rows it
    tokenizes itself."""
    return {files: batch[column] for column, files in PAIR_FILE_COLUMNS.items() if column in batch}


def _map(dataset: Dataset, function: Any, *, with_indices: bool = False) -> Dataset:
    return dataset.map(function, batched=True, with_indices=with_indices, remove_columns=dataset.column_names,
                       keep_in_memory=True)
