"""Tokenize a stage's datasets to Arrow: rows in, LLaMA-Factory's columns out.

Rows stream from the registry in batches of `preprocessing_batch_size`; each batch is encoded
(by `preprocessing_num_workers` processes when asked) and appended to Arrow at once, so memory
does not grow with the dataset. The output folder loads with `datasets.load_from_disk` (splits
`train` and, with `val_size` or `eval_dataset`, `validation`) and keeps the tokenizer as the
template fixed it under `tokenizer/`, so training, merging and export all see the same tokens.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from tuneline.core.config import StageConfig, trains
from tuneline.core.config.added_tokens import AddedTokens, added_tokens
from tuneline.core.data.arrow_writer import SplitWriter, write_dataset_dict
from tuneline.core.data.dataset_info import (
    LoadReport,
    dataset_file_paths,
    get_dataset_attrs,
    load_rows_with_report,
)
from tuneline.core.data.encoding import EncodingSpec, predicts_only
from tuneline.core.data.encoding_pool import pool_map
from tuneline.core.data.eval_splits import VALIDATION, split_name
from tuneline.core.data.media.columns import AUDIOS, IMAGES, MEDIA_COLUMNS, VIDEOS
from tuneline.core.data.media.rows import MediaRows
from tuneline.core.data.media.video.frame_tiles import FRAME_TILED_PLUGINS
from tuneline.core.data.provenance import RowRefused
from tuneline.core.data.row_shapes import check_shapes
from tuneline.core.data.row_streams import (  # noqa: F401  (iter_rows and read_rows: read through this module by callers)
    dataset_names,
    iter_rows,
    origin_at,
    read_rows,
    routed_rows,
)
from tuneline.core.errors import ConfigError, DataError
from tuneline.core.models.vocabulary import NewTokens, describe_new_tokens
from tuneline.core.store.fingerprints import tree_fingerprint
from tuneline.core.templates.check import check_template, vocabulary_problems
from tuneline.core.templates.conversation import chat_template_jinja, fix_tokenizer, get_template
from tuneline.core.templates.options import with_template_keys
from tuneline.core.templates.spec import Template

_LOG = logging.getLogger(__name__)
TOKENIZER_DIR = "tokenizer"
PREVIEW_FILE = "preview.txt"
TEMPLATE_WARNING_FILE = "template_warning.txt"
"""Written when the template renders differently from the tokenizer's own chat template."""
DEFAULT_TEMPLATE = "default"


def dataset_fingerprints(config: StageConfig) -> dict[str, str]:
    """Digest of every dataset the stage reads, by name: its files' content and its registry entry
    (a changed column mapping changes the rows as surely as changed data)."""
    names = dataset_names(config.data.dataset) + dataset_names(config.data.eval_dataset)
    attrs = get_dataset_attrs(names, config.data.dataset_dir)
    digests = {attr.name: entry_fingerprint(attr, config.data.dataset_dir, token=config.model.hf_hub_token) for attr in attrs}
    for attr in attrs:
        if set(MEDIA_COLUMNS) & set(attr.columns):  # the media files' content decides the tokens (and the pixels) as much as the rows
            digests[attr.name] = hashlib.sha256(f"{digests[attr.name]}:{media_fingerprint(attr, config)}".encode()).hexdigest()
    return digests


def media_fingerprint(attr: Any, config: StageConfig) -> str:
    """Digest of the content of every media file the dataset's rows name (read and checked as tokenizing reads them)."""
    data = config.data
    rows = load_rows_with_report(attr, data.dataset_dir, on_bad_row=data.on_bad_row, max_samples=data.max_samples,
                                 token=config.model.hf_hub_token, media_dir=data.media_dir or data.dataset_dir)[0]
    files = sorted({Path(path) for row in rows for key in MEDIA_COLUMNS for path in row.get(key, [])})
    return tree_fingerprint(files)


def entry_fingerprint(attr, dataset_dir: str, *, token: str | None = None) -> str:
    """`token`, a hub dataset's Hugging Face Hub token, reaches the files, never the digest."""
    entry = hashlib.sha256(json.dumps(dataclasses.asdict(attr), sort_keys=True, default=str).encode()).hexdigest()
    files = dataset_file_paths(attr, dataset_dir, token=token)
    return hashlib.sha256(f"{entry}:{tree_fingerprint(files)}".encode()).hexdigest()


def stage_template(config: StageConfig, tokenizer, *, named: Template | None = None) -> Template:
    """The stage's template (`template`, else the default; `named` when already looked up) with
    its template keys applied."""
    data = config.data
    named = named or get_template(data.template or DEFAULT_TEMPLATE, tokenizer=tokenizer)
    return with_template_keys(named, default_system=data.default_system, tool_format=data.tool_format,
                              enable_thinking=data.enable_thinking, preserve_thinking=data.preserve_thinking)


