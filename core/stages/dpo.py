"""Stage dpo: preference optimisation on pairs with TRL's trainers, set up from LLaMA-Factory's keys.

It trains on pairs; `pref_loss` picks the objective as LLaMA-Factory does:
- `sigmoid` (DPO), `hinge`, `ipo`: TRL's DPOTrainer, against a reference model, with `pref_beta`
  as beta. `dpo_label_smoothing` > 0 turns sigmoid into TRL's robust DPO: the older TRL that
  LLaMA-Factory builds on made it conservative DPO, which TRL 1.16 no longer offers.
  `pref_ftx` adds TRL's `sft` term (mean negative log-likelihood of the chosen replies' tokens)
  with that weight; LLaMA-Factory averages per reply first, which weighs short replies more.
  `pref_bco_weight` w mixes in TRL's `bco_pair` loss as LLaMA-Factory does, (loss + w x BCO) / (1 + w):
  TRL's BCO compares the rewards with 0 where LLaMA-Factory's compares them with a running mean
  of the rewards seen.
  `ld_alpha` is LD-DPO (TRL's `ld_alpha`): a reply's log-probability is that of its tokens up to
  the shorter reply's length plus ld_alpha times that of the rest. TRL weighs the reference's
  log-probabilities the same way; LLaMA-Factory weighs the policy's only.
- `orpo`: TRL's ORPOTrainer (loss = NLL of chosen + beta x odds-ratio loss). TRL takes the NLL
  over prompt and reply where LLaMA-Factory takes it over the reply.
- `simpo`: TRL's CPOTrainer with its SimPO loss (length-normalised log-probabilities, margin
  `simpo_gamma`); `pref_ftx` weighs its NLL term (`cpo_alpha`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuneline.core.config import FinetuningConfig, StageConfig
from tuneline.core.stages.causal_lm import load_policy
from tuneline.core.stages.kind import StageKind, TrainerRequest
from tuneline.core.stages.preference import pissa_problems, preference_problems, raise_problems, with_reference
from tuneline.core.stages.stage_keys import (
    CHECKPOINT_KEYS,
    PER_DATASET_EVALUATION_KEYS,
    REFERENCE_KEYS,
    TRAINER_KEYS,
    TRAINER_LOOP_KEYS,
    TRAINER_SAMPLER_KEYS,
)
from tuneline.core.stages.trl_trainers import trl_trainer

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase, Trainer

REFERENCE_FREE = ("orpo", "simpo")
PREFERENCE_KEYS = ("pref_beta", "pref_ftx", "pref_bco_weight", "pref_loss", "dpo_label_smoothing", "simpo_gamma", "ld_alpha")
"""LLaMA-Factory's keys of the preference losses (stage kto reads pref_beta too)."""


def dpo_problems(finetuning: FinetuningConfig) -> list[str]:
    """Preference settings that stage dpo could not train with, or would ignore, one line each."""
    ft = finetuning
    problems = preference_problems(ft) + pissa_problems(ft, uses_reference=ft.pref_loss not in REFERENCE_FREE)
    if ft.pref_loss == "kto_pair":
        problems.append("'pref_loss: kto_pair' is no longer offered by TRL; train 'stage: kto' on rows with a kto_tag, "
                        "or choose pref_loss sigmoid, hinge, ipo, orpo or simpo.")
    if ft.dpo_label_smoothing and ft.pref_loss not in ("sigmoid", "simpo"):
        problems.append(f"'dpo_label_smoothing' applies to 'pref_loss: sigmoid' or 'simpo', not 'pref_loss: {ft.pref_loss}'; "
                        "remove it.")
    if ft.pref_loss == "orpo" and ft.pref_ftx:
        problems.append("'pref_ftx' does not apply to 'pref_loss: orpo', whose loss already holds the SFT term; "
                        "remove it.")
    if ft.pref_bco_weight < 0:
        problems.append(f"'pref_bco_weight' must be 0 or more, got {ft.pref_bco_weight}.")
    if ft.ld_alpha is not None and not 0 <= ft.ld_alpha <= 1:
        problems.append(f"'ld_alpha' must be in [0, 1] (1: plain DPO, 0: only the tokens both replies have), got {ft.ld_alpha}.")
    for key, value in (("pref_bco_weight", ft.pref_bco_weight or None), ("ld_alpha", ft.ld_alpha)):
        if value is not None and ft.pref_loss in REFERENCE_FREE:
            problems.append(f"'{key}' applies to pref_loss sigmoid, hinge or ipo, not '{ft.pref_loss}'; remove it.")
    if ft.pref_loss in REFERENCE_FREE and (ft.ref_model or ft.ref_model_adapters):
        problems.append(f"'pref_loss: {ft.pref_loss}' needs no reference model; "
                        "remove 'ref_model' and 'ref_model_adapters'.")
    return problems


def dpo_loss_terms(finetuning: FinetuningConfig) -> tuple[list[str], list[float]]:
    """TRL DPOTrainer `loss_type` list and `loss_weights` for pref_loss sigmoid, hinge or ipo."""
    main = "robust" if finetuning.pref_loss == "sigmoid" and finetuning.dpo_label_smoothing else finetuning.pref_loss
    bco = finetuning.pref_bco_weight
    types, weights = ([main, "bco_pair"], [1.0 / (1.0 + bco), bco / (1.0 + bco)]) if bco else ([main], [1.0])
    if finetuning.pref_ftx:
        return [*types, "sft"], [*weights, finetuning.pref_ftx]
    return types, weights


