"""Image rows made ready to encode: each `<image>` expanded into the tokens the model's image features fill.

`ImageRows` is built once per tokenization from the template's media tokens and the model folder's
image processor (transformers' own class, from its preprocessor_config.json). Every row keeps its
`images` (the resolved files, for the training collator to feed) and gains `image_tokens`, how many
image tokens its messages now hold: an example whose cutoff cut into them is dropped when encoded,
since the model would find fewer tokens than features (LLaMA-Factory keeps it, and training fails).

The tokenized folder keeps the image processor and the sizing settings beside its tokenizer
(`save`), and the training collator reads them back (`read`): the pixels a model sees are cut by the
very processor and sizes that counted its image tokens, whatever the model folder holds meanwhile.
Pixels are made per batch in the data loader rather than stored, since they outweigh the tokens many
times over (one 448x448 image is 256 tokens and 1.2 MB of float32 patches).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.config import MediaConfig
from tuneline.core.data.media_tokens import (LLAVA_SETTINGS, expand_images, image_features, patch_token_counts,
                                             placeholder_counts, sized_image)
from tuneline.core.errors import ConfigError
from tuneline.core.models.composite import FAMILY_TEMPLATES, MODEL_TEMPLATES
from tuneline.core.templates.spec import QWEN_PLUGINS, MediaTokens, Template

SETTINGS_FILE = "image_settings.json"


@dataclass(frozen=True)
class ImageRows:
    media: MediaTokens
    image_processor: Any
    settings: MediaConfig
    processor_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The multimodal processor's own numbers its family counts tokens by (LLaVA's patch_size and the rest)."""

    @classmethod
    def load(cls, template: Template, model_path: str | Path, settings: MediaConfig, *, datasets: list[str]) -> ImageRows:
        """For `template` and the image processor of the model folder at `model_path`; a ConfigError
        names the dataset, template or folder when images cannot be encoded."""
        if template.media is None:
            raise ConfigError(f"dataset {', '.join(repr(d) for d in datasets)} holds images, and 'template: {template.name}' "
                              f"writes text only; use a multimodal template of the model's family ({FAMILY_TEMPLATES}).")
        return cls(media=template.media, image_processor=load_image_processor(model_path), settings=settings,
                   processor_settings=load_processor_settings(model_path, template.media))

    def save(self, folder: str | Path) -> None:
        """The image processor and the sizing settings, into `folder` (the tokenized data's tokenizer folder)."""
        self.image_processor.save_pretrained(str(folder))
        settings = {"media": dataclasses.asdict(self.media), "settings": dataclasses.asdict(self.settings),
                    "processor_settings": self.processor_settings}
        (Path(folder) / SETTINGS_FILE).write_text(json.dumps(settings, indent=2), encoding="utf-8")

    def save_processor(self, folder: str | Path) -> None:
        """The processor as a model folder holds it: the image processor, and the multimodal processor's
        numbers (processor_config.json) where the family counts tokens by them."""
        self.image_processor.save_pretrained(str(folder))
        if self.processor_settings:
            saved = {**self.processor_settings, "image_token": self.media.image_token,
                     "processor_class": PROCESSOR_CLASSES[self.media.plugin]}
            (Path(folder) / PROCESSOR_FILE).write_text(json.dumps(saved, indent=2), encoding="utf-8")

    @classmethod
    def read(cls, folder: str | Path) -> ImageRows:
        """What `save` wrote into `folder`."""
        saved = json.loads((Path(folder) / SETTINGS_FILE).read_text(encoding="utf-8"))
        return cls(media=MediaTokens(**saved["media"]), image_processor=load_image_processor(folder),
                   settings=MediaConfig(**saved["settings"]), processor_settings=saved.get("processor_settings", {}))

    def sized(self, paths: Sequence[str]) -> list[Any]:
        """The images at `paths`, opened and sized as the model family reads them."""
        from PIL import Image

        images = []
        for path in paths:
            with Image.open(path) as image:
                image.load()  # the pixels, before the file closes (an image left as it is stays lazy otherwise)
                images.append(sized_image(image, max_pixels=self.settings.image_max_pixels,
                                          min_pixels=self.settings.image_min_pixels, plugin=self.media.plugin))
        return images

    def features(self, paths: Sequence[str]) -> dict[str, Any]:
        """The model inputs of the images at `paths` (pixel_values, image_grid_thw), as torch tensors."""
        import torch

        return {name: torch.from_numpy(value) for name, value in image_features(self.sized(paths), self.image_processor).items()}

    def expand(self, row: dict[str, Any]) -> dict[str, Any]:
        """`row` with its images' placeholders expanded (a row without images gains an empty list)."""
        paths = row.get("images") or []
        if not paths:
            return {**row, "images": [], "image_tokens": 0}
        counts = self.token_counts(paths)
        in_prompt = placeholder_counts(row["prompt"])["images"]  # the prompt's images come first, then the reply's
        expanded = {"prompt": expand_images(row["prompt"], counts[:in_prompt], self.media),
                    "response": expand_images(row["response"], counts[in_prompt:], self.media)}
        return {**row, **expanded, "images": list(paths), "image_tokens": sum(counts)}

    def expand_messages(self, messages: Sequence[dict[str, str]], paths: Sequence[str]) -> list[dict[str, str]]:
        """`messages` (a conversation to answer) with each `<image>` expanded for the image at `paths`
        in the same place; the counts must agree (the caller has placed the placeholders)."""
        return expand_images(messages, self.token_counts(paths), self.media)

    def token_counts(self, paths: Sequence[str]) -> list[int]:
        """How many image tokens each image at `paths` takes."""
        return patch_token_counts(self.sized(paths), self.image_processor, plugin=self.media.plugin,
                                  processor_settings=self.processor_settings)

    def model_inputs(self, input_ids: Any, paths: Sequence[str], *, image_token_id: int) -> dict[str, Any]:
        """What the model takes beside `input_ids` (a [batch, n] tensor) for the images at `paths`, in the
        order of their tokens: the features, and for the Qwen-VL families `mm_token_type_ids` (1 on image
        tokens), from which transformers computes its 3D rotary positions."""
        inputs = dict(self.features(paths)) if paths else {}
        if self.media.plugin in QWEN_PLUGINS:
            inputs["mm_token_type_ids"] = (input_ids == image_token_id).long()
        return inputs

    def expand_all(self, rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        return (self.expand(row) for row in rows)




def image_rows_for_model(model_path: str | Path, *, template: Template | None, settings: MediaConfig,
                         processor_path: str | Path | None = None) -> ImageRows:
    """How prompts for the model at `model_path` hold images: the media tokens of `template`, or (None)
    of the model type's template, and the image processor of `processor_path` (default: the model's
    folder); a ConfigError for a text model."""
    from tuneline.core.templates.catalog import TEMPLATES

    if template is None:
        model_type = _model_type(Path(model_path))
        if model_type not in MODEL_TEMPLATES:
            raise ConfigError(f"'{model_path}' is a {model_type or 'text'} model, which reads no images; pass a "
                              f"vision-language model ({', '.join(MODEL_TEMPLATES)}) or leave out the images.")
        template = TEMPLATES[MODEL_TEMPLATES[model_type]]
    if template.media is None:
        raise ConfigError(f"template '{template.name}' writes text only, so it cannot show the model an image; use a "
                          f"multimodal template of the model's family ({FAMILY_TEMPLATES}).")
    folder = processor_path or model_path
    return ImageRows(media=template.media, image_processor=load_image_processor(folder), settings=settings,
                     processor_settings=load_processor_settings(folder, template.media))


def _model_type(folder: Path) -> str | None:
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


IMAGE_PROCESSOR_FILE, PROCESSOR_FILE = "preprocessor_config.json", "processor_config.json"
PROCESSOR_CLASSES = {"llava": "LlavaProcessor"}
"""transformers' multimodal processor class of each family that keeps numbers in processor_config.json."""


def load_processor_settings(model_path: str | Path, media: MediaTokens) -> dict[str, Any]:
    """The numbers of the folder's multimodal processor (processor_config.json) that `media`'s family
    counts image tokens by; none for a family whose image processor alone counts them (Qwen2-VL)."""
    if media.plugin != "llava":
        return {}
    path = Path(model_path) / PROCESSOR_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"'model_name_or_path: {model_path}' has no readable {PROCESSOR_FILE} ({type(e).__name__}); "
                          f"LLaVA's processor keeps there the {', '.join(LLAVA_SETTINGS)} that count an image's tokens: "
                          "use the model's own folder, which ships one.") from e
    missing = [key for key in LLAVA_SETTINGS[:1] if saved.get(key) is None]
    if missing:
        raise ConfigError(f"{path} sets no {', '.join(missing)}; LLaVA counts an image's tokens by it: use the model's own "
                          "processor_config.json.")
    return {key: saved.get(key) for key in LLAVA_SETTINGS}