class PreparedTokenizer(NamedTuple):
    tokenizer: Any
    template: Template
    warning: str | None
    """Set when a named template renders differently from the tokenizer's own chat template."""
    new_tokens: NewTokens | None
    """The tokens added to the loaded tokenizer (by the added-token keys and the template)."""


def prepare_tokenizer(config: StageConfig, tokenizer_path: str | Path) -> PreparedTokenizer:
    """The tokenizer as the stage needs it (the added-token keys' tokens, then the template's eos,
    pad, stop words and chat template), the template, the warning when a named template renders
    differently from the tokenizer's own chat template (None when they agree), and the record of
    the tokens added.

    LLaMA-Factory trains such combinations (llama2 on Llama-2, vicuna on Qwen2.5), so the
    difference is a warning, or an error with `strict_template`. It is always an error when the
    template writes a control token the tokenizer cannot write as one token, or needs a token the
    vocabulary lacks without `resize_vocab`.
    """
    from tuneline.core.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path, model=config.model)
    first_new_id = len(tokenizer)
    added = add_tokens(tokenizer, added_tokens(config.model))
    named = get_template(config.data.template or DEFAULT_TEMPLATE, tokenizer=tokenizer)
    # the template as named is compared: the keys' changes (a system prompt, a tool format) are the user's choice
    difference = check_template(named, tokenizer) if tokenizer.chat_template else None
    template = stage_template(config, tokenizer, named=named)
    original_vocab = set(tokenizer.get_vocab())
    fix_tokenizer(template, tokenizer)
    # added tokens grow the embeddings as resize_vocab does (LLaMA-Factory turns it on for them)
    problems = vocabulary_problems(template, tokenizer, original_vocab=original_vocab,
                                   resize_vocab=config.model.resize_vocab or added > 0)
    if difference and config.data.strict_template:
        problems.append(f"{difference} 'strict_template: true' makes this an error; remove it to train with a warning.")
    if problems:
        raise ConfigError(problems)
    if difference:
        _LOG.warning("%s", difference)
    tokenizer.chat_template = chat_template_jinja(template, tokenizer)
    return PreparedTokenizer(tokenizer, template, difference, new_tokens_of(config, tokenizer, first_new_id=first_new_id))


def add_tokens(tokenizer, tokens: AddedTokens) -> int:
    """Add the plain, then the special tokens to `tokenizer` (LLaMA-Factory's order); how many were new."""
    return (tokenizer.add_tokens(list(tokens.plain), special_tokens=False)
            + tokenizer.add_tokens(list(tokens.special), special_tokens=True))


def new_tokens_of(config: StageConfig, tokenizer, *, first_new_id: int) -> NewTokens | None:
    """The record of the tokens that `prepare_tokenizer` added beyond the loaded tokenizer's
    `first_new_id`, with the ids of their descriptions; None where none was added."""
    if len(tokenizer) <= first_new_id:
        return None
    return describe_new_tokens(tokenizer, first_id=first_new_id, descriptions=added_tokens(config.model).descriptions)


