"""GPTQ quantization of an export (`export_quantization_bit`), as LLaMA-Factory 0.9.5 does it.

transformers' `GPTQConfig` quantizes the model while it loads, layer by layer, on calibration
rows: `export_quantization_nsamples` windows of `export_quantization_maxlen` tokens, each cut at
a random place from a random row of `export_quantization_dataset` (a json/jsonl/csv/parquet/txt
file, or a hub dataset id, read with `datasets.load_dataset`) whose `text` is longer than that.
The rows are drawn with a fixed seed, so two exports of the same model quantize alike (LLaMA-
Factory draws them unseeded). The quantized model is saved in float16. It needs the `gptq` extra
(optimum and gptqmodel) and a CUDA GPU; `gptq_machine_problems` says so before any work.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.config import ExportConfig, ModelConfig
from tuneline.core.errors import ConfigError, DataError

if TYPE_CHECKING:
    from transformers import GPTQConfig, PreTrainedModel, PreTrainedTokenizerBase

GPTQ_PACKAGES = ("optimum", "gptqmodel")
# datasets' builder for each calibration file suffix
CALIBRATION_BUILDERS = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet", "txt": "text", "arrow": "arrow"}
MAX_DRAWS = 100  # rows drawn for one sample before giving up, as LLaMA-Factory does
SEED = 42


def gptq_machine_problems(export: ExportConfig, *, has_cuda: Callable[[], bool]) -> list[str]:
    """What this machine lacks for `export_quantization_bit`: the packages, then a CUDA GPU."""
    bit = export.export_quantization_bit
    if bit is None:
        return []
    asked = f"'export_quantization_bit: {bit}' (GPTQ quantization of the export)"
    missing = [name for name in GPTQ_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        return [f"{asked} needs the packages {' and '.join(missing)}, which are not installed; install the gptq extra "
                "(pip install -e \".[gptq]\") on a machine with a CUDA GPU, or remove the key."]
    if not has_cuda():
        return [f"{asked} runs GPTQModel's kernels on a CUDA GPU, and this machine has none; export on a CUDA machine, "
                "or remove the key to export in full precision."]
    return []


def calibration_samples(tokenizer: PreTrainedTokenizerBase, export: ExportConfig, model: ModelConfig) -> list[dict[str, Any]]:
    """`export_quantization_nsamples` token windows (`input_ids`, `attention_mask` as nested lists)."""
    rows = _calibration_texts(export.export_quantization_dataset, model)
    maxlen, draw = export.export_quantization_maxlen, random.Random(SEED)
    samples = []
    for _ in range(export.export_quantization_nsamples):
        for _ in range(MAX_DRAWS):
            ids = tokenizer(rows[draw.randrange(len(rows))], add_special_tokens=True)["input_ids"]
            if len(ids) > maxlen:
                break
        else:
            raise ConfigError(f"'export_quantization_dataset: {export.export_quantization_dataset}': no row drawn in "
                              f"{MAX_DRAWS} tries has more than 'export_quantization_maxlen: {maxlen}' tokens; lower "
                              "export_quantization_maxlen or give longer texts.")
        start = draw.randint(0, len(ids) - maxlen - 1)
        samples.append({"input_ids": [ids[start:start + maxlen]], "attention_mask": [[1] * maxlen]})
    return samples


def _calibration_texts(source: str | None, model: ModelConfig) -> list[str]:
    import datasets

    assert source is not None  # the config rules require it with export_quantization_bit
    suffix = Path(source).suffix.lstrip(".").lower()
    local = Path(source).is_file()
    if local and suffix not in CALIBRATION_BUILDERS:
        raise DataError(f"'export_quantization_dataset: {source}' is a .{suffix} file; give a "
                        f"{', '.join('.' + s for s in CALIBRATION_BUILDERS)} file with a 'text' column, or a hub dataset id.")
    try:
        rows = datasets.load_dataset(CALIBRATION_BUILDERS[suffix] if local else source, data_files=source if local else None,
                                     split="train", cache_dir=model.cache_dir, token=model.hf_hub_token)
    except Exception as e:  # load_dataset raises many kinds; each means "not available"
        raise DataError(f"'export_quantization_dataset: {source}' cannot be loaded ({type(e).__name__}: "
                        f"{(str(e).strip().splitlines() or [''])[0][:200]}); give a local file with a 'text' column, "
                        "or a hub dataset id reachable from here.") from e
    if "text" not in rows.column_names:
        raise DataError(f"'export_quantization_dataset: {source}' has no 'text' column (it has "
                        f"{', '.join(rows.column_names)}); calibration reads each row's 'text'.")
    texts = [text for text in rows["text"] if isinstance(text, str) and text]
    if not texts:
        raise DataError(f"'export_quantization_dataset: {source}' has no row with text.")
    return texts


def gptq_config(tokenizer: PreTrainedTokenizerBase, export: ExportConfig, model: ModelConfig) -> GPTQConfig:
    """transformers' GPTQConfig with the calibration samples; LLaMA-Factory's bits and block choice."""
    from transformers import GPTQConfig

    return GPTQConfig(bits=export.export_quantization_bit, tokenizer=tokenizer,
                      dataset=calibration_samples(tokenizer, export, model))


def load_quantized(model_dir: str | Path, quantization: GPTQConfig, *, model: ModelConfig) -> PreTrainedModel:
    """The model at `model_dir`, quantized while it loads, in float16 across the visible GPUs."""
    import torch
    from accelerate.utils import get_max_memory
    from transformers import AutoModelForCausalLM

    quantized = AutoModelForCausalLM.from_pretrained(str(model_dir), quantization_config=quantization, device_map="auto",
                                                     max_memory=get_max_memory(), dtype=torch.float16,
                                                     trust_remote_code=model.trust_remote_code, token=model.hf_hub_token)
    quantized.config.dtype = torch.float16
    return quantized
