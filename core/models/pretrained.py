"""Hugging Face's `from_pretrained` for the folders and hub ids `model_name_or_path` names, its failures
as ConfigErrors that name the key and the fix (an unreachable id, pickle weights, damaged files)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.config import ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.models.adapters import pickle_weights_message
from tuneline.core.models.quantization import prequantized_method, prequantized_support_message, quantized_device_map

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

KEY = "model_name_or_path"  # the key that names the folders loaded here, for messages
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def from_pretrained_checked(model_class: Any, path: str | Path, *, config: PretrainedConfig, model: ModelConfig,
                            dtype: torch.dtype, attention: str | None, quantization: Any, new_head: bool,
                            routing: Mapping[str, Any] | None) -> PreTrainedModel:
    """`model_class.from_pretrained` with `config`, each way it can fail on a folder or a hub id a
    ConfigError naming `model_name_or_path` and the fix; `new_head`: a scoring head the weights lack."""
    local = Path(path).is_dir()
    try:
        with _new_head_expected(new_head), _routers_expected(routing):
            return model_class.from_pretrained(
                str(path),
                config=config,
                dtype=dtype,
                attn_implementation=attention,
                quantization_config=quantization,
                device_map=quantized_device_map() if quantization else None,
                trust_remote_code=model.trust_remote_code,
                revision=model.model_revision,
                cache_dir=model.cache_dir,
                token=model.hf_hub_token,
                use_safetensors=None if model.allow_pickle_weights else True,
            )
    except ImportError as e:
        method = prequantized_method(config)
        if method is None:
            raise
        raise ConfigError(prequantized_support_message(KEY, path, method=method, missing=e)) from e
    except OSError as e:
        if "safetensors" in str(e) and not Path(path).is_dir():
            raise ConfigError(f"'model_name_or_path: {path}' has no safetensors weights on the Hugging Face Hub, and "
                              "unpickling its other weights can run arbitrary code; set 'allow_pickle_weights: true' "
                              "if you trust their source.") from e
        raise ConfigError(unreachable_model_message(KEY, path)) from e
    except ValueError as e:
        if not local:
            raise
        raise ConfigError(f"'{KEY}: {path}' holds a model that cannot be loaded ({first_line(e)}); copy its files "
                          "again from where they came from, or save the model again with save_pretrained.") from e
    except Exception as e:
        if not local or type(e).__name__ != "SafetensorError":  # safetensors' error for a damaged weights file
            raise
        raise ConfigError(f"'{KEY}: {path}' has weights that cannot be read ({first_line(e)}); the *.safetensors "
                          "file is cut short or damaged: copy it again, or save the model again.") from e


def _new_head_expected(new_head: bool):
    """A causal LM's weights lack the scoring head on purpose; transformers would warn that it is new."""
    if not new_head:
        return contextlib.nullcontext()
    from trl.trainer.reward_trainer import suppress_seqcls_warning

    return suppress_seqcls_warning()


def _routers_expected(routing: Mapping[str, Any] | None):
    """A routed model's router weights are not its class's own; transformers would report them as unexpected."""
    if routing is None:
        return contextlib.nullcontext()
    from tuneline.core.models.mixture_of_depths import quiet_router_report

    return quiet_router_report()


def load_config(path: str | Path, model: ModelConfig, **overrides: Any) -> PretrainedConfig:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=model.trust_remote_code,
                                          revision=model.model_revision, cache_dir=model.cache_dir,
                                          token=model.hf_hub_token, **overrides)
    except OSError as e:
        raise ConfigError(unreachable_model_message("model_name_or_path", path)) from e
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ConfigError(f"'{KEY}: {path}' ships its own model code, which runs only with "
                              "'trust_remote_code: true'; set it if you trust where the model comes from.") from e
        if not Path(path).is_dir():
            raise
        raise ConfigError(f"'{KEY}: {path}': config.json does not describe a model transformers knows ({first_line(e)}); "
                          "fix config.json or copy the model's files again.") from e


def check_weights_format(path: str | Path, model: ModelConfig) -> None:
    """Refuse a local folder whose only weights are pickle files, unless they are trusted."""
    folder = Path(path)
    if model.allow_pickle_weights or not folder.is_dir():
        return
    names = sorted(p.name for p in folder.iterdir())
    if any(name.endswith(".safetensors") for name in names):
        return
    pickled = [name for name in names if name.endswith(PICKLE_SUFFIXES)]
    if pickled:
        raise ConfigError(pickle_weights_message("model_name_or_path", path, pickled))


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def unreachable_model_message(key: str, path: str | Path) -> str:
    if Path(path).exists():
        return f"'{key}: {path}' is a folder without a loadable model or tokenizer (config.json, tokenizer files)."
    return (
        f"'{key}: {path}' is neither a local folder nor reachable on the Hugging Face Hub "
        "(offline, or the id is wrong); download it first or point the key at a local model folder."
    )
