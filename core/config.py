"""Stage configuration with LLaMA-Factory's key names.

A stage YAML is a flat mapping, as LLaMA-Factory writes it. Its keys are split into one frozen
dataclass per concern (model, data, method, generation, export); the rest must be arguments of
`transformers.Seq2SeqTrainingArguments`, which keep their own names and meaning. Every problem
is collected and raised at once as a `ConfigError`, with the nearest valid key for typos.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

from tuneline.core.errors import ConfigError, nearest


def _doc(text: str, **kwargs: Any) -> Any:
    return field(metadata={"help": text}, **kwargs)


@dataclass(frozen=True)
class ModelConfig:
    model_name_or_path: str | None = _doc("Local model folder or hub id of the base model.", default=None)
    adapter_name_or_path: str | None = _doc("Adapter folder(s) to load on top of the base, comma-separated.", default=None)
    cache_dir: str | None = _doc("Where hub downloads are cached.", default=None)
    model_revision: str = _doc("Hub revision (branch, tag or commit) of the model.", default="main")
    trust_remote_code: bool = _doc("Allow code shipped with the model to run. Off unless asked.", default=False)
    use_fast_tokenizer: bool = _doc("Use the Rust (fast) tokenizer.", default=True)
    resize_vocab: bool = _doc("Resize the embeddings when the template adds tokens.", default=False)
    flash_attn: Literal["auto", "disabled", "sdpa", "fa2"] = _doc("Attention implementation.", default="auto")
    quantization_bit: int | None = _doc("Load the base in 4 or 8 bits (QLoRA).", default=None)
    quantization_method: Literal["bnb", "gptq", "awq", "aqlm", "quanto", "eetq", "hqq"] = _doc("Quantization backend.", default="bnb")
    quantization_type: Literal["fp4", "nf4"] = _doc("4-bit data type of bitsandbytes.", default="nf4")
    double_quantization: bool = _doc("Quantize the quantization constants too (bitsandbytes).", default=True)
    allow_pickle_weights: bool = _doc("Load pickle (.bin) weights of the model or adapter when they have no safetensors; "
                                      "unpickling can run code, so only for files you trust.", default=False)


@dataclass(frozen=True)
class DataConfig:
    dataset: str | None = _doc("Training dataset name(s) from dataset_info.json, comma-separated.", default=None)
    eval_dataset: str | None = _doc("Evaluation dataset name(s), comma-separated.", default=None)
    dataset_dir: str = _doc("Folder holding dataset_info.json and the dataset files.", default="data")
    template: str | None = _doc("Chat template name used to render conversations.", default=None)
    cutoff_len: int = _doc("Maximum tokens per example after tokenization.", default=2048)
    train_on_prompt: bool = _doc("Train on prompt tokens too (labels not masked).", default=False)
    mask_history: bool = _doc("Train only on the last turn of multi-turn conversations.", default=False)
    max_samples: int | None = _doc("Use at most this many rows of each dataset.", default=None)
    val_size: float = _doc("Share (<1) or count (>=1) of training rows held out for validation.", default=0.0)
    packing: bool | None = _doc("Pack examples into full-length sequences (default: on for pt).", default=None)
    neat_packing: bool = _doc("Packing without cross-attention between packed examples.", default=False)
    overwrite_cache: bool = _doc("Accepted for compatibility: the content-keyed cache is always correct.", default=False)
    preprocessing_num_workers: int | None = _doc("Processes used for tokenization.", default=None)
    preprocessing_batch_size: int = _doc("Rows per tokenization batch.", default=1000)
    tokenized_path: str | None = _doc("Save or load the tokenized dataset here.", default=None)
    mix_strategy: Literal["concat", "interleave_under", "interleave_over"] = _doc("How several datasets are mixed.", default="concat")
    interleave_probs: str | None = _doc("Sampling probabilities of the datasets when interleaving, comma-separated.", default=None)
    on_bad_row: Literal["error", "skip"] = _doc("A malformed row stops with an error naming it, or is dropped and counted.", default="error")
    allow_template_mismatch: bool = _doc("Train even if the template renders differently from the tokenizer's own chat template.", default=False)
    streaming: bool = _doc("Stream datasets instead of loading them whole.", default=False)


@dataclass(frozen=True)
class FinetuningConfig:
    stage: str | None = _doc("Training stage: one of the stage kinds in core/stages/registry.py (unset: its DEFAULT_STAGE).",
                             default=None)
    finetuning_type: Literal["lora", "freeze", "full"] = _doc("Which parameters train.", default="lora")
    lora_rank: int = _doc("LoRA rank r.", default=8)
    lora_alpha: int | None = _doc("LoRA scaling alpha (default: 2 x lora_rank).", default=None)
    lora_dropout: float = _doc("Dropout on the LoRA branch.", default=0.0)
    lora_target: str = _doc("Modules that get LoRA: 'all' (every linear layer) or names, comma-separated.", default="all")
    additional_target: str | None = _doc("Extra modules trained fully and saved with the adapter.", default=None)
    use_rslora: bool = _doc("Rank-stabilised LoRA scaling.", default=False)
    use_dora: bool = _doc("Weight-decomposed LoRA (DoRA).", default=False)
    pissa_init: bool = _doc("Initialise LoRA with PiSSA (principal singular vectors).", default=False)
    loraplus_lr_ratio: float | None = _doc("LoRA+: learning-rate ratio of B to A matrices.", default=None)
    create_new_adapter: bool = _doc("Start a new adapter on top of adapter_name_or_path instead of continuing it.", default=False)
    freeze_trainable_layers: int = _doc("Freeze: train the last n layers (negative: the first n).", default=2)
    freeze_trainable_modules: str = _doc("Freeze: module names trained within those layers, or 'all'.", default="all")
    freeze_extra_modules: str | None = _doc("Freeze: modules outside the layers that also train.", default=None)
    pref_beta: float = _doc("Preference stages: beta of the DPO/KTO/ORPO/SimPO loss.", default=0.1)
    pref_ftx: float = _doc("Preference stages: weight of the added SFT loss.", default=0.0)
    pref_loss: Literal["sigmoid", "hinge", "ipo", "kto_pair", "orpo", "simpo"] = _doc("DPO loss type.", default="sigmoid")
    dpo_label_smoothing: float = _doc("Robust DPO label smoothing in [0, 0.5].", default=0.0)
    simpo_gamma: float = _doc("SimPO target reward margin.", default=0.5)
    kto_chosen_weight: float = _doc("KTO weight of desirable examples.", default=1.0)
    kto_rejected_weight: float = _doc("KTO weight of undesirable examples.", default=1.0)
    ref_model: str | None = _doc("Reference model for DPO/KTO/PPO (default: the policy's base).", default=None)
    ref_model_adapters: str | None = _doc("Adapter(s) on the reference model.", default=None)
    reward_model: str | None = _doc("Reward model for PPO.", default=None)
    reward_model_adapters: str | None = _doc("Adapter(s) on the reward model.", default=None)
    reward_model_type: Literal["lora", "full", "api"] = _doc("How the reward model is given.", default="lora")
    ppo_buffer_size: int = _doc("PPO: mini-batches per optimisation step.", default=1)
    ppo_epochs: int = _doc("PPO: epochs per optimisation step.", default=4)
    ppo_score_norm: bool = _doc("PPO: normalise scores.", default=False)
    ppo_target: float = _doc("PPO: target KL for the adaptive KL controller.", default=6.0)
    ppo_whiten_rewards: bool = _doc("PPO: whiten rewards before computing advantages.", default=False)
    plot_loss: bool = _doc("Save a loss-curve PNG (always done; kept for compatibility).", default=False)


@dataclass(frozen=True)
class GeneratingConfig:
    max_new_tokens: int = _doc("Tokens generated per answer.", default=512)
    do_sample: bool = _doc("Sample instead of greedy decoding.", default=False)
    temperature: float = _doc("Sampling temperature.", default=0.95)
    top_p: float = _doc("Nucleus sampling mass.", default=0.7)
    top_k: int = _doc("Top-k sampling.", default=50)
    repetition_penalty: float = _doc("Penalty on repeated tokens.", default=1.0)


@dataclass(frozen=True)
class ExportConfig:
    export_dir: str | None = _doc("Folder the merged Hugging Face model is written to.", default=None)
    export_size: int = _doc("Largest safetensors shard, in GB.", default=5)
    export_device: Literal["cpu", "auto"] = _doc("Device used for merging.", default="cpu")
    export_legacy_format: bool = _doc("Write pickle (.bin) weights instead of safetensors.", default=False)
    export_quantization_bit: int | None = _doc("Quantize the exported model to this many bits (GPTQ).", default=None)
    export_quantization_dataset: str | None = _doc("Calibration data for export quantization.", default=None)


@dataclass(frozen=True)
class OutputConfig:
    overwrite_output_dir: bool = _doc("Allow writing into an output_dir that holds other files.", default=False)


@dataclass(frozen=True)
class StageConfig:
    """One stage, resolved and validated; `training` holds Seq2SeqTrainingArguments keys.

    `training` is a plain dict so the config stays JSON-serialisable; treat it as read-only.
    """

    model: ModelConfig
    data: DataConfig
    finetuning: FinetuningConfig
    generating: GeneratingConfig
    export: ExportConfig
    output: OutputConfig
    training: dict[str, Any]

    def flat(self) -> dict[str, Any]:
        """All keys in LLaMA-Factory's flat form (what the YAML would say, defaults included)."""
        merged: dict[str, Any] = {}
        for group in (self.model, self.data, self.finetuning, self.generating, self.export, self.output):
            merged.update(dataclasses.asdict(group))
        merged.update(self.training)
        return merged


GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "finetuning": FinetuningConfig,
    "generating": GeneratingConfig,
    "export": ExportConfig,
    "output": OutputConfig,
}

# LLaMA-Factory keys of features tuneline leaves out, named so the error says what they were for.
LLAMAFACTORY_UNSUPPORTED = {
    **dict.fromkeys(("use_kt", "kt_optimize_rule", "cpu_infer", "chunk_size"), "KTransformers offloading"),
    **dict.fromkeys(("ray_run_name", "ray_storage_path", "ray_num_workers", "placement_strategy", "resources_per_worker",
                     "ray_init_kwargs"), "Ray training (tuneline distributes through Prefect and accelerate)"),
    **dict.fromkeys(("image_max_pixels", "image_min_pixels", "video_max_pixels", "video_min_pixels", "video_fps",
                     "video_maxlen", "audio_sampling_rate", "freeze_vision_tower", "freeze_multi_modal_projector",
                     "freeze_language_model", "use_audio_in_video"), "multimodal models"),
    **dict.fromkeys(("task", "task_dir", "lang", "n_shot", "save_dir", "batch_size"), "benchmark evaluation (llamafactory-cli eval)"),
    "use_v1_kernels": "its v1 fused kernels",
}

# Trainer keys that LLaMA-Factory YAMLs carry but that only steer its own launcher.
_IGNORED_TRAINING_KEYS = frozenset({"ddp_timeout"})
# Trainer keys that transformers 5 renamed: old name -> new name (same meaning).
_RENAMED_TRAINING_KEYS = {"warmup_ratio": "warmup_steps", "logging_dir": None}


