"""Keys of the fine-tuning method: which parameters train (LoRA, OFT, freeze, full), and the losses
of the stages (the SFT variants, the preference losses, PPO's and the online RL stages' settings).

The keys of one stage kind's loss or rollouts are fields here, so that a YAML is read and type-checked
before its kind is known; which kind owns each is declared in the kind's module (`StageKind.own_keys`).
The online RL keys take TRL's names, as LLaMA-Factory has none for them; their sampling reads
LLaMA-Factory's generation keys (temperature, top_p, top_k)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tuneline.core.config.fields import documented as _doc


@dataclass(frozen=True)
class FinetuningConfig:
    stage: str | None = _doc("Training stage: one of the stage kinds in core/stages/registry.py (unset: its DEFAULT_STAGE).",
                             default=None)
    finetuning_type: Literal["lora", "oft", "freeze", "full"] = _doc("Which parameters train.", default="lora")
    lora_rank: int = _doc("LoRA rank r.", default=8)
    lora_alpha: int | None = _doc("LoRA scaling alpha (default: 2 x lora_rank).", default=None)
    lora_dropout: float = _doc("Dropout on the LoRA branch.", default=0.0)
    lora_target: str = _doc("Modules that get LoRA: 'all' (every linear layer) or names, comma-separated.", default="all")
    additional_target: str | None = _doc("Extra modules trained fully and saved with the adapter.", default=None)
    use_rslora: bool = _doc("Rank-stabilised LoRA scaling.", default=False)
    use_dora: bool = _doc("Weight-decomposed LoRA (DoRA).", default=False)
    pissa_init: bool = _doc("Initialise LoRA with PiSSA (principal singular vectors).", default=False)
    pissa_iter: int = _doc("PiSSA: iterations of the fast SVD (-1: the exact SVD).", default=16)
    pissa_convert: bool = _doc("PiSSA: save the adapter converted to a plain LoRA adapter of the original base.", default=False)
    loraplus_lr_ratio: float | None = _doc("LoRA+: learning-rate ratio of B to A matrices.", default=None)
    loraplus_lr_embedding: float = _doc("LoRA+: learning rate of the LoRA embedding layers.", default=1e-6)
    create_new_adapter: bool = _doc("Start a new adapter on top of adapter_name_or_path instead of continuing it.", default=False)
    oft_rank: int = _doc("OFT: number of orthogonal blocks (0: derived from oft_block_size).", default=0)
    oft_block_size: int = _doc("OFT: size of each orthogonal block.", default=32)
    oft_target: str = _doc("OFT: modules that get the adapter, 'all' or names, comma-separated.", default="all")
    module_dropout: float = _doc("OFT: probability of dropping a whole block's rotation during training.", default=0.0)
    freeze_trainable_layers: int = _doc("Freeze: train the last n layers (negative: the first n).", default=2)
    freeze_trainable_modules: str = _doc("Freeze: module names trained within those layers, or 'all'.", default="all")
    freeze_extra_modules: str | None = _doc("Freeze: modules outside the layers that also train.", default=None)
    freeze_vision_tower: bool = _doc("Multimodal models: keep the vision tower frozen.", default=True)
    freeze_multi_modal_projector: bool = _doc("Multimodal models: keep the projector frozen.", default=True)
    freeze_language_model: bool = _doc("Multimodal models: keep the language model frozen.", default=False)
    use_llama_pro: bool = _doc("LLaMA Pro: only the layers added by block expansion train.", default=False)
    use_dft_loss: bool = _doc("SFT: dynamic fine-tuning loss (each token's loss weighted by its probability).", default=False)
    use_asft_loss: bool = _doc("SFT: anchored SFT loss (DFT with a KL anchor to the reference model).", default=False)
    asft_alpha: float = _doc("ASFT: weight of the KL anchor.", default=0.1)
    use_eaft_loss: bool = _doc("SFT: entropy-adaptive fine-tuning loss.", default=False)
    eaft_alpha: float = _doc("EAFT: exponent of the entropy weight.", default=1.0)
    compute_accuracy: bool = _doc("Evaluation: report token accuracy of the next-token predictions.", default=False)
    pref_beta: float = _doc("Preference stages: beta of the DPO/KTO/ORPO/SimPO loss.", default=0.1)
    pref_ftx: float = _doc("Preference stages: weight of the added SFT loss.", default=0.0)
    pref_bco_weight: float = _doc("DPO: weight of the added BCO loss (0: none).", default=0.0)
    pref_loss: Literal["sigmoid", "hinge", "ipo", "kto_pair", "orpo", "simpo"] = _doc("DPO loss type.", default="sigmoid")
    dpo_label_smoothing: float = _doc("Robust DPO label smoothing in [0, 0.5].", default=0.0)
    simpo_gamma: float = _doc("SimPO target reward margin.", default=0.5)
    ld_alpha: float | None = _doc("LD-DPO: weight of the log-probability of the tokens beyond the shorter reply's length.",
                                  default=None)
    kto_chosen_weight: float = _doc("KTO weight of desirable examples.", default=1.0)
    kto_rejected_weight: float = _doc("KTO weight of undesirable examples.", default=1.0)
    ref_model: str | None = _doc("Reference model for DPO/KTO/PPO (default: the policy's base).", default=None)
    ref_model_adapters: str | None = _doc("Adapter(s) on the reference model.", default=None)
    ref_model_quantization_bit: int | None = _doc("Load the reference model in 4 or 8 bits.", default=None)
    reward_model: str | None = _doc("Reward model for PPO and the online RL stages (an rm stage output).", default=None)
    reward_model_adapters: str | None = _doc("Adapter(s) on the reward model.", default=None)
    reward_model_quantization_bit: int | None = _doc("Load the reward model in 4 or 8 bits.", default=None)
    reward_model_type: Literal["lora", "full", "api"] = _doc("How the reward model is given.", default="lora")
    ppo_buffer_size: int = _doc("PPO: mini-batches per optimisation step.", default=1)
    ppo_epochs: int = _doc("PPO: epochs per optimisation step.", default=4)
    ppo_score_norm: bool = _doc("PPO: normalise scores.", default=False)
    ppo_target: float = _doc("PPO: target KL for the adaptive KL controller.", default=6.0)
    ppo_whiten_rewards: bool = _doc("PPO: whiten rewards before computing advantages.", default=False)
    num_generations: int = _doc("Online RL: completions sampled per prompt (the group).", default=8)
    beta: float = _doc("Online RL: weight of the KL penalty against the reference model (0: no reference).", default=0.0)
    epsilon: float = _doc("Online RL: clip range of the importance ratio (its lower side, when epsilon_high is set).",
                          default=0.2)
    epsilon_high: float | None = _doc("Online RL: upper clip range (DAPO's clip-higher); unset: epsilon.", default=None)
    loss_type: str = _doc("GRPO: how token losses are aggregated: grpo, dr_grpo, dapo, bnpo (or TRL's others).",
                          default="dapo")
    importance_sampling_level: Literal["token", "sequence"] = _doc(
        "GRPO: importance ratio per token, or per sequence (GSPO).", default="token")
    scale_rewards: bool | Literal["group", "batch", "none"] = _doc(
        "GRPO: divide advantages by the reward spread of the group, the batch, or not at all.", default="group")
    num_iterations: int = _doc("Online RL: optimisation passes over each batch of completions.", default=1)
    max_completion_length: int = _doc("Online RL: longest completion sampled, in tokens.", default=256)
    mask_truncated_completions: bool = _doc("Online RL: leave completions cut at max_completion_length out of the loss.",
                                            default=False)
    reward_funcs: str | list[str] | None = _doc(
        "Online RL: rewards, comma-separated: built-in names or module:function.", default=None)
    reward_weights: str | list[float] | None = _doc("Online RL: one weight per reward (reward_funcs, then reward_model).",
                                                    default=None)
    use_vllm: bool = _doc("Online RL: generate with vLLM (CUDA and the vllm package).", default=False)
    vllm_mode: Literal["colocate", "server"] = _doc("Online RL: vLLM in the training process or as a server.",
                                                    default="colocate")
    pure_bf16: bool = _doc("Train in bfloat16 throughout, without float32 master weights.", default=False)
    disable_shuffling: bool = _doc("Read the training rows in order, without shuffling.", default=False)
    early_stopping_steps: int | None = _doc("Stop when the evaluation metric has not improved for this many evaluations.",
                                            default=None)
    include_effective_tokens_per_second: bool = _doc("Report trained (non-padding) tokens per second.", default=False)
    plot_loss: bool = _doc("Save a loss-curve PNG (always done; kept for compatibility).", default=False)
