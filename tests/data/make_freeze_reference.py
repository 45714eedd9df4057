"""Which parameters LLaMA-Factory 0.9.5's freeze tuning leaves trainable, for a few settings, on a model
shaped like the tests' tiny base (LLaMA, 2 layers, tied embeddings): the data of
tests/core/models/test_freeze_matching.py (freeze_llamafactory.json). Run with LLaMA-Factory's Python:

    /work/lfvenv/bin/python tests/data/make_freeze_reference.py tests/data/freeze_llamafactory.json
"""
import json
import sys

from llamafactory.hparams import FinetuningArguments
from llamafactory.model.adapter import _setup_freeze_tuning
from transformers import LlamaConfig, LlamaForCausalLM

SETTINGS = [
    {"freeze_trainable_layers": 1, "freeze_trainable_modules": "mlp", "freeze_extra_modules": "norm"},
    {"freeze_trainable_layers": -1, "freeze_trainable_modules": "all", "freeze_extra_modules": None},
    {"freeze_trainable_layers": 2, "freeze_trainable_modules": "self_attn,post_attention_layernorm",
     "freeze_extra_modules": "embed_tokens"},
    {"freeze_trainable_layers": 1, "freeze_trainable_modules": "input_layernorm", "freeze_extra_modules": "norm,embed_tokens"},
    {"freeze_trainable_layers": 0, "freeze_trainable_modules": "all", "freeze_extra_modules": "norm"},
]
config = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, tie_word_embeddings=True)
cases = []
for settings in SETTINGS:
    model = LlamaForCausalLM(config)
    _setup_freeze_tuning(model, FinetuningArguments(finetuning_type="freeze", **settings), is_trainable=True,
                         cast_trainable_params_to_fp32=False)
    cases.append({"settings": settings, "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad)})
with open(sys.argv[1], "w", encoding="utf-8") as handle:
    json.dump({"llamafactory_version": "0.9.5", "command": "/work/lfvenv/bin/python tests/data/make_freeze_reference.py "
               "tests/data/freeze_llamafactory.json (llamafactory.model.adapter._setup_freeze_tuning)", "cases": cases},
              handle, indent=1)
    handle.write("\n")
