"""Prediction with generation after training (`do_predict` + `predict_with_generate`, as LLaMA-Factory).

The predict set is the tokenized `validation` split: `eval_dataset`, or the rows `val_size` held
out. Each example is cut where its last trained span (the final answer) starts: the tokens before
it are the prompt, exactly as the stage's template rendered it, and the span is the label. Packed
rows are first split into their examples where `position_ids` restart. The model answers each
prompt with the stage's generation settings (`GeneratingConfig`), in batches of
`per_device_eval_batch_size` left-padded prompts, stopping at eos or any other special token of the
template (LLaMA-Factory's stop set). Written to the output folder in LLaMA-Factory's format:

- `generated_predictions.jsonl`: one `{"prompt", "predict", "label"}` object per line; the prompt
  keeps its special tokens, answer and label are decoded without them;
- `predict_results.json` (through the trainer's `save_metrics`): `predict_bleu-4`,
  `predict_rouge-1`, `predict_rouge-2`, `predict_rouge-l` (see `tuneline.core.evaluation.text_metrics`),
  `predict_runtime`, `predict_samples_per_second`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.config import GeneratingConfig
from tuneline.core.errors import ConfigError
from tuneline.core.evaluation.text_metrics import mean_similarity

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer

    from tuneline.core.data.media.batching import RowMedia

PREDICTIONS_FILE = "generated_predictions.jsonl"
IGNORE_INDEX = -100


def predict_examples(rows: Iterator[Mapping[str, Sequence[int]]] | Dataset) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, label ids) of every example with a trained span, in dataset order.

    Rows encoded for prediction only (no label is masked: the labels are the reply) are taken as they are.
    """
    examples = []
    for row in rows:
        if IGNORE_INDEX not in row["labels"]:
            examples.append((list(row["input_ids"]), list(row["labels"])))
            continue
        for input_ids, labels in _unpacked(row):
            span = last_trained_span(labels)
            if span is not None:
                examples.append((list(input_ids[: span[0]]), list(input_ids[span[0] : span[1]])))
    return examples


def _unpacked(row: Mapping[str, Sequence[int]]) -> Iterator[tuple[Sequence[int], Sequence[int]]]:
    """The examples of a row: the row itself, or each packed example (positions restart at 0)."""
    if "position_ids" not in row:
        yield row["input_ids"], row["labels"]
        return
    positions = row["position_ids"]
    starts = [i for i, position in enumerate(positions) if position == 0] + [len(positions)]
    for begin, end in zip(starts, starts[1:]):
        yield row["input_ids"][begin:end], row["labels"][begin:end]


def last_trained_span(labels: Sequence[int]) -> tuple[int, int] | None:
    """[start, end) of the last run of trained labels, or None when nothing is trained."""
    end = len(labels)
    while end > 0 and labels[end - 1] == IGNORE_INDEX:
        end -= 1
    if end == 0:
        return None
    start = end
    while start > 0 and labels[start - 1] != IGNORE_INDEX:
        start -= 1
    return start, end


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None = None) -> list[int]:
    """eos, the tokenizer's other special tokens (the template's stop words) and the model's eos."""
    ids = [tokenizer.eos_token_id, *tokenizer.extra_special_tokens_ids]
    if model is not None and model.generation_config.eos_token_id is not None:
        configured = model.generation_config.eos_token_id
        ids += configured if isinstance(configured, list) else [configured]
    return list(dict.fromkeys(i for i in ids if i is not None))


def generation_kwargs(generating: GeneratingConfig, tokenizer: PreTrainedTokenizerBase,
                      model: PreTrainedModel | None = None) -> dict[str, Any]:
    """`generate` keyword arguments; the sampling knobs only when sampling. As in LLaMA-Factory,
    `max_new_tokens` bounds the answer when positive, else `max_length` bounds prompt plus answer."""
    values = asdict(generating)
    values.pop("skip_special_tokens")  # a decoding setting, not generate's
    values.pop("max_length" if generating.max_new_tokens > 0 else "max_new_tokens")
    if not generating.do_sample:
        for key in ("temperature", "top_p", "top_k"):
            values.pop(key)
    from tuneline.core.models.mixture_of_depths import routes_tokens

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    cache = model is None or not routes_tokens(model)  # a routed model recomputes the whole text each step
    return {**values, "eos_token_id": stop_token_ids(tokenizer, model), "pad_token_id": pad, "use_cache": cache}


