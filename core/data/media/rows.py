"""Media rows made ready to encode: each `<image>` and `<video>` expanded into the tokens the model's
image and video features fill.

`MediaRows` is built once per tokenization from the template's media tokens and the model folder's
image processor (transformers' own class, from its preprocessor_config.json). Every row keeps its
`images` and `videos` (the resolved files, for the training collator to feed) and gains
`media_tokens`, how many image and video tokens its messages now hold: an example whose cutoff cut
into them is dropped when encoded, since the model would find fewer tokens than features
(LLaMA-Factory keeps it, and training fails).

A video's tokens are counted from its container's header (size, frame count, duration) without
decoding it, and written as its family writes them (`video_layout`: one run for Qwen2-VL, a temporal
patch at a time with its time for Qwen3-VL and GLM-4.1V; `frame_tiles`: an image tile a frame for
InternVL, cut by the image processor as LLaMA-Factory cuts them); the collator decodes the sampled frames
(`video_frames`). transformers' video processors need torchvision, whose wheel for the CPU build of
torch does not import: where it is missing the frames are cut by the image processor and laid out in
time by `video_features`, and where it imports (a CUDA machine) transformers' own video processor cuts
them.

The folder's processors load through `model_processors`. The tokenized folder keeps the image processor and
the sizing settings beside its tokenizer (`save`), and the training collator reads them back (`read`): the
pixels a model sees are cut by the very processor and sizes that counted its image tokens, whatever the
model folder holds meanwhile. Pixels are made per batch in the data loader rather than stored, since they
outweigh the tokens many times over (one 448x448 image is 256 tokens and 1.2 MB of float32 patches; a video,
that per frame).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.config import MediaConfig
from tuneline.core.data.media.audio.clips import samples
from tuneline.core.data.media.audio.in_video import block_text, heard_video_blocks, interleaved_counts, row_label
from tuneline.core.data.media.columns import AUDIOS, IMAGES, MEDIA_TOKENS, VIDEOS
from tuneline.core.data.media.expansion import (
    CROP_TO_PATCHES,
    PAN_AND_SCAN,
    SlicedImage,
    audio_token_count,
    cross_attention_inputs,
    expand_audios,
    expand_images,
    expand_videos,
    image_features,
    image_prefix,
    pan_and_scan_crops,
    patch_token_counts,
    placeholder_counts,
    sliced_images,
)
from tuneline.core.data.media.processor_loading import (
    PROCESSOR_CLASSES,
    PROCESSOR_FILE,
    folder_model_type,
    load_audio_processor,
    load_image_processor,
    load_multimodal_processor,
    load_processor_settings,
    load_video_processor,
)
from tuneline.core.data.media.sizing import MINICPM_V_4_6, sized_dimensions, sized_image
from tuneline.core.data.media.video.frame_tiles import (
    FRAME_TILED_PLUGINS,
    check_images_first,
    check_one_sequence,
    frame_tile_features,
    frame_tiles_text,
)
from tuneline.core.data.media.video.frames import VideoSampling, frames, paired, probe
from tuneline.core.data.media.video.layout import (
    TIMED_PLUGINS,
    VIDEO_PROCESSOR_FILE,
    TimedVideo,
    VideoPatching,
    folder_video_patching,
    glm_kept_frames,
    glm_token_types,
    timed_video,
    timed_video_texts,
    video_features,
    video_placements,
    video_processor_config,
    video_run_text,
)
from tuneline.core.errors import ConfigError, DataError
from tuneline.core.models.composite import FAMILY_TEMPLATES, MODEL_TEMPLATES
from tuneline.core.templates.spec import QWEN_PLUGINS, MediaTokens, Template

SETTINGS_FILE = "image_settings.json"


@dataclass(frozen=True)
class MediaRows:
    media: MediaTokens
    image_processor: Any
    settings: MediaConfig
    processor_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The multimodal processor's own numbers its family counts tokens by (LLaVA's patch_size and the rest)."""
    video: VideoPatching | None = None
    """How the family cuts video frames; None: it takes no videos (or tuneline does not feed them yet), or
    cuts each frame as an image tile (InternVL, `frame_tiles`)."""
    video_seconds: bool = False
    """The model spaces a video's temporal positions by its seconds per temporal patch (Qwen2.5-VL's
    `second_per_grid_ts`)."""
    video_processor: Any = None
    """transformers' own video processor, where torchvision imports; else None (see the module's doc)."""
    audio_processor: Any = None
    """The folder's audio feature extractor (Qwen2-Audio's Whisper one); None: the family hears no audio."""
    multimodal_processor: Any = None
    """LLaVA-NeXT's processor (transformers' class), which counts an image's tile features; None elsewhere."""

    @classmethod
    def load(cls, template: Template, model_path: str | Path, settings: MediaConfig, *,
             datasets: Mapping[str, Sequence[str]]) -> MediaRows:
        """For `template` and the processors of the model folder at `model_path`; `datasets`: the names of
        the datasets that hold each media column. A ConfigError names the dataset, template or folder when
        their media cannot be encoded."""
        def named(column: str) -> str:
            return ", ".join(repr(name) for name in datasets.get(column, ()))

        if template.media is None:
            every = sorted({name for names in datasets.values() for name in names})
            raise ConfigError(f"dataset {', '.join(repr(d) for d in every)} holds images, videos or audio, and 'template: "
                              f"{template.name}' writes text only; use a multimodal template of the model's family "
                              f"({FAMILY_TEMPLATES}).")
        media = template.media
        if datasets.get(IMAGES) and media.image_token is None:
            raise ConfigError(f"dataset {named(IMAGES)} holds images, and 'template: {template.name}' is for a model "
                              "that reads no images; use a vision-language model and its template or leave out the images.")
        if datasets.get(AUDIOS) and media.audio_token is None:
            raise ConfigError(f"dataset {named(AUDIOS)} holds audio, and tuneline feeds audio to Qwen2-Audio and "
                              f"Qwen2.5-Omni so far ('template: qwen2_audio' or 'qwen2_omni'), not through 'template: "
                              f"{template.name}'; use one of those models or leave out the audio.")
        if datasets.get(VIDEOS) and media.plugin == MINICPM_V_4_6:
            raise ConfigError(f"dataset {named(VIDEOS)} holds videos, and tuneline feeds MiniCPM-V 4.6 ('template: "
                              f"{template.name}') images only: its video frames are cut by transformers' "
                              "MiniCPMV4_6VideoProcessor, which needs torchvision; leave out the videos, or give their frames "
                              "as images.")
        image_processor = load_image_processor(model_path) if media.image_token else None
        video = folder_video_patching(media, model_path, image_processor)
        if datasets.get(VIDEOS) and video is None and media.plugin not in FRAME_TILED_PLUGINS:
            raise ConfigError(f"dataset {named(VIDEOS)} holds videos, and tuneline feeds videos to Qwen2-VL, Qwen2.5-VL, "
                              "Qwen2.5-Omni, Qwen3-VL, GLM-4.1V and InternVL so far ('template: qwen2_vl', 'qwen2_omni', "
                              "'qwen3_vl', 'qwen3_vl_nothink', 'glm4v', 'intern_vl' or 'intern_s1'), not through 'template: "
                              f"{template.name}'; use one of those models or leave out the videos.")
        if datasets.get(VIDEOS) and datasets.get(IMAGES) and media.plugin == "glm4v":
            raise ConfigError(f"datasets {named(IMAGES)} and {named(VIDEOS)} hold images and videos, and GLM-4.1V's "
                              "model (transformers' Glm4vModel) finds an image's and a video frame's features by the same "
                              "<|image|> token, so a batch holding both fails; train on the images and the videos in "
                              "separate runs.")
        processor_settings = load_processor_settings(model_path, media)
        return cls(media=media, image_processor=image_processor, settings=settings,
                   processor_settings=processor_settings, video=video,
                   multimodal_processor=load_multimodal_processor(model_path, media, image_processor, processor_settings),
                   video_seconds=folder_model_type(Path(model_path)) in SECONDS_SPACED,
                   video_processor=load_video_processor(model_path) if datasets.get(VIDEOS) else None,
                   audio_processor=load_audio_processor(model_path) if media.audio_token else None)

    def save(self, folder: str | Path) -> None:
        """The image processor and the sizing settings, into `folder` (the tokenized data's tokenizer folder)."""
        self._save_processors(folder)
        if self.video_processor is not None:
            self.video_processor.save_pretrained(str(folder))
        settings = {"media": dataclasses.asdict(self.media), "settings": dataclasses.asdict(self.settings),
                    "processor_settings": self.processor_settings, "video_seconds": self.video_seconds,
                    "video": self.video and dataclasses.asdict(self.video)}
        (Path(folder) / SETTINGS_FILE).write_text(json.dumps(settings, indent=2), encoding="utf-8")

    def save_processor(self, folder: str | Path) -> None:
        """The processor as a model folder holds it: the image processor, the multimodal processor's
        numbers (processor_config.json) where the family counts tokens by them, and Qwen3-VL's and GLM-4.1V's
        video processor (video_preprocessor_config.json), whose pixel limits are not their image processor's."""
        self._save_processors(folder)
        if self.video is not None and self.video.whole_clip:
            if self.video_processor is not None:
                self.video_processor.save_pretrained(str(folder))
            else:
                saved = video_processor_config(self.video, self.media.plugin)
                (Path(folder) / VIDEO_PROCESSOR_FILE).write_text(json.dumps(saved, indent=2), encoding="utf-8")
        if self.processor_settings:
            named = {"image_token": self.media.image_token} if self.media.plugin in ("llava", "llava_next") else {}
            saved = {**self.processor_settings, **named, "processor_class": PROCESSOR_CLASSES[self.media.plugin]}
            (Path(folder) / PROCESSOR_FILE).write_text(json.dumps(saved, indent=2), encoding="utf-8")

    def _save_processors(self, folder: str | Path) -> None:
        for processor in (self.image_processor, self.audio_processor):
            if processor is not None:
                processor.save_pretrained(str(folder))

    @classmethod
    def read(cls, folder: str | Path) -> MediaRows:
        """What `save` wrote into `folder`."""
        saved = json.loads((Path(folder) / SETTINGS_FILE).read_text(encoding="utf-8"))
        video, media = saved.get("video"), MediaTokens(**saved["media"])
        image_processor = load_image_processor(folder) if media.image_token else None
        processor_settings = saved.get("processor_settings", {})
        return cls(media=media, image_processor=image_processor, settings=MediaConfig(**saved["settings"]),
                   processor_settings=processor_settings,
                   multimodal_processor=load_multimodal_processor(folder, media, image_processor, processor_settings),
                   video=video and VideoPatching.saved(video), video_seconds=saved.get("video_seconds", False),
                   video_processor=load_video_processor(folder) if video else None,
                   audio_processor=load_audio_processor(folder) if media.audio_token else None)

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

    @property
    def sampling(self) -> VideoSampling:
        return VideoSampling(fps=self.settings.video_fps, maxlen=self.settings.video_maxlen)

    @property
    def pans_and_scans(self) -> bool:
        """Gemma 3 under `image_do_pan_and_scan`: the image processor adds crops of wide and tall images."""
        return self.media.plugin == "gemma3" and self.settings.image_do_pan_and_scan

    def features(self, paths: Sequence[str]) -> dict[str, Any]:
        """The model inputs of the images at `paths` (pixel_values, image_grid_thw), as torch tensors.
        MiniCPM-V 4.6: pixel_values and target_sizes; LLaMA-Factory also passes the image processor's
        downsample_mode, which the model otherwise reads from its own config (both 16x unless a folder says otherwise)."""
        import torch

        return {name: torch.from_numpy(value)
                for name, value in image_features(self.sized(paths), self.image_processor, **self.image_settings).items()}

    @property
    def image_settings(self) -> dict[str, Any]:
        """What the image processor is called with beyond the images: Gemma 3's pan and scan, InternVL's tiles."""
        if self.pans_and_scans:
            return PAN_AND_SCAN
        if self.media.plugin == "intern_vl" and self.settings.crop_to_patches:
            return CROP_TO_PATCHES
        return {}

    def video_features(self, paths: Sequence[str]) -> dict[str, Any]:
        """The model inputs of the videos at `paths` (pixel_values_videos, video_grid_thw, and Qwen2.5-VL's
        second_per_grid_ts), as torch tensors: each video's sampled frames decoded, paired and sized (and
        those GLM-4.1V's video processor keeps of them). InternVL: `pixel_values`, a tile a frame, unpaired."""
        import numpy as np
        import torch

        videos, seconds = [], []
        tiled = self.media.plugin in FRAME_TILED_PLUGINS  # InternVL: each frame as sampled, no pairing
        for path in paths:
            found = probe(path, self.sampling)
            taken = frames(path, found.indices)
            if not tiled:
                taken += taken[-1:] * (paired(len(taken)) - len(taken))
                seconds.append(self.video.temporal_patch_size / found.sampled_fps)
            if self.media.plugin == "glm4v":
                taken = [taken[index] for index in glm_kept_frames(len(taken), found.duration, self.video)]
            videos.append([sized_image(frame, max_pixels=self.settings.video_max_pixels,
                                       min_pixels=self.settings.video_min_pixels, plugin=self.media.plugin) for frame in taken])
        if tiled:
            inputs = frame_tile_features(videos, self.image_processor)
        elif self.video_processor is not None:
            inputs = dict(self.video_processor(videos=videos, size=self.video.size, do_sample_frames=False, return_tensors="np"))
        else:
            inputs = video_features(videos, self.image_processor, self.video)
        if self.video_seconds:
            inputs["second_per_grid_ts"] = np.array(seconds, dtype=np.float32)
        if self.media.plugin == "qwen2_omni":  # Qwen2.5-Omni's name for the same seconds per temporal patch
            inputs["video_second_per_grid"] = np.array(seconds, dtype=np.float32)
        return {name: torch.from_numpy(np.asarray(value)) for name, value in inputs.items()}

    def expand(self, row: dict[str, Any]) -> dict[str, Any]:
        """`row` with its images', videos' and audio clips' placeholders expanded (a row without them gains
        empty lists)."""
        images, videos, audios = (list(row.get(key) or []) for key in (IMAGES, VIDEOS, AUDIOS))
        image_counts = self.token_counts(images) if images else []
        crops, slicings = self.crops(images), self.slicings(images)
        heard = self.hears_videos and bool(videos)
        if heard:  # each video's block holds its sound's tokens; the <audio> placeholders are taken out
            video_texts, video_counts = self.heard_video_texts(videos, audios, where=row_label(row))
            audio_counts: list[int] = []
        else:
            video_texts, video_counts = self.video_texts(row, videos) if videos else ([], [])
            audio_counts = self.audio_token_counts(audios) if audios else []
        in_prompt = placeholder_counts(row["prompt"])  # the prompt's media come first, then the reply's
        expanded = {}
        for part, start, end in (("prompt", {IMAGES: 0, VIDEOS: 0, AUDIOS: 0}, in_prompt),
                                 ("response", in_prompt, {IMAGES: None, VIDEOS: None, AUDIOS: None})):
            with_images = expand_images(row[part], image_counts[start[IMAGES]:end[IMAGES]], self.media,
                                        crops and crops[start[IMAGES]:end[IMAGES]], first_index=start[IMAGES],
                                        slicings=None if slicings is None else slicings[start[IMAGES]:end[IMAGES]])
            if heard:
                expanded[part] = heard_video_blocks(with_images, video_texts[start[VIDEOS]:end[VIDEOS]], where=row_label(row))
                continue
            with_videos = expand_videos(with_images, video_texts[start[VIDEOS]:end[VIDEOS]])
            expanded[part] = expand_audios(with_videos, audio_counts[start[AUDIOS]:end[AUDIOS]], self.media)
        image_tokens = sum(count * (1 + n) for count, n in zip(image_counts, crops or [0] * len(images)))
        return {**row, **expanded, IMAGES: images, VIDEOS: videos, AUDIOS: audios,
                MEDIA_TOKENS: image_tokens + sum(video_counts) + sum(audio_counts),
                "image_prefix": image_prefix(image_counts, self.media)}

    def audio_samples(self, path: str) -> Any:
        """The clip at `path` as the model hears it: one channel at `audio_sampling_rate`."""
        return samples(path, self.settings.audio_sampling_rate)

    def audio_token_counts(self, paths: Sequence[str]) -> list[int]:
        """How many audio tokens each clip at `paths` takes, from its length (each decoded in turn)."""
        return [audio_token_count(len(self.audio_samples(path)), self.audio_processor) for path in paths]

    def audio_features(self, paths: Sequence[str]) -> dict[str, Any]:
        """The model inputs of the clips at `paths` (input_features, feature_attention_mask), as torch
        tensors: the feature extractor's mel frames, padded to its chunk, as LLaMA-Factory makes them."""
        import torch

        rate = self.settings.audio_sampling_rate
        features = self.audio_processor([self.audio_samples(path) for path in paths], sampling_rate=rate,
                                        return_attention_mask=True, padding="max_length", return_tensors="np")
        return {"input_features": torch.from_numpy(features["input_features"]),
                "feature_attention_mask": torch.from_numpy(features["attention_mask"])}

    def expand_messages(self, messages: Sequence[dict[str, str]], paths: Sequence[str]) -> list[dict[str, str]]:
        """`messages` (a conversation to answer) with each `<image>` expanded for the image at `paths`
        in the same place; the counts must agree (the caller has placed the placeholders)."""
        return expand_images(messages, self.token_counts(paths), self.media, self.crops(paths), slicings=self.slicings(paths))

    def prefix_ids(self, paths: Sequence[str], tokenizer: Any) -> list[int]:
        """The image tokens that go before a conversation showing the images at `paths` (PaliGemma's); else none."""
        count = image_prefix(self.token_counts(paths), self.media) if paths else 0
        return [tokenizer.convert_tokens_to_ids(self.media.image_token)] * count if count else []

    def crops(self, paths: Sequence[str]) -> list[int] | None:
        """How many crops each image at `paths` gains under Gemma 3's pan and scan; None without it."""
        if not self.pans_and_scans:
            return None
        return pan_and_scan_crops(self.sized(paths), self.image_processor) if paths else []

    def slicings(self, paths: Sequence[str]) -> list[SlicedImage] | None:
        """How MiniCPM-V 4.6's image processor cuts each image at `paths`; None for the other families."""
        if self.media.plugin != MINICPM_V_4_6:
            return None
        return sliced_images(self.sized(paths), self.image_processor) if paths else []

    def token_counts(self, paths: Sequence[str]) -> list[int]:
        """How many image tokens each image at `paths` takes."""
        return patch_token_counts(self.sized(paths), self.image_processor, plugin=self.media.plugin,
                                  processor_settings=self.processor_settings, multimodal_processor=self.multimodal_processor,
                                  crop_to_patches=self.settings.crop_to_patches)

    def video_texts(self, row: dict[str, Any], paths: Sequence[str]) -> tuple[list[str], list[int]]:
        """The text each of the row's videos at `paths` is written as, and its video tokens (see `video_layout`)."""
        if self.media.plugin in FRAME_TILED_PLUGINS:
            check_images_first([*row["prompt"], *row["response"]], where=row_label(row))
            tokens, counts = int(self.processor_settings["image_seq_length"]), self.video_token_counts(paths)
            return [frame_tiles_text(count // tokens, self.media, tokens_per_tile=tokens) for count in counts], counts
        if self.media.plugin not in TIMED_PLUGINS:
            counts = self.video_token_counts(paths)
            return [video_run_text(count, self.media) for count in counts], counts
        timed = self.timed_videos(paths)
        texts = timed_video_texts(timed, video_placements(row["prompt"], row["response"]), self.media,
                                  merge_size=self.video.merge_size)
        return texts, [video.grid[0] * video.tokens_per_patch(self.video.merge_size) for video in timed]

    @property
    def hears_videos(self) -> bool:
        """Qwen2.5-Omni under `use_audio_in_video`: each video's block interleaves its own sound's tokens."""
        return self.media.plugin == "qwen2_omni" and self.settings.use_audio_in_video

    def heard_video_texts(self, videos: Sequence[str], audios: Sequence[str], *, where: str) -> tuple[list[str], list[int]]:
        """The block each video at `videos` is written as with its sound (the clip at the same place in
        `audios`), and the tokens of each block (video and sound), from the files' headers and the sound's
        length (`audio_in_video`)."""
        if len(videos) != len(audios):
            raise DataError(f"{where}: with 'use_audio_in_video: true' each video names its sound track in `audios`, and "
                            f"the row has {len(videos)} videos and {len(audios)} sounds; give each video's file in `audios` too.")
        media, texts, counts = self.media, [], []
        for video, sound in zip(videos, audios):
            found = probe(video, self.sampling)
            width, height = sized_dimensions(found.width, found.height, max_pixels=self.settings.video_max_pixels,
                                             min_pixels=self.settings.video_min_pixels, plugin=media.plugin)
            frames = paired(len(found.indices))
            tokens = self.video.token_count(frames, width, height, self.image_processor)
            patches = math.ceil(frames / self.video.temporal_patch_size)
            heard = audio_token_count(len(self.audio_samples(sound)), self.audio_processor)
            chunks = interleaved_counts(patches, tokens // patches, heard,
                                        second_per_grid=self.video.temporal_patch_size / found.sampled_fps)
            texts.append(block_text(chunks, video_token=media.video_token, audio_token=media.audio_token,
                                    vision_bos=media.vision_bos, vision_eos=media.vision_eos,
                                    audio_bos=media.audio_bos, audio_eos=media.audio_eos))
            counts.append(tokens + heard)
        return texts, counts

    def timed_videos(self, paths: Sequence[str]) -> list[TimedVideo]:
        """Qwen3-VL's and GLM-4.1V's videos at `paths`, from their headers: grids and times."""
        videos = []
        for path in paths:
            found = probe(path, self.sampling)
            width, height = sized_dimensions(found.width, found.height, max_pixels=self.settings.video_max_pixels,
                                             min_pixels=self.settings.video_min_pixels, plugin=self.media.plugin)
            videos.append(timed_video(path, found, width=width, height=height, patching=self.video, plugin=self.media.plugin,
                                      fps=self.settings.video_fps))
        return videos

    def video_token_counts(self, paths: Sequence[str]) -> list[int]:
        """How many video tokens each video at `paths` takes, from its header: its sampled frames (paired)
        at the size its frames are scaled to (InternVL: its frames, a tile each)."""
        if self.media.plugin in FRAME_TILED_PLUGINS:
            tokens = int(self.processor_settings["image_seq_length"])
            return [len(probe(path, self.sampling).indices) * tokens for path in paths]
        if self.media.plugin in TIMED_PLUGINS:
            return [video.grid[0] * video.tokens_per_patch(self.video.merge_size) for video in self.timed_videos(paths)]
        counts = []
        for path in paths:
            found = probe(path, self.sampling)
            width, height = sized_dimensions(found.width, found.height, max_pixels=self.settings.video_max_pixels,
                                             min_pixels=self.settings.video_min_pixels, plugin=self.media.plugin)
            counts.append(self.video.token_count(paired(len(found.indices)), width, height, self.image_processor))
        return counts

    def token_ids(self, tokenizer: Any) -> dict[str, int]:
        """The ids of the template's image token and (for a family that takes videos) video token, by media
        column; and GLM-4.1V's video markers (`video_bos`, `video_eos`), within which its image tokens are a video's."""
        tokens = {IMAGES: self.media.image_token, VIDEOS: self.media.video_token if self.video else None,
                  AUDIOS: self.media.audio_token if self.audio_processor is not None else None,
                  "video_bos": self.media.video_bos if self.video else None,
                  "video_eos": self.media.video_eos if self.video else None}
        return {key: tokenizer.convert_tokens_to_ids(token) for key, token in tokens.items() if token}

    def model_inputs(self, input_ids: Any, images: Sequence[str], videos: Sequence[str] = (), audios: Sequence[str] = (),
                     *, token_ids: dict[str, int], attention_mask: Any = None) -> dict[str, Any]:
        """What the model takes beside `input_ids` (a [batch, n] tensor) for the images and videos at
        `images` and `videos`, each in the order of its tokens: the features, and for the Qwen-VL families
        `mm_token_type_ids` (1 on image tokens, 2 on video tokens), from which transformers computes its
        3D rotary positions. `attention_mask` (0 on padding) keeps PaliGemma's token types 0 there, as
        LLaMA-Factory pads them."""
        if self.media.plugin == "mllama":
            inputs = cross_attention_inputs(input_ids, self.sized(images), self.image_processor, image_token_id=token_ids[IMAGES],
                                            attention_mask=attention_mask) if images else {}
        else:
            inputs = dict(self.features(images)) if images else {}
        if videos and self.media.plugin in FRAME_TILED_PLUGINS:  # a frame is one more tile, after the images'
            import torch

            check_one_sequence(len(input_ids), images=len(images), videos=len(videos))
            frames = self.video_features(videos)["pixel_values"]
            inputs["pixel_values"] = torch.cat([inputs["pixel_values"], frames]) if images else frames
        elif videos:
            inputs.update(self.video_features(videos))
        if audios:
            inputs.update(self.audio_features(audios))
        if self.media.plugin == "glm4v":  # a video's frames are image tokens: 2 within the video markers, 1 elsewhere
            inputs["mm_token_type_ids"] = glm_token_types(input_ids, token_ids)
        elif self.media.plugin in QWEN_PLUGINS and self.media.plugin != "qwen2_omni":  # Omni finds its media tokens by id
            types = (input_ids == token_ids[IMAGES]).long()
            if VIDEOS in token_ids:
                types += 2 * (input_ids == token_ids[VIDEOS]).long()
            inputs["mm_token_type_ids"] = types
        elif self.media.plugin == "gemma3":  # Gemma 3 attends both ways within an image's soft tokens
            inputs["token_type_ids"] = (input_ids == token_ids[IMAGES]).long()
        elif self.media.plugin == "paligemma":  # 0: the image prefix, attended both ways; 1: the text after it
            text = (input_ids != token_ids[IMAGES]).long()
            inputs["token_type_ids"] = text if attention_mask is None else text * attention_mask.long()
        if self.hears_videos and videos:  # the thinker places each block's sound tokens by their seconds
            inputs["use_audio_in_video"] = True
        return inputs

    def expand_all(self, rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        return (self.expand(row) for row in rows)


SECONDS_SPACED = frozenset({"qwen2_5_vl"})
"""Model types whose video positions are spaced by seconds per temporal patch (`second_per_grid_ts`)."""


def media_rows_for_model(model_path: str | Path, *, template: Template | None, settings: MediaConfig,
                         processor_path: str | Path | None = None) -> MediaRows:
    """How prompts for the model at `model_path` hold images: the media tokens of `template`, or (None)
    of the model type's template, and the image processor of `processor_path` (default: the model's
    folder); a ConfigError for a text model."""
    from tuneline.core.templates.catalog import TEMPLATES

    if template is None:
        model_type = folder_model_type(Path(model_path))
        if model_type not in MODEL_TEMPLATES:
            raise ConfigError(f"'{model_path}' is a {model_type or 'text'} model, which reads no images; pass a "
                              f"vision-language model ({', '.join(MODEL_TEMPLATES)}) or leave out the images.")
        template = TEMPLATES[MODEL_TEMPLATES[model_type]]
    if template.media is None:
        raise ConfigError(f"template '{template.name}' writes text only, so it cannot show the model an image; use a "
                          f"multimodal template of the model's family ({FAMILY_TEMPLATES}).")
    if template.media.image_token is None:
        raise ConfigError(f"template '{template.name}' is for a model that reads no images; use a vision-language model "
                          f"and its template ({FAMILY_TEMPLATES}) or leave out the images.")
    folder = processor_path or model_path
    image_processor, processor_settings = load_image_processor(folder), load_processor_settings(folder, template.media)
    return MediaRows(media=template.media, image_processor=image_processor, settings=settings,
                     processor_settings=processor_settings,
                     multimodal_processor=load_multimodal_processor(folder, template.media, image_processor, processor_settings))