def tokenize_dataset(config: StageConfig, *, examples: str, tokenizer_path: str | Path, output_dir: str | Path) -> dict[str, Any]:
    """Write the tokenized splits (rows encoded as `examples`, a stage kind's shape) and the fixed
    tokenizer to `output_dir`; return the counters."""
    if not config.data.dataset and trains(config.training):  # a prediction config may name only eval_dataset
        raise ConfigError("'dataset' is not set; name one or more entries of dataset_info.json.")
    check_shapes(config, examples="unsupervised" if predicts_only(config.training) else examples)  # before the tokenizer loads
    with _cyclic_gc_paused():
        return _tokenize_dataset(config, examples=examples, tokenizer_path=tokenizer_path, output_dir=output_dir)


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cycle collector: tokenization allocates millions of short-lived lists, which
    reference counting frees, but each allocation burst would also start a collection pass over
    every live object (about a third of the run). Rows and examples hold no cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _tokenize_dataset(config: StageConfig, *, examples: str, tokenizer_path: str | Path, output_dir: str | Path) -> dict[str, Any]:
    tokenizer, template, template_warning, new_tokens = prepare_tokenizer(config, tokenizer_path)
    output_dir = Path(output_dir)
    media_rows = _media_rows(config, template, tokenizer_path, examples=examples)
    spec = EncodingSpec.from_config(config, template=template, examples=examples,
                                    media_token_ids=media_token_ids(tokenizer, media_rows) if media_rows else ())
    counters: Counter = Counter()
    writers = {"train": SplitWriter(output_dir / "train", fingerprint=output_dir.name)}
    reports: list[LoadReport] = []
    routed = routed_rows(config, reports=reports)
    if media_rows is not None:
        routed = _media_expanded(routed, media_rows)
    for split in eval_split_names(config):
        writers[split] = SplitWriter(output_dir / split, fingerprint=output_dir.name + ("v" if split == VALIDATION else split))
    first_example = None
    batches = _batches_by_split(routed, config.data.preprocessing_batch_size)
    try:
        for split, (examples, batch_counters) in pool_map(batches, spec=spec, tokenizer=tokenizer,
                                                           workers=config.data.preprocessing_num_workers or 1):
            writers[split].write(examples)
            counters.update({f"{split}_{k}" if split != "train" else k: v for k, v in batch_counters.items()})
            if first_example is None and examples and (split == "train" or not trains(config.training)):
                first_example = examples[0]  # what the preview shows: a training example, or one to predict
    except RowRefused as refused:
        raise _located(refused, config) from None
    for writer in writers.values():
        writer.close()
    for report in reports:
        counters.update({"rows_dropped_" + re.sub(r"\W+", "_", reason).strip("_"): n for reason, n in report.dropped.items()})
    if first_example is None:
        what = "training example" if trains(config.training) else "example to predict"
        raise ConfigError(f"no {what} is left after tokenization with cutoff_len {config.data.cutoff_len}; "
                          "raise cutoff_len or check the dataset.")
    write_dataset_dict(output_dir, [name for name, writer in writers.items() if writer.rows])
    tokenizer.save_pretrained(output_dir / TOKENIZER_DIR)
    if media_rows is not None:
        media_rows.save(output_dir / TOKENIZER_DIR)  # the training collator cuts the pixels with the same processor
    if new_tokens is not None:
        new_tokens.write(output_dir)
    (output_dir / PREVIEW_FILE).write_text(render_preview(first_example, tokenizer), encoding="utf-8")
    if template_warning:
        (output_dir / TEMPLATE_WARNING_FILE).write_text(template_warning + "\n", encoding="utf-8")
    return finish_counters(counters)


def _media_rows(config: StageConfig, template: Template, model_path: str | Path, *, examples: str) -> MediaRows | None:
    """How the stage's image, video and audio rows are expanded; None when no dataset it reads maps any."""
    with_media = media_datasets(config)
    if not with_media:
        return None
    problems = []
    if examples not in ("supervised", "pairwise", "feedback"):
        problems.append(f"dataset {', '.join(repr(n) for n in with_media)} maps images, videos or audio, and tuneline "
                        f"encodes media rows as supervised, pairwise or feedback examples so far, not as {examples} examples.")
    if config.data.neat_packing:
        problems.append("'neat_packing' with image, video or audio rows is not offered yet (each packed example would need "
                        "its own multimodal positions and attention); use 'packing: true', whose examples see each other.")
    if problems:
        raise ConfigError(problems)
    media_rows = MediaRows.load(template, model_path, config.media,
                                datasets={column: media_datasets(config, columns=(column,)) for column in MEDIA_COLUMNS})
    if config.data.packing and media_rows.media.plugin in UNPACKED_PLUGINS:
        raise ConfigError(f"'packing' with media rows through 'template: {template.name}' is not offered: "
                          f"{UNPACKED_PLUGINS[media_rows.media.plugin]}; remove packing.")
    images, videos = (media_datasets(config, columns=(column,)) for column in (IMAGES, VIDEOS))
    if config.data.packing and media_rows.media.plugin in FRAME_TILED_PLUGINS and images and videos:
        raise ConfigError(f"'packing' with images (dataset {', '.join(map(repr, images))}) and videos (dataset "
                          f"{', '.join(map(repr, videos))}) through 'template: {template.name}' is not offered: InternVL's "
                          "pixel_values hold a sequence's images before its videos' frames, and a pack interleaves its "
                          "examples' tokens; remove packing, or keep images and videos in separate runs.")
    return media_rows


UNPACKED_PLUGINS = {
    "paligemma": "its image tokens open the whole sequence, one prefix attended both ways, which a pack of several "
                 "examples does not have",
    "mllama": "its images are read by cross-attention, whose mask follows one example's images",
}
"""Families whose media rows cannot be packed, and why."""


