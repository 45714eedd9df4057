"""Single-stage commands (`tuneline train`, `data preprocess`, `export`) on core alone.

They need no Prefect server: a LLaMA-Factory user's YAML runs as one stage, with its
tokenized data cached by content key under `$TUNELINE_CACHE` (default ~/.cache/tuneline).
The job, the tokenized-data cache and the merge/export path are the pipeline's own
(`core.pipeline.stage_runs`); only where the files go differs.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

from tuneline.core.config import StageConfig, cache_root, trains
from tuneline.core.data.dataset_info import get_dataset_attrs
from tuneline.core.data.media.columns import MEDIA_COLUMNS
from tuneline.core.data.tokenization import TEMPLATE_WARNING_FILE, TOKENIZER_DIR, dataset_fingerprints, dataset_names, render_preview
from tuneline.core.errors import ConfigError
from tuneline.core.models.gptq import gptq_machine_problems
from tuneline.core.pipeline.spec import TrainingStage
from tuneline.core.pipeline.stage_runs import TEMPLATE_WARNING, cached_tokenized_data, export_folder, train_job
from tuneline.core.pipeline.tokenized_folders import (
    holds_files,
    ignored_settings,
    load_tokenized,
    save_tokenized,
    saved_counters,
    write_record,
)
from tuneline.core.stages.ignored_keys import datasets_map_media, ignored_keys
from tuneline.core.stages.registry import load_stage_config, tokenize_stage_data
from tuneline.core.store.artifacts import Artifact
from tuneline.core.store.cache import Damage
from tuneline.core.store.fingerprints import tree_fingerprint
from tuneline.core.store.user_folders import write_user_folder
from tuneline.core.training.checkpoints import CHECKPOINT_PREFIX, RECORD_FILE
from tuneline.core.training.job import LOG_FILE
from tuneline.core.worker.launch import JOB_FILE, launch_plan, launch_training, on_ray, prepare_job, warm_up, worker_started_ahead
from tuneline.core.worker.preload import needs_bitsandbytes

NO_ADVICE = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "chat_template.jinja", "preprocessor_config.json",
                   "processor_config.json")


def train_stage(config_path: str, overrides: list[str]) -> dict[str, float]:
    config = load_stage_config(config_path, overrides)
    warn_of_ignored_keys(config)
    # a prediction config (do_predict without do_train) reads only its predict set
    _require(config, ("model_name_or_path", "dataset", "output_dir") if trains(config.training) else
             ("model_name_or_path", "output_dir"), source=config_path)
    output_dir = Path(config.training["output_dir"])
    # the launch variables (NPROC_PER_NODE, ...) and the DeepSpeed/FSDP settings are checked, once, before any work;
    # the job is complete once its data is tokenized
    plan = launch_plan(os.environ)
    job = train_job(config, start_model=config.model.model_name_or_path, dataset_path="", output_dir=str(output_dir),
                    training=config.training, overwrite_output_dir=config.output.overwrite_output_dir)
    try:
        job = prepare_job(job, plan)
    except ConfigError as e:
        raise ConfigError(e.problems, source=config_path) from e
    saved = config.data.tokenized_path and holds_files(Path(config.data.tokenized_path))
    _check_output_dir(output_dir, overwrite=config.output.overwrite_output_dir)
    ft = config.finetuning
    without_bitsandbytes = not needs_bitsandbytes(model=dataclasses.asdict(config.model), training=config.training,
                                                  finetuning=dataclasses.asdict(ft), optimizer=dataclasses.asdict(config.optimizer),
                                                  model_paths=[config.model.model_name_or_path, ft.ref_model, ft.reward_model])
    # the worker imports while we tokenize: the process's warm worker (a later train in this process, as in a
    # notebook, starts at once), or for a job that needs bitsandbytes a worker started ahead for it alone
    ray = on_ray(job)  # trains in Ray's workers, none of this machine's
    warm = without_bitsandbytes and not ray and warm_up()
    with (nullcontext() if warm or ray else worker_started_ahead(ft.stage, without_bitsandbytes=without_bitsandbytes) as worker,
          ExitStack() as reading):  # the cached tokenized data stays out of `tuneline gc`'s reach until training ends
        # every dataset entry and file checked before any model loads (a saved tokenized dataset reads none)
        fingerprints = None if saved else dataset_fingerprints(config)
        with _torch_left_to_the_worker(config):
            tokenized = training_data(config, fingerprints=fingerprints, reading=reading)
        return launch_training(dataclasses.replace(job, dataset_path=str(tokenized)), started=worker, plan=plan)


def warn_of_ignored_keys(config: StageConfig) -> None:
    """One line for each key the stage's kind does not read although it is set (it trains, as in LLaMA-Factory)."""
    for ignored in ignored_keys(config, maps_media=datasets_map_media(config)):
        print(f"warning: {ignored.line}", flush=True)