_SIMPLE_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


@cache
def training_fields() -> dict[str, Any]:
    """Init fields of `Seq2SeqTrainingArguments`, each mapped to the simple type it takes (bool,
    int, float, str) or `Any` when it takes something richer (enums, unions, lists).

    Importing transformers' trainer module costs seconds, too much for a command that only checks a
    config or finds every stage cached, so the table is kept per transformers version in the cache.
    """
    from importlib import metadata

    cache_file = cache_root() / f"trainer-arguments-{metadata.version('transformers')}.json"
    try:
        kinds = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        kinds = _read_training_fields()
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
        tmp.write_text(json.dumps(kinds), encoding="utf-8")
        os.replace(tmp, cache_file)
    return {name: _SIMPLE_TYPES.get(kind, Any) for name, kind in kinds.items()}


def _read_training_fields() -> dict[str, str]:
    from transformers import Seq2SeqTrainingArguments

    hints = typing.get_type_hints(Seq2SeqTrainingArguments)
    kinds = {}
    for f in dataclasses.fields(Seq2SeqTrainingArguments):
        if not f.init:
            continue
        options = [a for a in typing.get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
        simple = [name for name, kind in _SIMPLE_TYPES.items() if options == [kind]]
        kinds[f.name] = simple[0] if simple else "any"
    return kinds


def cache_root() -> Path:
    """Where tuneline keeps caches that outlive a workspace (`$TUNELINE_CACHE`, default ~/.cache/tuneline)."""
    return Path(os.environ.get("TUNELINE_CACHE") or Path.home() / ".cache" / "tuneline")


def valid_keys() -> set[str]:
    keys = {f.name for group in GROUPS.values() for f in dataclasses.fields(group)}
    return keys | set(training_fields())


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from `path`, or a ConfigError naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"the file {path} does not exist; pass the path of a YAML config.")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from e
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values, not a {type(loaded).__name__}.")
    return loaded


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`key=value` strings from the command line; values are read as YAML scalars."""
    overrides: dict[str, Any] = {}
    problems = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            problems.append(f"override '{pair}' is not of the form key=value (for example learning_rate=1e-4).")
            continue
        overrides[key.strip()] = yaml.safe_load(value) if value.strip() else None
    if problems:
        raise ConfigError(problems)
    return overrides


def read_stage_config(raw: Mapping[str, Any]) -> tuple[StageConfig, list[str]]:
    """Split, type-check and cross-check a flat LLaMA-Factory mapping: the config and every problem found.

    The checks of a stage kind come on top (`core.stages.registry.build_stage_config` adds them and
    raises one ConfigError with all problems); this layer knows no kind.
    """
    problems: list[str] = []
    known = valid_keys()
    grouped: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
    training: dict[str, Any] = {}
    group_of = {f.name: name for name, group in GROUPS.items() for f in dataclasses.fields(group)}
    for key, value in raw.items():
        if key in group_of:
            grouped[group_of[key]][key] = value
        elif key in _IGNORED_TRAINING_KEYS or (key in _RENAMED_TRAINING_KEYS and not _RENAMED_TRAINING_KEYS[key]):
            continue
        elif key in _RENAMED_TRAINING_KEYS:
            if _RENAMED_TRAINING_KEYS[key] in raw:
                problems.append(f"'{key}' and '{_RENAMED_TRAINING_KEYS[key]}' both set; keep one.")
            training[_RENAMED_TRAINING_KEYS[key]] = value
        elif key in training_fields():
            training[key] = value
        elif key in LLAMAFACTORY_UNSUPPORTED:
            problems.append(f"'{key}' is a LLaMA-Factory key for {LLAMAFACTORY_UNSUPPORTED[key]}, which tuneline does not support; remove it.")
        else:
            guess = nearest(key, known)
            hint = f"; did you mean '{guess}'?" if guess else " (neither a tuneline/LLaMA-Factory key nor a transformers trainer argument)."
            problems.append(f"unknown key '{key}'{hint}")
    built: dict[str, Any] = {}
    for name, group in GROUPS.items():
        values = coerce_fields(group, grouped[name], problems)
        built[name] = group(**values)
    training = _coerce_training(training, problems)
    config = StageConfig(training=training, **built)
    problems.extend(_conflicts(config))
    return config, problems


def coerce_fields(group: type, values: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """`values` coerced to the annotated field types of dataclass `group`; problems appended."""
    return _coerce_all(values, typing.get_type_hints(group), problems)


def _coerce_training(values: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    return _coerce_all(values, training_fields(), problems)


def _coerce_all(values: dict[str, Any], types_by_key: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    coerced = {}
    for key, value in values.items():
        try:
            coerced[key] = coerce(value, types_by_key[key])
        except (TypeError, ValueError) as e:
            problems.append(f"'{key}': {e}")
    return coerced


def coerce(value: Any, hint: Any) -> Any:
    """`value` converted to the annotated type, or TypeError/ValueError saying what was expected."""
    if value is None or hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        errors = []
        for option in options:
            try:
                return coerce(value, option)
            except (TypeError, ValueError) as e:
                errors.append(str(e))
        raise ValueError(errors[0] if len(errors) == 1 else f"got {value!r}, which fits none of {hint}")
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ValueError(f"got {value!r}; choose one of {', '.join(map(str, choices))}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise TypeError(f"expected true or false, got {value!r}")
    if hint in (int, float):
        if isinstance(value, bool):
            raise TypeError(f"expected a number, got {value!r}")
        try:
            number = float(value) if isinstance(value, str) else value
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
        if not isinstance(number, (int, float)):
            raise TypeError(f"expected a number, got {value!r}")
        if hint is int and float(number) != int(number):
            raise ValueError(f"expected a whole number, got {value!r}")
        return hint(number)
    if hint is str:
        if isinstance(value, (dict, list)):
            raise TypeError(f"expected a string, got {value!r}")
        return str(value)
    return value  # enums, lists and dicts: the consumer (TrainingArguments) validates them


def _conflicts(config: StageConfig) -> list[str]:
    problems = []
    ft, data = config.finetuning, config.data
    if ft.finetuning_type == "lora" and ft.lora_rank <= 0:
        problems.append(f"'lora_rank' must be positive, got {ft.lora_rank}.")
    if not 0 <= ft.lora_dropout < 1:
        problems.append(f"'lora_dropout' must be in [0, 1), got {ft.lora_dropout}.")
    if data.cutoff_len <= 0:
        problems.append(f"'cutoff_len' must be positive, got {data.cutoff_len}.")
    if data.val_size < 0:
        problems.append(f"'val_size' must be a share in [0, 1) or a row count, got {data.val_size}.")
    if data.neat_packing and data.packing is False:
        problems.append("'neat_packing: true' needs packing; remove 'packing: false'.")
    if config.export.export_legacy_format:
        problems.append("'export_legacy_format: true' would write pickle weights; only safetensors is written.")
    if config.model.quantization_bit not in (None, 4, 8):
        problems.append(f"'quantization_bit' must be 4 or 8, got {config.model.quantization_bit}.")
    if data.interleave_probs and data.mix_strategy == "concat":
        problems.append("'interleave_probs' needs 'mix_strategy: interleave_under' or 'interleave_over'.")
    if data.interleave_probs and data.dataset:
        probs, names = data.interleave_probs.split(","), data.dataset.split(",")
        if len(probs) != len(names):
            problems.append(f"'interleave_probs' has {len(probs)} values for {len(names)} datasets; give one per dataset.")
    return problems


# What this version parses (so LLaMA-Factory configs load) but cannot train yet, by key.
_NOT_TRAINABLE_YET = {
    "export_quantization_bit": lambda c: c.export.export_quantization_bit is not None and "export_quantization_bit",
}


def unsupported_for_training(config: StageConfig) -> list[str]:
    """Settings that parse but that this version cannot train with, each named, for a ConfigError."""
    named = [check(config) for check in _NOT_TRAINABLE_YET.values()]
    return [f"{what} is recognised but not supported for training in this version; remove it or choose another setting."
            for what in named if what]
