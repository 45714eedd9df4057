"""Keys of the data: which datasets, how they are rendered, cut, packed and mixed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tuneline.core.config.fields import documented as _doc


@dataclass(frozen=True)
class DataConfig:
    dataset: str | None = _doc("Training dataset name(s) from dataset_info.json, comma-separated.", default=None)
    eval_dataset: str | None = _doc("Evaluation dataset name(s), comma-separated.", default=None)
    dataset_dir: str = _doc("Folder holding dataset_info.json and the dataset files.", default="data")
    media_dir: str | None = _doc("Folder that relative image, video and audio paths start from (default: dataset_dir).",
                                 default=None)
    template: str | None = _doc("Chat template name used to render conversations.", default=None)
    default_system: str | None = _doc("System prompt used where a row has none (replaces the template's own).", default=None)
    tool_format: str | None = _doc("How tool definitions and calls are written (the template's own format unless set): "
                                   "default, gemma4, glm4, glm4_moe, lfm2, ling, llama3, minimax1, minimax2, mistral, qwen, "
                                   "qwen3_5 or seed_oss.", default=None)
    enable_thinking: bool | None = _doc("Reasoning templates: keep thoughts and train empty ones (true), drop them and put "
                                        "an empty one in the prompt (false), or keep them with empty ones in the prompt (null).",
                                        default=True)
    preserve_thinking: bool = _doc("Reasoning templates: keep the thoughts of earlier turns in the prompt.", default=False)
    cutoff_len: int = _doc("Maximum tokens per example after tokenization.", default=2048)
    train_on_prompt: bool = _doc("Train on prompt tokens too (labels not masked).", default=False)
    mask_history: bool = _doc("Train only on the last turn of multi-turn conversations.", default=False)
    ignore_pad_token_for_loss: bool = _doc("Padding in the labels is left out of the loss (false: sft trains it).", default=True)
    max_samples: int | None = _doc("Use at most this many rows of each dataset.", default=None)
    val_size: float = _doc("Share (<1) or count (>=1) of training rows held out for validation.", default=0.0)
    eval_on_each_dataset: bool = _doc("Evaluate each evaluation dataset on its own, with its name in the metric names.",
                                      default=False)
    eval_num_beams: int | None = _doc("Beams of the generation that `predict_with_generate` runs (default: num_beams).",
                                      default=None)
    packing: bool | None = _doc("Pack examples into full-length sequences (default: on for pt).", default=None)
    neat_packing: bool = _doc("Packing without cross-attention between packed examples.", default=False)
    overwrite_cache: bool = _doc("Accepted for compatibility: the content-keyed cache is always correct.", default=False)
    preprocessing_num_workers: int | None = _doc("Processes used for tokenization.", default=None)
    preprocessing_batch_size: int = _doc("Rows per tokenization batch.", default=1000)
    tokenized_path: str | None = _doc("Save or load the tokenized dataset here.", default=None)
    data_shared_file_system: bool = _doc("Several machines see one file system: data is prepared once, not once per machine.",
                                         default=False)
    mix_strategy: Literal["concat", "interleave_under", "interleave_over"] = _doc("How several datasets are mixed.", default="concat")
    interleave_probs: str | None = _doc("Sampling probabilities of the datasets when interleaving, comma-separated.", default=None)
    streaming: bool = _doc("Stream datasets instead of loading them whole.", default=False)
    buffer_size: int = _doc("Streaming: rows in the seeded shuffle buffer the streamed rows pass through.", default=16384)
    on_bad_row: Literal["error", "skip"] = _doc("A malformed row stops with an error naming it, or is dropped and counted.",
                                                default="error")
    allow_template_mismatch: bool = _doc("Accepted for compatibility: a template that renders differently from the tokenizer's "
                                         "own chat template is a warning unless 'strict_template' is set.", default=False)
    strict_template: bool = _doc("Refuse a named template that renders differently from the tokenizer's own chat template "
                                 "(by default a warning, recorded in the tokenized data's manifest).", default=False)