@contextmanager
def _torch_left_to_the_worker(config: StageConfig) -> Iterator[None]:
    """Tokenize text without importing torch in this process: transformers imports it with any tokenizer
    when it is installed (seconds of CPU that the worker, which trains, spends anyway). Python reads a
    module set to None in `sys.modules` as absent, so transformers loads its tokenizers alone; media
    rows keep torch, which their processors may need. Afterwards torch can be imported again."""
    names = dataset_names(config.data.dataset) + dataset_names(config.data.eval_dataset)
    media = any(set(attr.columns) & set(MEDIA_COLUMNS) for attr in get_dataset_attrs(names, config.data.dataset_dir))
    if media or "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    advice = os.environ.get(NO_ADVICE)
    os.environ[NO_ADVICE] = "1"  # transformers' notice that models are unavailable without torch is not for this process
    try:
        yield
    finally:
        if sys.modules.get("torch", False) is None:
            del sys.modules["torch"]
        if advice is None:
            os.environ.pop(NO_ADVICE, None)
        else:
            os.environ[NO_ADVICE] = advice


def training_data(config: StageConfig, *, fingerprints: dict[str, str] | None = None, reading: ExitStack | None = None) -> Path:
    """The tokenized data a run trains on. With `tokenized_path`, as in LLaMA-Factory: a folder with
    files in it is loaded (checked to be one tuneline saved for this stage, tokenizer and template)
    and the datasets are not read; an empty or missing one receives a copy of the tokenized data,
    and the run goes on to train on it."""
    saved = Path(config.data.tokenized_path) if config.data.tokenized_path else None
    if saved is None:
        return tokenized_dataset(config, fingerprints=fingerprints, reading=reading)
    tokenizer_key = tokenizer_fingerprint(config.model.model_name_or_path)
    if holds_files(saved):
        load_tokenized(saved, config=config, tokenizer_key=tokenizer_key)
        ignored = ignored_settings(saved, config)
        print(f"tokenize: loaded the tokenized dataset of tokenized_path {saved}; the data settings it was saved with "
              "hold" + (f" (this config's {', '.join(ignored)} differ and are not used)" if ignored else ""), flush=True)
        return saved
    save_tokenized(saved, tokenized=tokenized_dataset(config, fingerprints=fingerprints, reading=reading), config=config,
                   tokenizer_key=tokenizer_key)
    print(f"tokenize: saved the tokenized dataset to tokenized_path {saved}; a run with the same tokenized_path loads it "
          "and skips tokenizing", flush=True)
    return saved


def tokenized_dataset(config: StageConfig, *, fingerprints: dict[str, str] | None = None,
                      reading: ExitStack | None = None) -> Path:
    """The config's datasets tokenized (from the content-keyed cache when present and sound);
    `fingerprints`, the datasets' digests if already computed, saves hashing them twice; with
    `reading`, `tuneline gc` keeps the cached artifact until that stack closes."""
    model_path = config.model.model_name_or_path
    stage = TrainingStage(name=config.finetuning.stage, parent=None, config=config)
    artifact = cached_tokenized_data(cache_root(), stage, tokenizer_path=model_path, tokenizer_key=tokenizer_fingerprint(model_path),
                                     fingerprints=fingerprints, on_damaged=_announce_damage,
                                     on_hit=_announce_template_warning, reading=reading)
    return artifact.path


def _announce_template_warning(artifact: Artifact) -> None:
    """Tokenizing warns of a template mismatch; data served from the cache repeats it from its manifest."""
    if artifact.manifest.get(TEMPLATE_WARNING):
        print(f"tokenize: {artifact.manifest[TEMPLATE_WARNING]}", flush=True)


def _announce_damage(damage: Damage) -> None:
    print(f"tokenize: cached artifact {damage.path} is damaged ({damage.reason}); recomputing", flush=True)


def preprocess(config_path: str, overrides: list[str], *, output: str) -> dict[str, int]:
    """Tokenize into `output`: a folder of other files is refused unless overwrite_output_dir, and
    even then only what an earlier preprocess wrote there is replaced."""
    config = load_stage_config(config_path, overrides)
    _require(config, ("model_name_or_path", "dataset"), source=config_path)
    warn_of_ignored_keys(config)
    counters: dict[str, int] = {}

    def write(draft: Path) -> None:
        counters.update(tokenize_stage_data(config, tokenizer_path=config.model.model_name_or_path, output_dir=draft))
        write_record(draft, config, tokenizer_key=tokenizer_fingerprint(config.model.model_name_or_path), counters=counters)

    write_user_folder(output, write, key="--output", overwrite=config.output.overwrite_output_dir)
    return counters


