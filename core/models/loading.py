"""Loading tokenizers and models, and making the chosen parameters trainable.

Local folders load as they are; anything else is treated as a hub id, which needs the network:
offline, the failure names the id and says how to point at a local folder instead; `hf_hub_token`
is the token of every hub download. Weights load from safetensors only, unless
`allow_pickle_weights` trusts pickle (.bin) files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError
from tuneline.core.models.adapters import (
    ADAPTER_CONFIG,
    adapter_paths,
    apply_adapter,
    linear_module_names,
    load_adapter,
    loraplus_optimizer,
)
from tuneline.core.models.config_patches import patch_config
from tuneline.core.models.folders import model_folder_problem, tokenizer_folder_problem
from tuneline.core.models.freeze import apply_freeze, apply_full
from tuneline.core.models.preparation import prepare_for_training, print_parameter_status
from tuneline.core.models.pretrained import (
    KEY,
    check_weights_format,
    first_line,
    from_pretrained_checked,
    load_config,
    unreachable_model_message,
)
from tuneline.core.models.quantization import keep_4bit_layout_for_training, quantization_config
from tuneline.core.models.scoring_class import scoring_class
from tuneline.core.models.shifted_attention import use_shifted_sparse_attention
from tuneline.core.models.vocabulary import grow_vocabulary

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["apply_finetuning", "count_parameters", "linear_module_names", "load_model", "load_reward_model", "load_tokenizer",
           "loraplus_optimizer", "method_problems", "trainable_summary"]

# The model class on the backbone: a causal LM, or a one-output scoring head (sequence classification).
Head = Literal["causal_lm", "score"]
# LLaMA-Factory's `flash_attn` values and the attention implementation transformers calls them.
ATTENTION = {"auto": None, "disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2"}
ADAPTER_TYPES = ("lora", "oft")  # the finetuning types that train (and save) a peft adapter


def load_tokenizer(path: str | Path, *, model: ModelConfig | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer at `path`; given `model`, with its `split_special_tokens` (which a saved
    tokenizer keeps, so one loaded without `model` splits as it did when saved)."""
    from transformers import AutoTokenizer

    splitting = {"split_special_tokens": model.split_special_tokens} if model is not None else {}
    model = model or ModelConfig()
    local = Path(path).is_dir()
    problem = tokenizer_folder_problem(Path(path), key=KEY, trust_remote_code=model.trust_remote_code) if local else None
    if problem:
        raise ConfigError(problem)
    try:
        return AutoTokenizer.from_pretrained(
            str(path),
            use_fast=model.use_fast_tokenizer,
            trust_remote_code=model.trust_remote_code,
            revision=model.model_revision,
            cache_dir=model.cache_dir,
            **splitting,
            token=model.hf_hub_token,
        )
    except OSError as e:
        raise ConfigError(unreachable_model_message(KEY, path)) from e
    except Exception as e:  # tokenizers, sentencepiece and transformers each raise their own kinds for a bad file
        if not local:
            raise
        raise ConfigError(f"'{KEY}: {path}' holds a tokenizer that cannot be loaded ({first_line(e)}); copy the "
                          "tokenizer's files into it again from where they came from.") from e


