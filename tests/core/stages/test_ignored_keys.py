"""Keys a stage kind does not read: for every kind and every stage-dependent key set away from its
default, the kind reads it (no warning), warns that it ignores it (one line naming key, stage and
why), or refuses the config as before. The tables below say which, kind by kind."""

from __future__ import annotations

import pytest

from tuneline.core.config import read_stage_config
from tuneline.core.errors import ConfigError
from tuneline.core.stages.ignored_keys import ignored_keys, tag_value
from tuneline.core.stages.registry import KINDS, build_stage_config
from tuneline.core.stages.stage_keys import STAGE_KEYS

EVALUATING = {"eval_strategy": "steps", "eval_steps": 5, "val_size": 0.1, "dataset": "demo_alpaca",
              "metric_for_best_model": "eval_loss"}
PREDICTING = {"do_predict": True, "predict_with_generate": True, "val_size": 0.1, "dataset": "demo_alpaca"}
# each key away from its default, with the keys it needs beside it
SAMPLES: dict[str, dict] = {
    "packing": {"packing": True}, "neat_packing": {"neat_packing": True}, "train_on_prompt": {"train_on_prompt": True},
    "mask_history": {"mask_history": True}, "ignore_pad_token_for_loss": {"ignore_pad_token_for_loss": False},
    "disable_shuffling": {"disable_shuffling": True},
    "include_effective_tokens_per_second": {"include_effective_tokens_per_second": True},
    "early_stopping_steps": {**EVALUATING, "early_stopping_steps": 2},
    "eval_on_each_dataset": {"eval_dataset": "demo_alpaca,demo_pretrain", "eval_on_each_dataset": True},
    "compute_accuracy": {"compute_accuracy": True}, "use_dft_loss": {"use_dft_loss": True},
    "use_eaft_loss": {"use_eaft_loss": True}, "use_asft_loss": {"use_asft_loss": True}, "asft_alpha": {"asft_alpha": 0.2},
    "eaft_alpha": {"eaft_alpha": 2.0}, "pref_beta": {"pref_beta": 0.2}, "pref_ftx": {"pref_ftx": 0.5},
    "pref_bco_weight": {"pref_bco_weight": 0.5}, "pref_loss": {"pref_loss": "hinge"}, "dpo_label_smoothing": {"dpo_label_smoothing": 0.1},
    "simpo_gamma": {"simpo_gamma": 1.0}, "ld_alpha": {"ld_alpha": 0.5}, "kto_chosen_weight": {"kto_chosen_weight": 2.0},
    "kto_rejected_weight": {"kto_rejected_weight": 2.0}, "ppo_buffer_size": {"ppo_buffer_size": 2}, "ppo_epochs": {"ppo_epochs": 2},
    "ppo_score_norm": {"ppo_score_norm": True}, "ppo_target": {"ppo_target": 3.0}, "ppo_whiten_rewards": {"ppo_whiten_rewards": True},
    "ref_model": {"ref_model": "reference"}, "ref_model_adapters": {"ref_model": "reference", "ref_model_adapters": "adapter"},
    "ref_model_quantization_bit": {"ref_model": "reference", "ref_model_quantization_bit": 4},
    "reward_model": {"reward_model": "scorer"}, "reward_model_adapters": {"reward_model": "scorer", "reward_model_adapters": "adapter"},
    "reward_model_quantization_bit": {"reward_model": "scorer", "reward_model_quantization_bit": 4},
    "reward_model_type": {"reward_model": "scorer", "reward_model_type": "full"},
    "num_generations": {"num_generations": 4}, "beta": {"beta": 0.04}, "epsilon": {"epsilon": 0.1}, "epsilon_high": {"epsilon_high": 0.3},
    "loss_type": {"loss_type": "grpo"}, "importance_sampling_level": {"importance_sampling_level": "sequence"},
    "scale_rewards": {"scale_rewards": "batch"}, "num_iterations": {"num_iterations": 2},
    "max_completion_length": {"max_completion_length": 64}, "mask_truncated_completions": {"mask_truncated_completions": True},
    "reward_funcs": {"reward_funcs": "answer_match,think_answer_format"}, "reward_weights": {"reward_weights": "1.0"},
    "use_vllm": {"use_vllm": True}, "vllm_mode": {"vllm_mode": "server"},
    "do_sample": {"do_sample": False}, "temperature": {"temperature": 0.7}, "top_p": {"top_p": 0.9}, "top_k": {"top_k": 10},
    "repetition_penalty": {"repetition_penalty": 1.1}, "max_new_tokens": {"max_new_tokens": 16}, "max_length": {"max_length": 256},
    "num_beams": {"num_beams": 2}, "length_penalty": {"length_penalty": 0.8}, "skip_special_tokens": {"skip_special_tokens": False},
    "eval_num_beams": {"eval_num_beams": 2},
}
# what each kind needs to be a valid config at all
BASES = {"ppo": {"reward_model": "scorer"}, "grpo": {"reward_funcs": "answer_match"}, "rloo": {"reward_funcs": "answer_match"}}

