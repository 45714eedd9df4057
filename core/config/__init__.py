"""Stage configuration with LLaMA-Factory's key names: one frozen dataclass per concern
(`model`, `data`, `method`, `optimizer`, `generation`, `media`, `output`), the whole stage
(`stage`), how a YAML is read and checked (`reading`, `coercion`, `rules`), the tokens a stage
adds to its tokenizer (`added_tokens`), and LLaMA-Factory's keys that cannot run here
(`llamafactory`). The names below are the package's interface."""

from tuneline.core.config.coercion import coerce, coerce_fields
from tuneline.core.config.data import DataConfig
from tuneline.core.config.generation import GeneratingConfig, InferenceConfig
from tuneline.core.config.machine_cache import cache_root
from tuneline.core.config.media import MediaConfig
from tuneline.core.config.method import FinetuningConfig
from tuneline.core.config.model import ModelConfig
from tuneline.core.config.optimizer import OptimizerConfig
from tuneline.core.config.output import ExportConfig, OutputConfig, RuntimeConfig
from tuneline.core.config.reading import parse_overrides, read_stage_config, read_yaml, training_fields, valid_keys
from tuneline.core.config.stage import GROUPS, StageConfig, trains

__all__ = [
    "GROUPS", "DataConfig", "ExportConfig", "FinetuningConfig", "GeneratingConfig", "InferenceConfig", "MediaConfig",
    "ModelConfig", "OptimizerConfig", "OutputConfig", "RuntimeConfig", "StageConfig", "cache_root", "coerce",
    "coerce_fields", "parse_overrides", "read_stage_config", "read_yaml", "trains", "training_fields", "valid_keys",
]