def load_model(
    path: str | Path,
    *,
    model: ModelConfig | None = None,
    vocab_size: int | None = None,
    training: Mapping[str, Any] | None = None,
    head: Head = "causal_lm",
    trainable: bool = False,
    model_max_length: int | None = None,
    use_kv_cache: bool = True,
    pure_bf16: bool = False,
) -> PreTrainedModel:
    """The model at `path` in the compute dtype, with the chosen attention, quantized when asked, its
    embeddings grown to `vocab_size` if larger (`core/models/vocabulary.py`): a causal LM (policies and references), or with
    `head="score"` the same backbone with a one-output scoring head (reward models; the head is new
    and random unless `path` saved one). Both pass the same checks (pickle weights, remote code).
    A folder whose config records Mixture-of-Depths routing loads with its routers.

    Its config gets `rope_scaling` for `model_max_length` (None: for inference), and when `trainable`
    (the model a stage trains) the router loss of `moe_aux_loss_coef` and no KV cache (otherwise
    the cache as `use_kv_cache` says); with `train_from_scratch` a trainable model starts from
    random weights of the same architecture. `pure_bf16` loads it in bfloat16 whatever the trainer keys say."""
    model = model or ModelConfig()
    local = Path(path).is_dir()
    problem = model_folder_problem(Path(path), key=KEY, trust_remote_code=model.trust_remote_code) if local else None
    if problem:
        raise ConfigError(problem)
    config = load_config(path, model, **({"num_labels": 1} if head == "score" else {}))
    routing = _routing_of_folder(config, path=path, asked=model.mixture_of_depths)
    patch_config(config, model, model_max_length=model_max_length, trainable=trainable, use_kv_cache=use_kv_cache)
    dtype = compute_dtype(training or {}, config=config, pure_bf16=pure_bf16)
    quantization = quantization_config(model, compute_dtype=dtype)
    check_weights_format(path, model)
    model_class = scoring_class(config) if head == "score" else generating_class(config)
    if trainable and model.train_from_scratch:
        return _resized(model_class.from_config(config, dtype=dtype, attn_implementation=attention_implementation(
            model.flash_attn), trust_remote_code=model.trust_remote_code), vocab_size)
    loaded = from_pretrained_checked(model_class, path, config=config, model=model, dtype=dtype,
                                     attention=attention_implementation(model.flash_attn), quantization=quantization,
                                     new_head=head == "score", routing=routing)
    if routing is not None:
        from tuneline.core.models.mixture_of_depths import restore_routing

        restore_routing(loaded, Path(path))
    if getattr(loaded, "hf_quantizer", None) is not None:  # set by transformers on quantized models only
        keep_4bit_layout_for_training(loaded)
    return _resized(loaded, vocab_size)


def generating_class(config: PretrainedConfig) -> type:
    """transformers' auto class of a model that writes text: a causal LM, or for a vision-language
    family (Qwen2-VL, ...) the image-text-to-text class, whose model reads pixels as well, or for an
    audio-language family (Qwen2-Audio) the multimodal LM class, whose model reads sound."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForMultimodalLM

    if getattr(config, "vision_config", None) is not None and type(config) in AutoModelForImageTextToText._model_mapping:
        return AutoModelForImageTextToText  # Mllama's config maps to a text-only causal LM too, which drops its tower
    if type(config) in AutoModelForCausalLM._model_mapping:
        return AutoModelForCausalLM
    for auto_class in (AutoModelForImageTextToText, AutoModelForMultimodalLM):
        if type(config) in auto_class._model_mapping:
            return auto_class
    return AutoModelForCausalLM


def _resized(model: PreTrainedModel, vocab_size: int | None) -> PreTrainedModel:
    if vocab_size is not None:
        grow_vocabulary(model, vocab_size=vocab_size)
    return model


def _routing_of_folder(config: PretrainedConfig, *, path: str | Path, asked: str | None) -> Mapping[str, Any] | None:
    """The Mixture-of-Depths routing `path` records (loaded with its routers whether or not
    `mixture_of_depths: load` says so), checked against what the key asks for."""
    from tuneline.core.models.mixture_of_depths import RECORD, routing_record

    routing = routing_record(config)
    if asked == "load" and routing is None:
        raise ConfigError(f"'mixture_of_depths: load' reads a Mixture-of-Depths model, and '{KEY}: {path}' is an ordinary "
                          f"one (its config.json has no '{RECORD}' entry); convert it with 'mixture_of_depths: convert' "
                          "and 'finetuning_type: full', or remove the key.")
    if asked == "convert" and routing is not None:
        raise ConfigError(f"'mixture_of_depths: convert' was given '{KEY}: {path}', which is already a Mixture-of-Depths "
                          "model; set 'mixture_of_depths: load' to train it further.")
    return routing


def load_reward_model(
    path: str | Path, *, base_model: str | Path | None = None, model: ModelConfig | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A trained reward model (a stage rm output) and its tokenizer, in eval mode.

    `path` holds full weights, or a LoRA adapter whose base is `base_model` (default: the base
    recorded in the adapter's config). `model` holds the rm stage's model settings: the adapters its
    `adapter_name_or_path` lists were merged into the base before training, and are merged again
    here, then the reward adapter. With `quantization_bit` the base loads quantized and the reward
    adapter stays unmerged on it (merging into quantized weights loses precision).
    """
    folder = Path(path)
    model = model or ModelConfig()
    tokenizer = load_tokenizer(folder, model=model)
    if (folder / ADAPTER_CONFIG).is_file():
        from peft import PeftConfig, PeftModel

        base = base_model or PeftConfig.from_pretrained(str(folder)).base_model_name_or_path
        reward = load_model(base, model=model, vocab_size=len(tokenizer), head="score")
        for adapter in adapter_paths(model):
            reward = load_adapter(reward, adapter, model_config=model, trainable=False, any_task=True).merge_and_unload()
        reward = PeftModel.from_pretrained(reward, str(folder))
        if model.quantization_bit is None:
            reward = reward.merge_and_unload()
    else:
        reward = load_model(folder, model=model, vocab_size=len(tokenizer), head="score")
    reward.config.get_text_config().pad_token_id = tokenizer.pad_token_id  # the head reads the last other token
    return reward.eval(), tokenizer


