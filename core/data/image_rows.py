"""Image rows made ready to encode: each `<image>` expanded into the tokens the model's image features fill.

`ImageRows` is built once per tokenization from the template's media tokens and the model folder's
image processor (transformers' own class, from its preprocessor_config.json). Every row keeps its
`images` (the resolved files, for the training collator to feed) and gains `image_tokens`, how many
image tokens its messages now hold: an example whose cutoff cut into them is dropped when encoded,
since the model would find fewer tokens than features (LLaMA-Factory keeps it, and training fails).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.config import MediaConfig
from tuneline.core.data.media_tokens import expand_images, patch_token_counts, placeholder_counts, sized_image
from tuneline.core.errors import ConfigError
from tuneline.core.templates.spec import MediaTokens, Template


@dataclass(frozen=True)
class ImageRows:
    media: MediaTokens
    image_processor: Any
    settings: MediaConfig

    @classmethod
    def load(cls, template: Template, model_path: str | Path, settings: MediaConfig, *, datasets: list[str]) -> ImageRows:
        """For `template` and the image processor of the model folder at `model_path`; a ConfigError
        names the dataset, template or folder when images cannot be encoded."""
        if template.media is None:
            raise ConfigError(f"dataset {', '.join(repr(d) for d in datasets)} holds images, and 'template: {template.name}' "
                              "writes text only; use a multimodal template of the model's family (qwen2_vl for "
                              "Qwen2-VL and Qwen2.5-VL).")
        return cls(media=template.media, image_processor=load_image_processor(model_path), settings=settings)

    def expand(self, row: dict[str, Any]) -> dict[str, Any]:
        """`row` with its images' placeholders expanded (a row without images gains an empty list)."""
        paths = row.get("images") or []
        if not paths:
            return {**row, "images": [], "image_tokens": 0}
        from PIL import Image

        images = []
        for path in paths:
            with Image.open(path) as image:
                image.load()  # the pixels, before the file closes (an image left as it is stays lazy otherwise)
                images.append(sized_image(image, max_pixels=self.settings.image_max_pixels,
                                          min_pixels=self.settings.image_min_pixels, plugin=self.media.plugin))
        counts = patch_token_counts(images, self.image_processor)
        in_prompt = placeholder_counts(row["prompt"])["images"]  # the prompt's images come first, then the reply's
        expanded = {"prompt": expand_images(row["prompt"], counts[:in_prompt], self.media),
                    "response": expand_images(row["response"], counts[in_prompt:], self.media)}
        return {**row, **expanded, "images": list(paths), "image_tokens": sum(counts)}

    def expand_all(self, rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        return (self.expand(row) for row in rows)


def load_image_processor(model_path: str | Path) -> Any:
    """The model folder's image processor (transformers' class for its family)."""
    from transformers import AutoImageProcessor

    fix = "image rows are sized and cut into patches by it: use the model's own folder, which ships one."
    if Path(model_path).is_dir() and not (Path(model_path) / "preprocessor_config.json").is_file():
        raise ConfigError(f"'model_name_or_path: {model_path}' has no image processor (no preprocessor_config.json); {fix}")
    try:
        return AutoImageProcessor.from_pretrained(str(model_path))
    except (OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"'model_name_or_path: {model_path}': transformers cannot load its image processor "
                          f"({reason}); {fix}") from e
