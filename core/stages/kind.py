"""The stage-kind interface: everything tuneline knows about one kind of training stage.

Each kind is one module under `core/stages/` that builds a `StageKind` value declaring what the kind
needs (its keys, its examples, its references, whether it owns its optimizer or has a reward head);
`core/stages/registry.py` lists them. Config validation (`core.stages.rules`), tokenization, the
worker, `tuneline train` and the pipeline ask the registry and read these fields, never compare
stage names (docs/ARCHITECTURE.md, "Stage kinds").

A kind trains in one of two ways: through a trainer (`load_model` builds the model with its
method applied, `build_trainer` the transformers or TRL trainer, `held_out_metrics` judges the
result on the validation split), or through a loop of its own (`train_loop`, for ppo, whose
rollouts and updates do not fit a trainer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tuneline.core.config import FinetuningConfig, GeneratingConfig, ModelConfig, OptimizerConfig, StageConfig

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainerCallback, TrainingArguments

    from tuneline.core.data.media.rows import MediaRows
    from tuneline.core.models.vocabulary import NewTokens
    from tuneline.core.training.job import TrainJob

# The shapes of tokenized examples, named as `core.data.encoding` names its encoders.
Examples = Literal["pretrain", "supervised", "pairwise", "feedback", "unsupervised"]
# What a finished stage holds: a causal LM (a policy that generates, merges and exports) or a reward model.
Output = Literal["policy", "reward_model"]


@dataclass(frozen=True)
class ModelRequest:
    """What a kind needs to load the model it trains."""

    model_path: str
    tokenizer: PreTrainedTokenizerBase
    finetuning: FinetuningConfig
    model_config: ModelConfig
    training: Mapping[str, Any]
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    model_max_length: int | None = None
    """The longest sequence the stage trains on (its cutoff_len), which `rope_scaling` stretches RoPE to."""
    new_tokens: NewTokens | None = None
    """The tokens the tokenize stage added to the tokenizer, whose embedding rows start and train anew."""

    @property
    def upcasts_trainable(self) -> bool:
        """Whether the trained parameters go to float32: not for BAdam (which keeps float32 copies of
        its block itself) nor `pure_bf16` (which trains the bfloat16 weights themselves)."""
        return not (self.optimizer.use_badam or self.finetuning.pure_bf16)


@dataclass(frozen=True)
class TrainerRequest:
    """What a kind needs to build its trainer around a loaded model."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    train_dataset: Dataset
    finetuning: FinetuningConfig
    args: TrainingArguments
    eval_dataset: Dataset | Mapping[str, Dataset] | None = None
    """The validation split, or {dataset name: split} with `eval_on_each_dataset`."""
    model_config: ModelConfig = field(default_factory=ModelConfig)
    callbacks: Sequence[TrainerCallback] = ()
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The memory-saving optimizer asked for (GaLore, APOLLO, BAdam, Adam-mini, Muon), if any."""
    model_max_length: int | None = None
    """As in `ModelRequest`: what a reference model loaded beside the policy is scaled to."""
    ignore_pad_token_for_loss: bool = True
    """False: labels are padded with the pad token, which then trains (LLaMA-Factory's sft collator)."""
    media_rows: MediaRows | None = None
    """Of tokenized image rows: the processor and sizes their pixels are cut with (`MediaRows.read`)."""
    generating: GeneratingConfig = field(default_factory=GeneratingConfig)
    """How the online RL stages sample their completions (temperature, top_p, top_k)."""


@dataclass(frozen=True)
class LoopRequest:
    """What a kind with its own training loop needs: the job, its resolved arguments, the data."""

    job: TrainJob
    args: TrainingArguments
    tokenizer: PreTrainedTokenizerBase
    datasets: DatasetDict
    checkpoint: str | None
    finetuning: FinetuningConfig
    model_config: ModelConfig
    new_tokens: NewTokens | None = None


def no_problems(config: StageConfig) -> list[str]:
    return []


def all_read(config: StageConfig) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class StageKind:
    """One kind of training stage, as the registry holds it."""

    name: str
    """The value of the `stage` key."""
    summary: str
    """One line for listings and errors."""
    examples: Examples
    """The shape its rows are tokenized to (and so the columns of its tokenized dataset)."""
    output: Output = "policy"
    references: frozenset[str] = frozenset()
    """Which of `ref_model` and `reward_model` it reads; in a pipeline they may name a stage."""
    predicts: bool = False
    """Whether `do_predict` with `predict_with_generate` can answer held-out prompts after training."""
    plotted_keys: tuple[str, ...] = ()
    """Logged keys drawn beside the loss curve, one `training_<key>.png` each, as LLaMA-Factory draws them
    for this kind (`core.training.callbacks.plot_loss`)."""
    config_problems: Callable[[StageConfig], list[str]] = no_problems
    """Settings this kind cannot train with, one line each, found when the config is read."""
    reads: frozenset[str] = frozenset()
    """The keys of `core.stages.ignored_keys.STAGE_KEYS` it reads; any other of them set away from its
    default is ignored by this kind, and said so (`core.stages.ignored_keys`)."""
    unread_keys: Callable[[StageConfig], dict[str, str]] = all_read
    """Keys this config leaves unread, each with why in the kind's own words: keys of `reads` that its
    other settings leave unread (`simpo_gamma` without 'pref_loss: simpo'), or keys it never reads whose
    reason says more than the list of the kinds that do (ppo always samples: `do_sample`)."""
    load_model: Callable[[ModelRequest], PreTrainedModel] | None = None
    build_trainer: Callable[[TrainerRequest], Trainer] | None = None
    held_out_metrics: Callable[..., dict[str, float]] | None = None
    """`(trainer, tokenizer, validation, finetuning, *, prefix="eval")`: the trainer's evaluation of
    `validation` and the kind's own measures of it, named `<prefix>_*`."""
    train_loop: Callable[[LoopRequest], dict[str, float]] | None = None
    trains_images: bool = False
    """Whether it trains on image rows (their pixels fed by the image collators)."""
    log_keys: tuple[str, ...] = ()
    """Keys of its trainer's logs (or prefixes ending in '/') that trainer_log.jsonl holds beside LLaMA-Factory's."""
    trainer_modules: tuple[str, ...] = ()
    """Modules its trainer imports (TRL's), which a worker started ahead imports while the data is tokenized."""
    own_keys: tuple[str, ...] = ()
    """The keys of `FinetuningConfig` that are this kind's own settings (its loss, its rollouts), in
    LLaMA-Factory's names (TRL's where LLaMA-Factory has none); with the keys several kinds share
    (`core.stages.stage_keys`) they make up the keys whose reading depends on the kind (`ignored_keys.STAGE_KEYS`)."""
    exclusive_keys: frozenset[str] = frozenset()
    """Keys that only the kinds declaring them take: set away from its default in any other kind, such a
    key is refused when the config is read (`core.stages.rules`), not only reported as ignored; for keys
    that change what a run trains, which a user would not want silently dropped."""
    owns_optimizer: bool = False
    """Whether it builds its optimizer itself (in its own loop) rather than through transformers' Trainer,
    so the keys that choose the Trainer's optimizer (`use_galore`, `use_badam`, ...) cannot apply."""

    def __post_init__(self) -> None:
        by_trainer = None not in (self.load_model, self.build_trainer, self.held_out_metrics)
        if by_trainer == (self.train_loop is not None):
            raise ValueError(f"stage kind '{self.name}' needs either load_model, build_trainer and held_out_metrics, "
                             "or a train_loop")

    @property
    def produces_policy(self) -> bool:
        return self.output == "policy"

    @property
    def has_reward_head(self) -> bool:
        """Whether the trained model carries a scoring head (saved with its adapter) instead of an LM head."""
        return self.output == "reward_model"