def compute_dtype(training: Mapping[str, Any], *, config: PretrainedConfig, pure_bf16: bool = False) -> torch.dtype:
    """bfloat16 with `pure_bf16` (on a CPU too: torch computes in bfloat16 there) or when the `bf16`
    training key asks for it, float16 for `fp16`; otherwise float32 on a CPU, and on a GPU the half
    precision the model was saved in (float16 where the GPU lacks bfloat16), float32 for a float32 model."""
    import torch

    if pure_bf16 or training.get("bf16"):
        return torch.bfloat16
    if training.get("fp16"):
        return torch.float16
    if not torch.cuda.is_available():
        return torch.float32
    saved = config.dtype
    if saved in (torch.bfloat16, "bfloat16") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if saved in (torch.bfloat16, "bfloat16", torch.float16, "float16"):
        return torch.float16
    return torch.float32


def attention_implementation(flash_attn: str) -> str | None:
    """transformers' `attn_implementation` for `flash_attn` (None lets transformers choose)."""
    from transformers.utils import is_flash_attn_2_available

    if flash_attn == "fa2" and not is_flash_attn_2_available():
        raise ConfigError(
            "'flash_attn: fa2' needs the flash-attn package (2.3.3 or newer) and a CUDA GPU, and this machine has "
            "not both; install flash-attn on a GPU machine, or choose 'flash_attn: sdpa' or 'auto'."
        )
    return ATTENTION[flash_attn]


def apply_finetuning(
    model: PreTrainedModel,
    finetuning: FinetuningConfig,
    *,
    model_config: ModelConfig | None = None,
    training: Mapping[str, Any] | None = None,
    head: str | None = None,
    upcast: bool = True,
    new_token_rows: Sequence[int] = (),
) -> PreTrainedModel:
    """Make the chosen parameters trainable (LoRA, OFT, freeze or full) in float32; refuse a setup in
    which the method would train nothing. `upcast=False` leaves them in the loaded dtype, for BAdam,
    which keeps float32 copies of the block it trains itself, and for `pure_bf16`, which trains the
    bfloat16 weights themselves (as LLaMA-Factory leaves them in both).

    `head` names a sequence classifier's scoring head, which trains in full whatever the method:
    with an adapter it is saved inside a new adapter (see `apply_adapter`), otherwise it is unfrozen.
    `new_token_rows`, the embedding rows of added tokens, train and are saved with an adapter; the
    other methods train them with the embeddings or not at all, as they train those.
    """
    model_config = model_config or ModelConfig()
    problems = method_problems(model_config, finetuning)
    if problems:
        raise ConfigError(problems)
    prepare_for_training(model, model_config, training or {})
    if model_config.mixture_of_depths == "convert":
        from tuneline.core.models.mixture_of_depths import convert_to_mixture_of_depths

        convert_to_mixture_of_depths(model)
    if model_config.shift_attn:
        use_shifted_sparse_attention(model)
    methods = {
        "lora": lambda: apply_adapter(model, finetuning, model_config=model_config, head=head, new_token_rows=new_token_rows),
        "oft": lambda: apply_adapter(model, finetuning, model_config=model_config, head=head, new_token_rows=new_token_rows),
        "freeze": lambda: apply_freeze(model, finetuning),
        "full": lambda: apply_full(model, finetuning),
    }
    model = methods[finetuning.finetuning_type]()
    if count_parameters(model)[0] == 0:
        raise ConfigError(_nothing_trainable_message(model, finetuning))
    if head is not None and finetuning.finetuning_type not in ADAPTER_TYPES:
        model.get_submodule(head).requires_grad_(True)
    if upcast:
        upcast_trainable(model)
    if model_config.print_param_status:
        print_parameter_status(model)
    return model