PREFERENCE = {"pref_beta", "pref_ftx", "pref_bco_weight", "pref_loss", "dpo_label_smoothing", "simpo_gamma", "ld_alpha"}
KTO = {"kto_chosen_weight", "kto_rejected_weight"}
PPO = {"ppo_buffer_size", "ppo_epochs", "ppo_score_norm", "ppo_target", "ppo_whiten_rewards"}
REFERENCE = {"ref_model", "ref_model_adapters", "ref_model_quantization_bit"}
REWARD = {"reward_model", "reward_model_adapters", "reward_model_quantization_bit", "reward_model_type"}
GRPO_ONLY = {"loss_type", "importance_sampling_level", "scale_rewards"}
ONLINE = {"num_generations", "beta", "epsilon", "epsilon_high", *GRPO_ONLY, "num_iterations", "max_completion_length",
          "mask_truncated_completions", "reward_funcs", "reward_weights", "use_vllm", "vllm_mode"}
SAMPLING = {"do_sample", "temperature", "top_p", "top_k", "repetition_penalty"}
GENERATION = {*SAMPLING, "max_new_tokens", "max_length", "num_beams", "length_penalty", "skip_special_tokens", "eval_num_beams"}
SFT_LABELS = {"neat_packing", "train_on_prompt", "mask_history", "ignore_pad_token_for_loss"}
SFT_LOSSES = {"use_dft_loss", "use_eaft_loss", "use_asft_loss"}
TRAINER = {"disable_shuffling", "include_effective_tokens_per_second", "early_stopping_steps"}
NOT_SAMPLED = {"max_new_tokens", "max_length", "num_beams", "length_penalty", "skip_special_tokens", "eval_num_beams"}

WARNED = {
    "pt": {"asft_alpha", "eaft_alpha"} | PREFERENCE | KTO | PPO | REFERENCE | REWARD | GENERATION,
    "sft": PREFERENCE | KTO | PPO | REWARD,
    "rm": {"packing", "asft_alpha", "eaft_alpha"} | PREFERENCE | KTO | PPO | REFERENCE | REWARD | GENERATION,
    "dpo": {"packing", "asft_alpha", "eaft_alpha"} | KTO | PPO | REWARD | GENERATION,
    "kto": {"packing", "asft_alpha", "eaft_alpha", "pref_loss", "simpo_gamma"} | PPO | REWARD | GENERATION,
    "ppo": {"packing", "asft_alpha", "eaft_alpha", "do_sample", "skip_special_tokens", "eval_num_beams"} | PREFERENCE | KTO,
    "grpo": {"packing", "asft_alpha", "eaft_alpha", "reward_model_type"} | PREFERENCE | KTO | PPO | NOT_SAMPLED,
    "rloo": {"packing", "asft_alpha", "eaft_alpha", "reward_model_type"} | PREFERENCE | KTO | PPO | NOT_SAMPLED,
}
"""The keys each kind trains with and warns of."""
REFUSED = {
    "pt": SFT_LABELS | SFT_LOSSES | ONLINE,
    "sft": ONLINE,
    "rm": SFT_LABELS | SFT_LOSSES | {"compute_accuracy"} | ONLINE,
    "dpo": SFT_LABELS | SFT_LOSSES | {"compute_accuracy"} | ONLINE,
    "kto": SFT_LABELS | SFT_LOSSES | {"compute_accuracy", "pref_ftx", "pref_bco_weight", "dpo_label_smoothing", "ld_alpha"} | ONLINE,
    "ppo": SFT_LABELS | SFT_LOSSES | TRAINER | {"eval_on_each_dataset", "compute_accuracy", "reward_model_adapters"} | ONLINE,
    "grpo": SFT_LABELS | SFT_LOSSES | {"eval_on_each_dataset", "compute_accuracy", "reward_model_adapters", "do_sample"},
    "rloo": SFT_LABELS | SFT_LOSSES | {"eval_on_each_dataset", "compute_accuracy", "reward_model_adapters", "do_sample"} | GRPO_ONLY,
}
"""The keys each kind refuses (as before this warning existed: LLaMA-Factory refuses them too, or they cannot train)."""
READ_WHEN = {
    ("sft", "asft_alpha"): {"use_asft_loss": True}, ("sft", "eaft_alpha"): {"use_eaft_loss": True},
    **{("sft", key): {"use_asft_loss": True} for key in REFERENCE},
    **{("sft", key): PREDICTING for key in GENERATION},
    ("dpo", "simpo_gamma"): {"pref_loss": "simpo"},
    **{(kind, key): {"beta": 0.04} for kind in ("grpo", "rloo") for key in REFERENCE},
}
"""The settings under which a kind reads a key it reads only sometimes (each also warned without them, below)."""
NEEDS_THE_MACHINE = {"use_vllm"}  # read by grpo and rloo, refused where vLLM cannot run (no CUDA here)


def raw_config(kind: str, key: str) -> dict:
    return {"stage": kind, **BASES.get(kind, {}), **READ_WHEN.get((kind, key), {}), **SAMPLES[key]}