def preview(config_path: str, overrides: list[str], *, count: int) -> str:
    """The first `count` training examples, trained tokens in [[brackets]], and the counters: of the
    dataset saved in `tokenized_path` where that folder holds one (what training would load), else of
    the config's datasets tokenized (through the cache; preview never writes `tokenized_path`)."""
    from datasets import load_from_disk

    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.store.artifacts import read_manifest

    config = load_stage_config(config_path, overrides)
    saved = Path(config.data.tokenized_path) if config.data.tokenized_path else None
    if saved is not None and holds_files(saved):
        _require(config, ("model_name_or_path",), source=config_path)
        tokenized = load_tokenized(saved, config=config, tokenizer_key=tokenizer_fingerprint(config.model.model_name_or_path))
        warning_file = saved / TEMPLATE_WARNING_FILE
        manifest = {"metrics": saved_counters(saved),
                    TEMPLATE_WARNING: warning_file.read_text(encoding="utf-8").strip() if warning_file.is_file() else None}
    else:
        _require(config, ("model_name_or_path", "dataset"), source=config_path)
        tokenized = tokenized_dataset(config)
        manifest = read_manifest(tokenized)
    tokenizer = load_tokenizer(tokenized / TOKENIZER_DIR)
    train = load_from_disk(str(tokenized))["train"]
    blocks = []
    for index in range(min(count, len(train))):
        example = train[index]
        trained = sum(1 for label in example["labels"] if label != -100)
        # where each image's, video's and sound's tokens came from
        shown = "".join(f"{column}: {', '.join(example[column])}\n" for column in MEDIA_COLUMNS if example.get(column))
        blocks.append(f"--- example {index}: {len(example['input_ids'])} tokens, {trained} trained [[like this]]\n"
                      + shown + render_preview(example, tokenizer).split("\n\n", 1)[1])
    if manifest.get(TEMPLATE_WARNING):
        blocks.append(f"template warning: {manifest[TEMPLATE_WARNING]}")
    blocks.append("counters: " + ", ".join(f"{k}={v}" for k, v in sorted(manifest["metrics"].items())))
    return "\n".join(blocks)


def export(config_path: str, overrides: list[str]) -> Path:
    import torch

    config = load_stage_config(config_path, overrides)
    _require(config, ("model_name_or_path", "export_dir"), source=config_path)
    problems = gptq_machine_problems(config.export, has_cuda=torch.cuda.is_available)  # before any work
    if problems:
        raise ConfigError(problems, source=config_path)
    return export_folder(config)


def tokenizer_fingerprint(model_path: str) -> str:
    path = Path(model_path)
    if not path.is_dir():
        return f"hub-{model_path}"
    return tree_fingerprint([path / name for name in TOKENIZER_FILES if (path / name).is_file()])


def _require(config: StageConfig, keys: tuple[str, ...], *, source: str) -> None:
    flat = config.flat()
    missing = [k for k in keys if not flat.get(k)]
    if missing:
        raise ConfigError([f"'{k}' is required for this command." for k in missing], source=source)


def _check_output_dir(output_dir: Path, *, overwrite: bool) -> None:
    """Refuse to mix a new run into a folder of other files; checkpoints mean resume (docs/ARCHITECTURE.md, "Interfaces").

    A run killed before its first checkpoint leaves only its job and log; rerun, it starts over.
    """
    if not output_dir.is_dir():
        return
    if overwrite:
        _check_foreign_checkpoints(output_dir)
        return
    entries = [p.name for p in output_dir.iterdir()]
    restartable = {JOB_FILE, LOG_FILE}
    if set(entries) - restartable and not any(name.startswith(CHECKPOINT_PREFIX) for name in entries):
        raise ConfigError(
            f"output_dir {output_dir} already holds files ({', '.join(sorted(entries)[:5])}) and no checkpoint "
            "to resume from; choose an empty output_dir or set 'overwrite_output_dir: true'."
        )


def _check_foreign_checkpoints(output_dir: Path) -> None:
    """Starting over removes the old checkpoints, so each must be one tuneline wrote (it carries
    tuneline's record file); a checkpoint of another tool, or one cut short, is the user's to move."""
    foreign = sorted(p.name for p in output_dir.glob(f"{CHECKPOINT_PREFIX}*") if p.is_dir() and not (p / RECORD_FILE).is_file())
    if foreign:
        raise ConfigError(
            f"output_dir {output_dir} holds {', '.join(foreign[:5])}, which tuneline did not write (no {RECORD_FILE}), and "
            "'overwrite_output_dir: true' starts over by removing old checkpoints; move them out of the folder, choose "
            "another output_dir, or remove overwrite_output_dir to resume from them."
        )