def method_problems(model: ModelConfig, finetuning: FinetuningConfig) -> list[str]:
    """Settings that cannot train together (LLaMA-Factory refuses the same), one line each."""
    problems = []
    lora = finetuning.finetuning_type == "lora"
    adapter = finetuning.finetuning_type in ADAPTER_TYPES
    bits = model.quantization_bit
    adapters = adapter_paths(model)
    if bits is not None and not adapter:
        problems.append(f"'quantization_bit: {bits}' trains LoRA or OFT adapters only (quantized weights cannot be "
                        "updated); set 'finetuning_type: lora' or 'oft', or remove quantization_bit.")
    if bits is not None and lora and finetuning.pissa_init:
        problems.append("'pissa_init: true' needs the full-precision base (PiSSA rewrites it from its singular vectors), "
                        f"so it cannot start from 'quantization_bit: {bits}'; remove one of the two.")
    if adapters and not adapter:
        problems.append(f"'adapter_name_or_path' is only for 'finetuning_type: lora' or 'oft', not '{finetuning.finetuning_type}'; "
                        "merge the adapter into the base with `tuneline export` and train that model.")
    if bits is not None and len(adapters) > 1:
        problems.append(f"'adapter_name_or_path' lists {len(adapters)} adapters, but a quantized base takes one "
                        "(merging into quantized weights loses precision); merge them into the base first.")
    if bits is not None and adapters and finetuning.create_new_adapter:
        problems.append("'create_new_adapter: true' merges the adapter into the base, which a quantized base cannot take; "
                        "remove create_new_adapter to continue the adapter, or remove 'quantization_bit'.")
    if model.shift_attn and model.flash_attn == "fa2":
        problems.append("'shift_attn: true' runs its groups through PyTorch's SDPA, not FlashAttention-2; "
                        "remove 'flash_attn: fa2' or shift_attn.")
    ratio = finetuning.loraplus_lr_ratio
    if ratio is not None and (not lora or ratio <= 0):
        problems.append(f"'loraplus_lr_ratio: {ratio}' needs 'finetuning_type: lora' and a positive ratio "
                        "(typically 16); fix it or remove the key.")
    return problems


def upcast_trainable(model: PreTrainedModel) -> None:
    """Trainable parameters in float32, the frozen ones as loaded: half-precision master weights
    lose small updates and the fp16 gradient scaler refuses them (LLaMA-Factory does the same)."""
    import torch

    for parameter in model.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.to(torch.float32)


def count_parameters(model: PreTrainedModel) -> tuple[int, int]:
    """(trainable, all) parameters, 4-bit weights counted as the values they hold."""
    trainable = sum(_value_count(p) for p in model.parameters() if p.requires_grad)
    return trainable, sum(_value_count(p) for p in model.parameters())


def _value_count(parameter: torch.nn.Parameter) -> int:
    if type(parameter).__name__ == "Params4bit":  # bitsandbytes packs two 4-bit values per byte of storage
        return parameter.numel() * 2 * parameter.element_size()
    return parameter.numel()


def trainable_summary(model: PreTrainedModel) -> str:
    trainable, total = count_parameters(model)
    return f"trainable params: {trainable:,} || all params: {total:,} || trainable%: {100 * trainable / total:.4f}"


def _nothing_trainable_message(model: PreTrainedModel, finetuning: FinetuningConfig) -> str:
    if finetuning.finetuning_type == "freeze":
        extras = finetuning.freeze_extra_modules
        extra = f"'freeze_extra_modules: {extras}'" if extras else "no freeze_extra_modules"
        return (f"no parameter is trainable with 'freeze_trainable_layers: {finetuning.freeze_trainable_layers}' and {extra}; "
                "set freeze_trainable_layers to a non-zero number of layers or name modules in freeze_extra_modules.")
    return (f"no parameter is trainable with finetuning_type '{finetuning.finetuning_type}' and lora_target "
            f"'{finetuning.lora_target}'; modules available: {', '.join(linear_module_names(model))}.")


