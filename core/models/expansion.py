"""LLaMA Pro's block expansion: new decoder layers that start as the identity, trained alone.

    python -m tuneline.core.models.expansion MODEL_DIR OUT_DIR --num-expand N

The model's layers fall into `num_expand` equal groups; after each group's last layer goes a copy of
it whose attention output projection and MLP down projection are zero, so the copy adds nothing to
the residual stream and the expanded model computes what the original did (Wu et al. 2024, LLaMA
Pro, section 3.1). Training it with `use_llama_pro: true` and `freeze_trainable_layers: num_expand`
trains only the copies (see `core/models/freeze.py: expanded_layer_ids`).
"""

from __future__ import annotations

import copy
from pathlib import Path

from tuneline.core.errors import ConfigError
from tuneline.core.models.freeze import decoder_layers

# The linear layers that write a decoder layer's output into the residual stream.
OUTPUT_PROJECTIONS = ("o_proj", "down_proj")


def expand_blocks(model_dir: str | Path, out_dir: str | Path, *, num_expand: int) -> dict[str, int]:
    """Write `model_dir` expanded by `num_expand` identity blocks (and its tokenizer) to `out_dir`."""
    import torch

    from tuneline.core.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir)
    prefix, count = decoder_layers(model)
    if num_expand <= 0 or count % num_expand:
        raise ConfigError(f"'num_expand: {num_expand}' must be a positive divisor of the model's {count} layers, so that "
                          "the layers fall into equal groups, each followed by one new block; choose a divisor.")
    layers = model.get_submodule(prefix)
    stride = count // num_expand
    expanded = torch.nn.ModuleList()
    for index, layer in enumerate(layers):
        expanded.append(layer)
        if (index + 1) % stride == 0:
            expanded.append(_identity_copy(layer))
    for index, layer in enumerate(expanded):
        _renumber(layer, index)
    parent, _, name = prefix.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, expanded)
    text_config = model.config.get_text_config()
    text_config.num_hidden_layers = len(expanded)
    if getattr(text_config, "layer_types", None):  # per-layer attention kinds: a copy keeps its original's
        kinds = []
        for index, kind in enumerate(text_config.layer_types):
            kinds.extend([kind, kind] if (index + 1) % stride == 0 else [kind])
        text_config.layer_types = kinds
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {"layers": len(expanded), "added": num_expand}


def _identity_copy(layer):
    """A copy of `layer` with its output projections zeroed: it leaves its input unchanged."""
    import torch

    copied = copy.deepcopy(layer)
    zeroed = [module for name, module in copied.named_modules() if name.rsplit(".", 1)[-1] in OUTPUT_PROJECTIONS]
    if len(zeroed) != len(OUTPUT_PROJECTIONS):
        raise ConfigError(f"block expansion needs decoder layers with {' and '.join(OUTPUT_PROJECTIONS)} projections, "
                          f"which {type(layer).__name__} does not have; expand a LLaMA-family model.")
    with torch.no_grad():
        for module in zeroed:
            module.weight.zero_()
            if module.bias is not None:
                module.bias.zero_()
    return copied


def _renumber(layer, index: int) -> None:
    """Each attention module knows its layer's index (its slot in the KV cache)."""
    for module in layer.modules():
        if hasattr(module, "layer_idx"):
            module.layer_idx = index


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Expand a model by identity blocks for LLaMA Pro training.")
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--num-expand", type=int, required=True, help="blocks to add: a divisor of the model's layers")
    args = parser.parse_args(argv)
    try:
        result = expand_blocks(args.model_dir, args.out_dir, num_expand=args.num_expand)
    except ConfigError as e:
        parser.exit(2, f"error: {e}\n")
    print(f"wrote {args.out_dir}: {result['layers']} layers, {result['added']} added; train it with 'use_llama_pro: true' "
          f"and 'freeze_trainable_layers: {result['added']}'")


if __name__ == "__main__":
    main()