def media_datasets(config: StageConfig, *, columns: tuple[str, ...] = MEDIA_COLUMNS) -> list[str]:
    """The names of the datasets the stage reads (to train or evaluate) that map one of `columns`."""
    names = dataset_names(config.data.dataset) + dataset_names(config.data.eval_dataset)
    return [attr.name for attr in get_dataset_attrs(names, config.data.dataset_dir) if set(columns) & set(attr.columns)]


def media_token_ids(tokenizer, media_rows: MediaRows) -> tuple[int, ...]:
    """The ids of the template's image, video and audio tokens, each of which must be one token of the vocabulary."""
    tokens = {IMAGES: media_rows.media.image_token, VIDEOS: media_rows.media.video_token,
              AUDIOS: media_rows.media.audio_token}
    # the media columns' tokens (not GLM-4.1V's video markers, which token_ids also names)
    ids = {column: token_id for column, token_id in media_rows.token_ids(tokenizer).items() if column in tokens}
    for column, token_id in ids.items():
        if token_id is None or tokenizer.convert_ids_to_tokens(token_id) != tokens[column]:
            raise ConfigError(f"the template's media token {tokens[column]!r} is not a token of this tokenizer; use the "
                              "tokenizer of the multimodal model the template is for.")
    return tuple(ids.values())


def eval_split_names(config: StageConfig) -> list[str]:
    """The validation splits the stage writes: `validation`, or one per evaluation dataset with
    `eval_on_each_dataset` (none without evaluation rows)."""
    data = config.data
    if data.eval_dataset and data.eval_on_each_dataset:
        return [split_name(name) for name in dataset_names(data.eval_dataset)]
    return [VALIDATION] if data.val_size or data.eval_dataset else []


def _media_expanded(routed: Iterable[tuple[dict, str]], media_rows: MediaRows) -> Iterator[tuple[dict, str]]:
    """`routed` with each row's image, video and audio placeholders expanded; a row the expansion
    refuses is raised as `RowRefused`, at its place in its split."""
    positions: Counter = Counter()
    for row, split in routed:
        try:
            expanded = media_rows.expand(row)
        except DataError as e:
            raise RowRefused(str(e), split, positions[split]) from None
        positions[split] += 1
        yield expanded, split


def _located(refused: RowRefused, config: StageConfig) -> DataError:
    """`refused` naming its row's dataset, file and row number (found again from its position)."""
    names = dataset_names(config.data.dataset) + dataset_names(config.data.eval_dataset)
    try:
        origin = origin_at(config, split=refused.split, position=refused.position)
    except DataError:  # the files changed since they were read
        origin = None
    return refused.located(origin, datasets="dataset " + ", ".join(repr(name) for name in names))


def _batches_by_split(routed: Iterable[tuple[dict, str]], size: int) -> Iterator[tuple[str, list[dict]]]:
    """Consecutive rows grouped per split into batches of at most `size`."""
    pending: dict[str, list[dict]] = {}
    for row, split in routed:
        batch = pending.setdefault(split, [])
        batch.append(row)
        if len(batch) >= size:
            yield split, pending.pop(split)
    for split, batch in pending.items():
        if batch:
            yield split, batch


def finish_counters(counters: Counter) -> dict[str, Any]:
    """Counters plus the padding ratio of the train split (share of pad positions in its batches)."""
    result: dict[str, Any] = dict(sorted(counters.items()))
    padded = counters.get("padded_positions", 0)
    result["padding_ratio"] = round(counters.get("pad_positions", 0) / padded, 4) if padded else 0.0
    return result


def render_preview(example: dict, tokenizer) -> str:
    """An example as the model sees it: trained spans in [[double brackets]], the rest masked."""
    ids = example.get("input_ids") or example.get("chosen_input_ids") or []
    labels = example.get("labels") or example.get("chosen_labels") or [-100] * len(ids)
    pieces: list[tuple[bool, list[int]]] = []
    for token, label in zip(ids, labels):
        trained = label != -100
        if pieces and pieces[-1][0] == trained:
            pieces[-1][1].append(token)
        else:
            pieces.append((trained, [token]))
    text = "".join(f"[[{tokenizer.decode(t)}]]" if trained else tokenizer.decode(t) for trained, t in pieces)
    return f"input_ids: {ids}\nlabels: {labels}\n\n{_runs_counted(text)}\n"


def _runs_counted(text: str) -> str:
    """A token repeated many times in a row (an image's `<|image_pad|>`, `<image>` or `<image_soft_token>`
    tokens, a sound's `<|AUDIO|>`) shown once with its count."""
    return re.sub(r"(<[^<>\s]+>)\1{3,}", lambda m: f"{m.group(1)} x {len(m.group(0)) // len(m.group(1))}", text)

