"""Evaluation: loss and perplexity on a validation split, and the quality of greedy answers.

The answer score is the mean token-level F1 between each greedy answer and its reference (the
SQuAD-style overlap measure), on prompts the model never trained on.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.config import StageConfig
from tuneline.core.data.media.batching import RowMedia
from tuneline.core.evaluation.benchmark_plan import BenchmarkPlan, run_benchmarks

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_for_inference(model_path: str | Path, *, adapter_path: str | Path | None = None,
                       vocab_size: int | None = None) -> PreTrainedModel:
    """The model in eval mode, with an unmerged LoRA adapter on top when one is given (`vocab_size`:
    the adapter's tokenizer length, when training added tokens to the base's embeddings)."""
    from tuneline.core.models.loading import load_model

    model = load_model(model_path, vocab_size=vocab_size)
    if adapter_path is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_path))
    return model.eval()


def validation_loss(model: PreTrainedModel, dataset_path: str | Path, *, tokenizer, batch_size: int = 8,
                    media: RowMedia | None = None) -> dict[str, float]:
    """Token-weighted mean loss and perplexity on the `validation` split of a tokenized dataset, or
    on each evaluation dataset's split (`eval_on_each_dataset`; metrics named `eval_<name>_*`); media
    rows read with their media (`media`, the tokenized data's)."""
    from datasets import load_from_disk

    from tuneline.core.data.eval_splits import VALIDATION, dataset_metrics, per_dataset_splits

    splits = load_from_disk(str(dataset_path))
    if VALIDATION in splits:
        return _split_loss(model, splits[VALIDATION], tokenizer=tokenizer, batch_size=batch_size, media=media)
    metrics: dict[str, float] = {}
    for name, split in per_dataset_splits(splits).items():
        loss = _split_loss(model, splits[split], tokenizer=tokenizer, batch_size=batch_size, media=media)
        metrics.update(dataset_metrics(loss, name))
    return metrics


TEXT_COLUMNS = ("input_ids", "attention_mask", "labels")


def _split_loss(model: PreTrainedModel, rows, *, tokenizer, batch_size: int, media: RowMedia | None) -> dict[str, float]:
    import torch
    from transformers import DataCollatorForSeq2Seq

    collate = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
    # pairs (rm, dpo data): the loss of the chosen answers, which a preference-tuned policy should keep low
    columns = {key: key if "input_ids" in rows.column_names else f"chosen_{key}" for key in TEXT_COLUMNS}
    files = media.files_of(rows) if media is not None else None
    total_loss, total_tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            indices = range(start, min(start + batch_size, len(rows)))
            batch = collate([{key: rows[i][column] for key, column in columns.items()} for i in indices])
            pixels = media.inputs(batch["input_ids"], [files[i] for i in indices], attention_mask=batch["attention_mask"]) \
                if media is not None else {}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **pixels).logits
            labels = batch["labels"][:, 1:]
            losses = torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum"
            )
            total_loss += losses.item()
            total_tokens += int((labels != -100).sum())
    loss = total_loss / max(total_tokens, 1)
    return {"eval_loss": loss, "eval_perplexity": perplexity(loss), "eval_tokens": float(total_tokens)}


def perplexity(loss: float) -> float:
    """exp(mean token loss), capped so that a diverged run reports a large number instead of inf."""
    return math.exp(min(loss, 50.0))


def greedy_answers(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict[str, Any]], *, template, max_new_tokens: int = 32,
    media: RowMedia | None = None,
) -> list[str]:
    """Greedy completions of each row's prompt rendered with `template`; rows with images, videos or
    sounds expanded and answered with them as training fed them (`media`, the tokenized data's)."""
    import torch

    from tuneline.core.templates.conversation import Conversation, encode_prompt, stop_token_ids

    stops = stop_token_ids(template, tokenizer)
    answers = []
    with torch.no_grad():
        for row in rows:
            if media is not None:
                row = media.media.expand(row)
            prefix = [tokenizer.convert_tokens_to_ids(template.media.image_token)] * (row.get("image_prefix") or 0) \
                if template.media is not None else []  # PaliGemma's image tokens open the sequence
            ids = prefix + encode_prompt(template, tokenizer, Conversation(prompt=row["prompt"], system=row.get("system") or None))
            input_ids, attention_mask = torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)
            pixels = media.inputs(input_ids, [row], attention_mask=attention_mask) if media is not None else {}
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                **pixels,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=stops,
                pad_token_id=tokenizer.pad_token_id,
            )
            answers.append(tokenizer.decode(output[0, len(ids) :], skip_special_tokens=True).strip())
    return answers


def token_f1(prediction: str, reference: str) -> float:
    predicted, expected = _words(prediction), _words(reference)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if not predicted or not expected or not common:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def answer_score(answers: Sequence[str], rows: Sequence[dict[str, Any]]) -> float:
    """Mean token F1 of `answers` against each row's reference response."""
    scores = [token_f1(answer, row["response"][0]["content"]) for answer, row in zip(answers, rows, strict=True)]
    return sum(scores) / max(len(scores), 1)


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


@dataclass(frozen=True)
class Score:
    metrics: dict[str, float]
    predictions: list[dict[str, str]]


def score_model(
    model_path: str | Path, *, adapter_path: str | Path | None, config: StageConfig, tokenized_path: str | Path,
    rows: Sequence[dict[str, Any]], max_new_tokens: int, plan: BenchmarkPlan | None = None,
) -> Score:
    """Validation loss of a tokenized dataset plus greedy-answer F1 on the held-out `rows` (standard rows),
    and the benchmarks of `plan` on the same loaded model."""
    from tuneline.core.data.tokenization import TOKENIZER_DIR, stage_template
    from tuneline.core.models.loading import load_tokenizer

    tokenizer = load_tokenizer(Path(tokenized_path) / TOKENIZER_DIR)
    model = load_for_inference(model_path, adapter_path=adapter_path)
    media = RowMedia.of_tokenized(tokenized_path, tokenizer)
    metrics = validation_loss(model, tokenized_path, tokenizer=tokenizer, media=media)
    predictions: list[dict[str, str]] = []
    if rows:
        template = stage_template(config, tokenizer)
        answers = greedy_answers(model, tokenizer, rows, template=template, max_new_tokens=max_new_tokens, media=media)
        metrics["answer_f1"] = answer_score(answers, rows)
        predictions = [
            {"prompt": row["prompt"][-1]["content"], "predict": answer, "label": row["response"][0]["content"]}
            for row, answer in zip(rows, answers, strict=True)
        ]
    if plan:
        metrics.update(run_benchmarks(model, tokenizer, template=stage_template(config, tokenizer), plan=plan))
    return Score(metrics=metrics, predictions=predictions)
