"""The class of a reward model: the backbone with a one-output scoring head (stage rm).

transformers gives text families a sequence-classification class (`AutoModelForSequenceClassification`),
and most vision- and audio-language families none (Qwen2-VL, LLaVA, InternVL, ... ; Gemma 3 has one).
For those, tuneline builds the same class transformers builds for its text families: its own
`GenericForSequenceClassification` (the family's base model, which takes pixels and sounds, and a
`score` head reading the last non-padding token) on the family's pretrained-model class. Weights
load from the family's image-text-to-text folders as a text model's load from its causal-LM folder:
the backbone under the same `model.` prefix, the head new. The class is built once per family and
not registered with the auto classes, so nothing else in the process changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_BUILT: dict[type, type] = {}


def scoring_class(config: PretrainedConfig) -> type:
    """transformers' sequence-classification class for `config`, or for a multimodal family without
    one the generic class on its base model (built once, then reused)."""
    from transformers import AutoModel, AutoModelForSequenceClassification, PreTrainedModel
    from transformers.modeling_layers import GenericForSequenceClassification

    config_class = type(config)
    if config_class in AutoModelForSequenceClassification._model_mapping or config_class not in AutoModel._model_mapping:
        return AutoModelForSequenceClassification  # its own class, or its own error naming the family
    if config_class not in _BUILT:
        base = AutoModel._model_mapping[config_class]
        family = next(parent for parent in base.__mro__[1:] if issubclass(parent, PreTrainedModel))
        name = base.__name__.removesuffix("Model") + "ForSequenceClassification"
        _BUILT[config_class] = type(name, (GenericForSequenceClassification, family), {"__module__": __name__})
        _read_checkpoints_as(name, config_class=config_class)
    return _BUILT[config_class]


def _read_checkpoints_as(name: str, *, config_class: type) -> None:
    """Have transformers rename a checkpoint's weights for class `name` as it renames them for the family's
    class that writes text: its folders store the older layout (`model.layers`, `visual`), which
    transformers maps by class name onto `model.language_model`, `model.visual`."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForMultimodalLM
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping

    for auto_class in (AutoModelForImageTextToText, AutoModelForMultimodalLM, AutoModelForCausalLM):
        if config_class in auto_class._model_mapping:
            renames = get_checkpoint_conversion_mapping(auto_class._model_mapping[config_class].__name__)
            if renames is not None:
                register_checkpoint_conversion_mapping(name, renames, overwrite=True)
            return