def generate_answers(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Sequence[int]], *,
                     generating: GeneratingConfig, batch_size: int = 1, media: RowMedia | None = None,
                     rows: Sequence[Mapping[str, Any]] = (), keep_stop: bool = False) -> list[list[int]]:
    """The generated ids of each prompt (prompt and padding removed; the stop token too, unless
    `keep_stop`), batches left-padded; with `media`, each prompt reads the media of its row in `rows`."""
    import torch

    kwargs = generation_kwargs(generating, tokenizer, model)
    pad = kwargs["pad_token_id"]
    answers: list[list[int]] = []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(prompts), max(batch_size, 1)):
            batch = prompts[start : start + max(batch_size, 1)]
            width = max(len(p) for p in batch)
            input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in batch], device=model.device)
            attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
            pixels = media.inputs(input_ids, rows[start : start + len(batch)], attention_mask=attention_mask) if media else {}
            output = model.generate(input_ids=input_ids, attention_mask=attention_mask, **pixels, **kwargs)
            answers.extend(_strip_stop(row[width:].tolist(), pad=pad, stops=kwargs["eos_token_id"], keep_stop=keep_stop)
                           for row in output)
    return answers


def _strip_stop(ids: list[int], *, pad: int, stops: Sequence[int], keep_stop: bool = False) -> list[int]:
    """Generated ids before the first stop token (through it with `keep_stop`); without one, all but the padding."""
    for index, token in enumerate(ids):
        if token in stops:
            return ids[: index + 1] if keep_stop else ids[:index]
    return [token for token in ids if token != pad]


def do_predict(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, predict_set: Dataset | None, *,
               output_dir: str | Path, generating: GeneratingConfig, batch_size: int = 1,
               media: RowMedia | None = None) -> dict[str, float]:
    """Answer the predict set, write `generated_predictions.jsonl` and return the `predict_*` metrics.
    Media rows are answered with their media (`media`, the tokenized data's)."""
    if predict_set is None or len(predict_set) == 0:
        raise ConfigError("'do_predict: true' found no predict set: the tokenized data has no validation rows; "
                          "name 'eval_dataset' or hold rows out with 'val_size'.")
    rows: list[dict[str, Any]] = []
    if media is not None:
        if "position_ids" in predict_set.column_names:
            raise ConfigError("'do_predict: true' answers each held-out example with its own media, and the held-out "
                              "media rows were packed together ('packing: true'); predict from a run without packing.")
        files = media.files_of(predict_set)
        rows = [files[index] for index, row in enumerate(predict_set) if last_trained_span(row["labels"]) is not None
                or IGNORE_INDEX not in row["labels"]]
    examples = predict_examples(predict_set)
    started = time.monotonic()
    answers = generate_answers(model, tokenizer, [prompt for prompt, _ in examples], generating=generating, batch_size=batch_size,
                               media=media, rows=rows)
    seconds = time.monotonic() - started
    prompts = tokenizer.batch_decode([prompt for prompt, _ in examples], skip_special_tokens=False)
    predicted = tokenizer.batch_decode(answers, skip_special_tokens=generating.skip_special_tokens)
    labels = tokenizer.batch_decode([label for _, label in examples], skip_special_tokens=True)
    path = Path(output_dir) / PREDICTIONS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for prompt, predict, label in zip(prompts, predicted, labels, strict=True):
            handle.write(json.dumps({"prompt": prompt, "predict": predict, "label": label}, ensure_ascii=False) + "\n")
    metrics = {f"predict_{key}": value for key, value in mean_similarity(predicted, labels).items()}
    metrics["predict_runtime"] = round(seconds, 4)
    metrics["predict_samples_per_second"] = round(len(examples) / max(seconds, 1e-9), 3)
    return metrics


def predict_set(datasets: DatasetDict) -> Dataset | None:
    """The rows to answer: the `validation` split, or with `eval_on_each_dataset` every evaluation
    dataset's split one after another (LLaMA-Factory 0.9.5 cannot predict on several)."""
    from datasets import concatenate_datasets

    from tuneline.core.data.eval_splits import VALIDATION, per_dataset_splits

    if VALIDATION in datasets:
        return datasets[VALIDATION]
    splits = [datasets[split] for split in per_dataset_splits(datasets).values()]
    return concatenate_datasets(splits) if splits else None


def predict_after_training(trainer: Trainer, datasets: DatasetDict, *, generating: Mapping[str, Any],
                           media: RowMedia | None = None) -> dict[str, float]:
    """`do_predict` on the main process with the trained model (media rows with `media`, the trainer's);
    results saved as `predict_results.json`."""
    if not trainer.is_world_process_zero():
        return {}
    metrics = do_predict(trainer.model, trainer.processing_class, predict_set(datasets),
                         output_dir=trainer.args.output_dir, generating=GeneratingConfig(**generating),
                         batch_size=trainer.args.per_device_eval_batch_size, media=media)
    trainer.save_metrics("predict", metrics)
    return metrics

