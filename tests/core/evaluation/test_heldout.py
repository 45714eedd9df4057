"""The held-out loss of a pipeline's evaluate section on preference pairs (a dpo stage's tokenized data):
the loss of the pairs' chosen answers, the same as on those answers tokenized as sft rows."""

from __future__ import annotations

from pathlib import Path

from tuneline.core.data.eval_splits import VALIDATION
from tuneline.core.evaluation.heldout import load_for_inference, validation_loss
from tuneline.core.models.loading import load_tokenizer


def saved_split(rows: dict[str, list], folder: Path) -> Path:
    from datasets import Dataset, DatasetDict

    DatasetDict({VALIDATION: Dataset.from_dict(rows)}).save_to_disk(str(folder))
    return folder


def test_the_loss_on_pairs_is_the_loss_on_their_chosen_answers(tiny_base: Path, tmp_path: Path):
    tokenizer = load_tokenizer(tiny_base)
    prompt = tokenizer("Name a colour.")["input_ids"]
    chosen = [tokenizer(" Red.")["input_ids"], tokenizer(" Deep blue sea.")["input_ids"]]
    rejected = [tokenizer(" Seven.")["input_ids"], tokenizer(" A chair.")["input_ids"]]
    answers = {"input_ids": [prompt + reply for reply in chosen],
               "attention_mask": [[1] * len(prompt + reply) for reply in chosen],
               "labels": [[-100] * len(prompt) + reply for reply in chosen]}
    pairs = {f"chosen_{key}": values for key, values in answers.items()}
    pairs.update({"rejected_input_ids": [prompt + reply for reply in rejected],
                  "rejected_attention_mask": [[1] * len(prompt + reply) for reply in rejected],
                  "rejected_labels": [[-100] * len(prompt) + reply for reply in rejected]})
    model = load_for_inference(tiny_base, adapter_path=None)

    on_pairs = validation_loss(model, saved_split(pairs, tmp_path / "pairs"), tokenizer=tokenizer)
    on_answers = validation_loss(model, saved_split(answers, tmp_path / "answers"), tokenizer=tokenizer)

    assert on_pairs == on_answers
    assert on_pairs["eval_tokens"] == sum(len(reply) for reply in chosen)