def test_the_tables_cover_every_stage_key_and_the_kinds_declare_no_other():
    assert set(SAMPLES) == set(STAGE_KEYS)
    for name, kind in KINDS.items():
        assert WARNED[name].isdisjoint(REFUSED[name]), name
        assert kind.reads <= set(STAGE_KEYS), sorted(kind.reads - set(STAGE_KEYS))
        config, _ = read_stage_config({"stage": name})
        assert set(kind.unread_keys(config)) <= set(STAGE_KEYS), name


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_ignored_key_gets_one_line_naming_key_stage_and_why(kind: str):
    for key in sorted(WARNED[kind]):
        config = build_stage_config(raw_config(kind, key))  # it trains: a warning, not a refusal
        lines = [item.line for item in ignored_keys(config) if item.key == key]
        assert len(lines) == 1, (key, lines)
        assert lines[0].startswith(f"'{key}: ") and f"has no effect in stage '{kind}' and is ignored: " in lines[0], lines[0]
        assert "What it does: " in lines[0] and "\n" not in lines[0]


@pytest.mark.parametrize("kind", list(KINDS))
def test_no_warning_for_the_keys_a_kind_reads(kind: str):
    read = set(STAGE_KEYS) - WARNED[kind] - REFUSED[kind]
    assert read, kind
    for key in sorted(read):
        if key in NEEDS_THE_MACHINE:
            config, _ = read_stage_config(raw_config(kind, key))
        else:
            config = build_stage_config(raw_config(kind, key))
        assert key not in {item.key for item in ignored_keys(config)}, (kind, key)


@pytest.mark.parametrize("kind", list(KINDS))
def test_keys_refused_before_stay_refused_naming_the_key(kind: str):
    for key in sorted(REFUSED[kind]):
        with pytest.raises(ConfigError) as error:
            build_stage_config(raw_config(kind, key))
        assert any(key in problem for problem in error.value.problems), (key, error.value.problems)


@pytest.mark.parametrize(("raw", "key", "why"), [
    ({"stage": "sft", "temperature": 0.5}, "temperature",
     "stage sft generates only to predict ('do_predict: true' with 'predict_with_generate: true'), which this run does "
     "not ask for"),
    ({"stage": "dpo", "simpo_gamma": 1.0}, "simpo_gamma", "stage dpo reads it only with 'pref_loss: simpo', not 'sigmoid'"),
    ({"stage": "grpo", "reward_funcs": "answer_match", "ref_model": "reference"}, "ref_model",
     "stage grpo loads a reference model only for the KL penalty, and 'beta' is 0 (set beta > 0 to use it)"),
    ({"stage": "rloo", "reward_funcs": "answer_match", "max_new_tokens": 64}, "max_new_tokens",
     "stage rloo bounds its completions with 'max_completion_length' instead"),
    ({"stage": "ppo", "reward_model": "scorer", "do_sample": False}, "do_sample", "stage ppo always samples its rollouts"),
    ({"stage": "kto", "pref_loss": "orpo"}, "pref_loss", "only stage dpo reads it"),
    ({"stage": "sft", "reward_model_adapters": "adapter", "reward_model": "scorer"}, "reward_model_adapters",
     "no stage kind reads it"),
])
def test_a_key_a_kind_reads_only_sometimes_says_when(raw: dict, key: str, why: str):
    [ignored] = [item for item in ignored_keys(build_stage_config(raw)) if item.key == key]
    assert ignored.why == why


def test_the_line_and_the_tag_of_a_reward_model_with_packing_and_sampling_keys():
    ignored = ignored_keys(build_stage_config({"stage": "rm", "packing": True, "top_p": 0.9, "pref_beta": 0.1}))
    assert [item.line for item in ignored] == [
        "'packing: true' has no effect in stage 'rm' and is ignored: only stages pt and sft read it. What it does: Pack "
        "examples into full-length sequences (default: on for pt).",
        "'top_p: 0.9' has no effect in stage 'rm' and is ignored: only stages sft, ppo, grpo and rloo read it. What it "
        "does: Nucleus sampling mass.",
    ]  # pref_beta at its default asks for nothing
    assert tag_value(ignored) == "packing,top_p"


def test_a_config_that_sets_nothing_stage_specific_gets_no_warning():
    for name in KINDS:
        assert ignored_keys(build_stage_config({"stage": name, **BASES.get(name, {})})) == [], name


def test_packing_reaches_only_the_encoders_of_single_sequences():
    from tuneline.core.data.encoding import EncodingSpec
    from tuneline.core.templates.conversation import get_template

    config = build_stage_config({"stage": "rm", "packing": True})
    packing = {shape: EncodingSpec.from_config(config, template=get_template("default"), examples=shape).packing
               for shape in ("pretrain", "supervised", "pairwise", "feedback", "unsupervised")}
    assert packing == {"pretrain": True, "supervised": True, "pairwise": None, "feedback": None, "unsupervised": None}
