"""What a worker imports before its job exists, and what it keeps out of its process.

`tuneline train` starts its single worker before it tokenizes, so the worker's imports (seconds of
torch, transformers, peft and TRL) run while the data is tokenized instead of after it.

peft imports bitsandbytes whenever it is installed, and bitsandbytes compiles kernels through
torch.compile as it is imported, seconds of start-up that only quantized models and bitsandbytes'
optimizers use. A job that uses neither keeps it out: Python treats a module set to None in
`sys.modules` as absent, so peft and transformers go on as if it were not installed.

Keeping it out must not break a package that imports it outright (galore-torch and apollo-torch
import bitsandbytes' optimizers with their own), so a job also keeps it when a package its
optimizer keys import requires bitsandbytes, as that package's installed metadata says.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterable, Mapping
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.training.optimizers.rules import DEFAULT_OPTIM, optimizer_packages

# Every kind trains through these; TRL's trainers come with the kinds that use them (`StageKind.trainer_modules`).
COMMON_MODULES = ("torch", "datasets", "transformers.trainer", "peft", "tuneline.core.worker.run")
# transformers' `optim` values it steps with torch alone; the others import a package (bitsandbytes for the
# 8-bit, paged, Lion and AdEMAMix ones; galore-torch and apollo-torch, which import it, for galore_*/apollo_*).
TORCH_OPTIMS = frozenset({"adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop"})
BITSANDBYTES = "bitsandbytes"

if TYPE_CHECKING:
    from tuneline.core.training.job import TrainJob


def job_needs_bitsandbytes(job: TrainJob) -> bool:
    """`needs_bitsandbytes` for a job, over the models it loads: the one it starts from, its reference
    and its reward model."""
    return needs_bitsandbytes(model=job.model, training=job.training, finetuning=job.finetuning, optimizer=job.optimizer,
                              model_paths=[job.model_path, job.finetuning.get("ref_model"), job.finetuning.get("reward_model")])


def needs_bitsandbytes(*, model: Mapping[str, Any], training: Mapping[str, Any], finetuning: Mapping[str, Any],
                       optimizer: Mapping[str, Any], model_paths: Iterable[str | None]) -> bool:
    """Whether training may import bitsandbytes: `quantization_bit` (or `ref_model_quantization_bit`,
    `reward_model_quantization_bit`), an `optim` outside TORCH_OPTIMS, an optimizer key whose package
    requires it, or a model among `model_paths` that is not a local folder whose config.json says it
    is unquantized."""
    if any(requires_bitsandbytes(package) for package in optimizer_packages(optimizer)):
        return True
    if model.get("quantization_bit") is not None:
        return True
    if any(finetuning.get(key) is not None for key in ("ref_model_quantization_bit", "reward_model_quantization_bit")):
        return True
    if str(training.get("optim") or DEFAULT_OPTIM) not in TORCH_OPTIMS:
        return True
    return any(not _unquantized_folder(path) for path in model_paths if path)


def _unquantized_folder(path: str, *, depth: int = 0) -> bool:
    """A local model folder whose config.json has no quantization_config, or an adapter folder (a
    LoRA reward model, say) whose base model is one."""
    folder = Path(path)
    try:
        if not (folder / "config.json").is_file() and (folder / "adapter_config.json").is_file() and depth < 4:
            adapter = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
            base = adapter.get("base_model_name_or_path") if isinstance(adapter, dict) else None
            return isinstance(base, str) and _unquantized_folder(base, depth=depth + 1)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # a hub name or an unreadable folder: let bitsandbytes load in case it is quantized
    return isinstance(config, dict) and "quantization_config" not in config


@lru_cache
def requires_bitsandbytes(distribution: str) -> bool:
    """Whether the installed distribution `distribution` (a name, or the import name of a package
    installed under it) requires bitsandbytes, itself or through what it requires, leaving out the
    requirements of its extras. A package that is not installed requires nothing."""
    return _requires(distribution, BITSANDBYTES, seen=set())


def _requires(distribution: str, wanted: str, *, seen: set[str]) -> bool:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    name = canonicalize_name(distribution)
    if name == wanted:
        return True
    if name in seen:
        return False
    seen.add(name)
    try:
        requirements = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return False
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement, or one for another platform
        if _requires(requirement.name, wanted, seen=seen):
            return True
    return False


def keep_out_bitsandbytes() -> None:
    """Make `import bitsandbytes` fail in this process, unless something already imported it."""
    sys.modules.setdefault(BITSANDBYTES, None)  # type: ignore[arg-type]


def preload(modules: Iterable[str]) -> None:
    """Import COMMON_MODULES, then `modules`, so the job finds them loaded."""
    for name in (*COMMON_MODULES, *modules):
        importlib.import_module(name)
