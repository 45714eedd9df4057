"""A model folder's processors, as transformers loads them: the image processor, the video processor (where
torchvision imports), the audio feature extractor, LLaVA-NeXT's multimodal processor, and the numbers a
family's multimodal processor keeps in processor_config.json. A folder without the one a row needs, or
one transformers cannot read, is a ConfigError naming `model_name_or_path` and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuneline.core.data.media.expansion import LLAVA_SETTINGS
from tuneline.core.errors import ConfigError
from tuneline.core.templates.spec import MediaTokens


def load_video_processor(model_path: str | Path) -> Any:
    """transformers' video processor of the folder where torchvision imports (which it needs), else None."""
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():
        return None
    from transformers import AutoVideoProcessor

    return AutoVideoProcessor.from_pretrained(str(model_path))


def folder_model_type(folder: Path) -> str | None:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def load_image_processor(model_path: str | Path) -> Any:
    """The model folder's image processor (transformers' class for its family)."""
    from transformers import AutoImageProcessor

    fix = "image rows are sized and cut into patches by it: use the model's own folder, which ships one."
    folder = Path(model_path)
    if folder.is_dir() and not any((folder / name).is_file() for name in (IMAGE_PROCESSOR_FILE, PROCESSOR_FILE)):
        raise ConfigError(f"'model_name_or_path: {model_path}' has no image processor (no {IMAGE_PROCESSOR_FILE}); {fix}")
    try:
        return AutoImageProcessor.from_pretrained(str(model_path))
    except (OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"'model_name_or_path: {model_path}': transformers cannot load its image processor "
                          f"({reason}); {fix}") from e


def load_multimodal_processor(folder: str | Path, media: MediaTokens, image_processor: Any, settings: dict[str, Any]) -> Any:
    """LLaVA-NeXT's processor, from the folder's tokenizer, image processor and numbers; None for the others."""
    if media.plugin != "llava_next":
        return None
    from transformers import AutoTokenizer, LlavaNextProcessor

    return LlavaNextProcessor(image_processor=image_processor, tokenizer=AutoTokenizer.from_pretrained(str(folder)),
                              image_token=media.image_token, **settings)


def load_audio_processor(model_path: str | Path) -> Any:
    """The model folder's audio feature extractor (transformers' class for its family)."""
    from transformers import AutoFeatureExtractor

    try:
        return AutoFeatureExtractor.from_pretrained(str(model_path))
    except (OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"'model_name_or_path: {model_path}': transformers cannot load its audio feature extractor "
                          f"({reason}); audio rows are cut into features by it: use the model's own folder, which ships "
                          "one.") from e


IMAGE_PROCESSOR_FILE, PROCESSOR_FILE = "preprocessor_config.json", "processor_config.json"
PROCESSOR_CLASSES = {"llava": "LlavaProcessor", "llava_next": "LlavaNextProcessor", "gemma3": "Gemma3Processor",
                     "intern_vl": "InternVLProcessor"}
"""transformers' multimodal processor class of each family that keeps numbers in processor_config.json."""
PROCESSOR_SETTINGS = {"llava": ("LLaVA", LLAVA_SETTINGS), "llava_next": ("LLaVA-NeXT", LLAVA_SETTINGS),
                      "gemma3": ("Gemma 3", ("image_seq_length",)), "intern_vl": ("InternVL", ("image_seq_length",))}
"""Each such family's name and the numbers of its processor that count an image's tokens (the first required)."""


def load_processor_settings(model_path: str | Path, media: MediaTokens) -> dict[str, Any]:
    """The numbers of the folder's multimodal processor (processor_config.json) that `media`'s family
    counts image tokens by; none for a family whose image processor alone counts them (Qwen2-VL)."""
    if media.plugin not in PROCESSOR_SETTINGS:
        return {}
    family, keys = PROCESSOR_SETTINGS[media.plugin]
    path = Path(model_path) / PROCESSOR_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"'model_name_or_path: {model_path}' has no readable {PROCESSOR_FILE} ({type(e).__name__}); "
                          f"{family}'s processor keeps there the {', '.join(keys)} that count an image's tokens: "
                          "use the model's own folder, which ships one.") from e
    missing = [key for key in keys[:1] if saved.get(key) is None]
    if missing:
        raise ConfigError(f"{path} sets no {', '.join(missing)}; {family} counts an image's tokens by it: use the model's "
                          "own processor_config.json.")
    return {key: saved.get(key) for key in keys}