def build_dpo_trainer(request: TrainerRequest) -> Trainer:
    """A TRL trainer for stage dpo and `pref_loss`, ready to train on tuneline's tokenized pairs (pairs of
    media rows too)."""
    finetuning = request.finetuning
    raise_problems(dpo_problems(finetuning))
    if finetuning.pref_loss in REFERENCE_FREE:
        return _reference_free_trainer(request)
    from trl import DPOConfig

    from tuneline.core.data.preference_columns import dpo_pairs
    from tuneline.core.stages.preference_trainers import TokenizedDPOTrainer
    from tuneline.core.training.trl_args import trl_config

    loss_types, loss_weights = dpo_loss_terms(finetuning)
    config = trl_config(DPOConfig, request.args, beta=finetuning.pref_beta, loss_type=loss_types, loss_weights=loss_weights,
                        label_smoothing=finetuning.dpo_label_smoothing, ld_alpha=finetuning.ld_alpha, max_length=None)
    images = {"media_rows": request.media_rows} if request.media_rows is not None else {}
    return with_reference(TokenizedDPOTrainer, request, config=config, convert=dpo_pairs, **images)


def _reference_free_trainer(request: TrainerRequest) -> Trainer:
    """ORPO or SimPO (through TRL's CPO trainer): the policy alone, no reference."""
    from trl.experimental.cpo import CPOConfig
    from trl.experimental.orpo import ORPOConfig

    from tuneline.core.data.preference_columns import odds_ratio_pairs
    from tuneline.core.stages.preference_trainers import TokenizedCPOTrainer, TokenizedORPOTrainer
    from tuneline.core.training.trl_args import trl_config

    finetuning, args = request.finetuning, request.args
    # Their batches hold no `input_ids` (chosen and rejected are concatenated inside), so transformers
    # cannot count the tokens seen and would warn at every step.
    untracked = {"include_num_input_tokens_seen": "no"}
    if finetuning.pref_loss == "orpo":
        trainer_class: Any = TokenizedORPOTrainer
        config: Any = trl_config(ORPOConfig, args, beta=finetuning.pref_beta, **untracked)
    else:
        trainer_class = TokenizedCPOTrainer
        config = trl_config(CPOConfig, args, loss_type="simpo", beta=finetuning.pref_beta,
                            cpo_alpha=finetuning.pref_ftx, simpo_gamma=finetuning.simpo_gamma,
                            label_smoothing=finetuning.dpo_label_smoothing, **untracked)
    media = {"media_rows": request.media_rows} if request.media_rows is not None else {}
    return trl_trainer(trainer_class, request, config=config, convert=odds_ratio_pairs, **media)


def preference_metrics(trainer: Trainer, tokenizer: PreTrainedTokenizerBase, validation: Dataset,
                       finetuning: FinetuningConfig, *, prefix: str = "eval") -> dict[str, float]:
    """The trainer's evaluation plus how strongly policy and reference prefer the chosen replies (`eval_pref_*`)."""
    from tuneline.core.data.media.batching import row_media
    from tuneline.core.evaluation.preference import evaluate_preference

    metrics = dict(trainer.evaluate(metric_key_prefix=prefix))
    found = evaluate_preference(trainer.model, validation, beta=finetuning.pref_beta, reference=getattr(trainer, "ref_model", None),
                                media=row_media(trainer))
    metrics.update({f"{prefix}_pref_{k}": v for k, v in found.items()})
    return metrics


def _config_problems(config: StageConfig) -> list[str]:
    return dpo_problems(config.finetuning)


def _unread_keys(config: StageConfig) -> dict[str, str]:
    """SimPO's margin means nothing to the other losses (the other combinations are refused by `dpo_problems`)."""
    loss = config.finetuning.pref_loss
    return {} if loss == "simpo" else {"simpo_gamma": f"stage dpo reads it only with 'pref_loss: simpo', not '{loss}'"}


DPO = StageKind(
    name="dpo",
    summary="direct preference optimisation on pairs (DPO, IPO, hinge, ORPO, SimPO), against a reference model",
    examples="pairwise",
    plotted_keys=("rewards/accuracies", "eval_loss"),
    references=frozenset({"ref_model"}),
    trains_images=True,
    config_problems=_config_problems,
    reads=frozenset({*TRAINER_KEYS, *TRAINER_LOOP_KEYS, *CHECKPOINT_KEYS, *TRAINER_SAMPLER_KEYS, *PER_DATASET_EVALUATION_KEYS,
                     *PREFERENCE_KEYS, *REFERENCE_KEYS}),
    unread_keys=_unread_keys,
    own_keys=PREFERENCE_KEYS,
    load_model=load_policy,
    build_trainer=build_dpo_trainer,
    held_out_metrics=preference_metrics,
    trainer_modules=("trl", "tuneline.core.stages.preference_trainers"),
)
