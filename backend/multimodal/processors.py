"""The processors: a multimodal row to prompt text, token ids and the model's media inputs.

Contract
- `VisionProcessor` turns a row into the prompt text (the chat template's image placeholders
  expanded to one `<|image_pad|>` per merged patch, as Qwen2-VL's processor does) plus `media`:
  a plain dict {"pixel_values", "image_grid_thw"} of CPU tensors, the keyword arguments of the
  model's forward. Plain dicts of tensors survive `torch.load(weights_only=True)` in checkpoints.
  It needs only the image processor's PIL backend and the tokenizer: transformers' Qwen2VLProcessor
  also builds a video processor, which needs torchvision, a package the CPU install does not have.
- Videos: frames go through the image processor (its PIL backend; the pixel budget of the model's
  video_preprocessor_config.json when it ships one, else the image budget; every frame given is used, no fps
  sampling) and are regrouped the way Qwen2-VL's video processor lays them out: pairs of consecutive
  frames (temporal_patch_size, the last frame repeated to fill a pair) form one temporal patch, giving
  {"pixel_values_videos", "video_grid_thw"} and one `<|video_pad|>` per merged patch per frame pair. A
  video of two identical frames is therefore exactly the image of that frame (the image processor repeats
  a still image over the temporal patch), which the tests use as the reference.
- `AudioProcessor` runs the model's own transformers processor (Qwen2-Audio: Whisper features, one <|AUDIO|>
  per audio frame token) on mono audio resampled linearly to the feature extractor's rate, so media =
  {"input_features", "feature_attention_mask"}; the model's positions are plain 1-D ones.
- `render_mm_prompt(row, data, processor, base_dir)` is what the trainer and evaluation call per row;
  `render_mm_text` renders the text alone, reading no media (previews).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.multimodal.media import Audio, MediaError, load_audio, load_image, load_video, media_items, video_items


def is_vision_config(config: Any) -> bool:
    """A vision-language model's config (Qwen2-VL, Qwen2.5-VL and the like carry a vision_config)."""
    return getattr(config, "vision_config", None) is not None


def is_audio_config(config: Any) -> bool:
    """An audio-language model's config (Qwen2-Audio and the like carry an audio_config)."""
    return getattr(config, "audio_config", None) is not None


def placeholder_ids(config: Any) -> list[int]:
    """Token ids that stand for media slots (image, video, audio) in a multimodal model's prompts."""
    ids: set[Any] = set()
    if is_vision_config(config):
        ids |= {getattr(config, "image_token_id", None), getattr(config, "video_token_id", None)}
    if is_audio_config(config):
        ids |= {getattr(config, "audio_token_id", None), getattr(config, "audio_token_index", None)}
    return sorted(i for i in ids if isinstance(i, int))


def _media_part(p: Any) -> bool:
    return isinstance(p, dict) and (p.get("type") in ("image", "video", "audio") or any(k in p for k in ("image", "video", "audio")))


def mm_messages(prompt: Any, n_images: int, system_prompt: str = "", n_videos: int = 0, n_audios: int = 0
                ) -> list[dict[str, Any]]:
    """Chat messages with the images, then the videos, then the audios first in the user turn (Qwen2-VL's
    convention); a prompt that is already a message list keeps its own media parts, or gets them on its first
    user turn."""
    parts: list[dict[str, Any]] = [{"type": "image"}] * n_images + [{"type": "video"}] * n_videos + \
        [{"type": "audio"}] * n_audios
    if isinstance(prompt, list):
        msgs = [dict(m) for m in prompt]
        has_parts = any(isinstance(m.get("content"), list) and any(_media_part(p) for p in m["content"]) for m in msgs)
        if not has_parts:
            for m in msgs:
                if m.get("role") == "user":
                    m["content"] = parts + [{"type": "text", "text": str(m["content"])}]
                    break
    else:
        msgs = [{"role": "user", "content": parts + [{"type": "text", "text": str(prompt)}]}]
    if system_prompt and not any(m.get("role") == "system" for m in msgs):
        msgs = [{"role": "system", "content": system_prompt}, *msgs]
    return msgs


def _row_media(row: dict[str, Any], data: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """A row's image items, video cells and audio items, by the spec's columns (data: the RunSpec's DataSection)."""
    images = media_items(row.get(data.images_column)) if data.images_column else []
    videos_column, audios_column = getattr(data, "videos_column", ""), getattr(data, "audios_column", "")
    videos = video_items(row.get(videos_column)) if videos_column else []
    audios = media_items(row.get(audios_column)) if audios_column else []
    return images, videos, audios


def render_mm_text(row: dict[str, Any], data: Any, tokenizer: Any) -> str:
    """A multimodal row's prompt text, one placeholder per image, video or audio, without processing any media
    (previews)."""
    images, videos, audios = _row_media(row, data)
    prompt = data.prompt_template.format_map(row) if data.prompt_template else row[data.prompt_column]
    if not getattr(tokenizer, "chat_template", None):
        raise MediaError("multimodal prompts need the tokenizer's chat template (it places the media tokens)")
    return tokenizer.apply_chat_template(mm_messages(prompt, len(images), data.system_prompt, len(videos), len(audios)),
                                         add_generation_prompt=True, tokenize=False, **data.chat_template_kwargs)


@dataclass(frozen=True)
class MMPrompt:
    text: str  # the rendered prompt, one placeholder per image or video (what rewards and samples.jsonl see)
    ids: list[int]  # its tokens with each placeholder expanded to the image's (video's) merged-patch count
    # {"pixel_values": (patches, dim), "image_grid_thw": (n_images, 3)} for images,
    # {"pixel_values_videos": (patches, dim), "video_grid_thw": (n_videos, 3)} for videos
    media: dict[str, torch.Tensor]
    images: tuple[Any, ...] = ()  # the RGB images themselves, for engines that process them (vLLM)


def _video_size(model_dir: Path) -> dict[str, int] | None:
    """The per-frame pixel budget ({"shortest_edge", "longest_edge"}: min and max pixels) of a model's video
    processor config, when it ships one (video_preprocessor_config.json); frames are then resized by it, as
    Qwen2-VL's video processor does, instead of by the image budget."""
    import json

    try:
        cfg = json.loads((model_dir / "video_preprocessor_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    size = dict(cfg.get("size") or {}) if isinstance(cfg, dict) else {}
    for key, name in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if isinstance(cfg, dict) and cfg.get(key):
            size[name] = int(cfg[key])
    return {k: int(size[k]) for k in ("shortest_edge", "longest_edge")} if {"shortest_edge", "longest_edge"} <= set(size) else None


class VisionProcessor:
    """Image processor + tokenizer, the Qwen2-VL way (placeholder expansion by grid size); videos are frames
    through the same image processor, regrouped into temporal patches (see the module docstring)."""

    def __init__(self, tokenizer: Any, image_processor: Any, image_token: str = "<|image_pad|>",
                 video_token: str = "<|video_pad|>", video_size: dict[str, int] | None = None):
        self.tokenizer, self.image_processor, self.image_token = tokenizer, image_processor, image_token
        self.video_size = video_size  # per-frame pixel budget of the model's video processor; None = the image one
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        if self.image_token_id is None or self.image_token_id == tokenizer.unk_token_id:
            raise MediaError(f"the tokenizer has no image placeholder token {image_token!r}")
        vid = tokenizer.convert_tokens_to_ids(video_token)
        self.video_token = video_token if vid is not None and vid != tokenizer.unk_token_id else None
        self.merge = int(getattr(image_processor, "merge_size", 2))
        self.temporal = int(getattr(image_processor, "temporal_patch_size", 2))
        self.patch = int(getattr(image_processor, "patch_size", 14))

    @classmethod
    def from_pretrained(cls, path: str, tokenizer: Any, trust_remote_code: bool = False) -> VisionProcessor:
        from transformers import AutoImageProcessor

        try:  # the PIL backend needs no torchvision
            ip = AutoImageProcessor.from_pretrained(path, backend="pil", trust_remote_code=trust_remote_code)
        except (TypeError, ValueError):
            ip = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
        return cls(tokenizer, ip, getattr(tokenizer, "image_token", None) or "<|image_pad|>",
                   getattr(tokenizer, "video_token", None) or "<|video_pad|>", _video_size(Path(path)))

    def messages(self, prompt: Any, n_images: int, system_prompt: str = "", n_videos: int = 0) -> list[dict[str, Any]]:
        return mm_messages(prompt, n_images, system_prompt, n_videos)

    def save_pretrained(self, path: Path) -> None:
        """What a checkpoint needs beside the weights to take images again: the image processor's config."""
        self.image_processor.save_pretrained(path)

    def encode(self, messages: list[dict[str, Any]], images: list[Any], videos: list[list[Any]] = (),
               template_kwargs: dict[str, Any] | None = None) -> MMPrompt:
        if not getattr(self.tokenizer, "chat_template", None):
            raise MediaError("multimodal prompts need the tokenizer's chat template (it places the image tokens)")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                  **(template_kwargs or {}))
        return self.encode_text(text, images, videos)

    def video_features(self, frames: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(patches, C*T*P*P) pixel inputs and the (1, 3) grid of one video given as same-size RGB frames.

        Each frame goes through the image processor, which lays a still image out as (gh/m, gw/m, m, m, C, T,
        P, P) with the frame repeated over T; one copy of each frame is kept, frames are padded to a multiple
        of T with the last one, and consecutive frames become the temporal axis of one patch, the layout of
        Qwen2-VL's video processor: (t, gh/m, gw/m, m, m, C, T, P, P)."""
        extra = {"size": self.video_size} if self.video_size else {}
        feats = self.image_processor(images=frames, return_tensors="pt", **extra)
        grids = feats["image_grid_thw"].long()
        if (grids != grids[0]).any():
            raise MediaError("video frames resize to different patch grids")
        gh, gw = int(grids[0, 1]), int(grids[0, 2])
        m, T, P = self.merge, self.temporal, self.patch
        pv = feats["pixel_values"].float()
        C = pv.shape[-1] // (T * P * P)
        per_frame = pv.view(len(frames), gh // m, gw // m, m, m, C, T, P, P)[..., 0, :, :]
        if pad := -len(frames) % T:
            per_frame = torch.cat([per_frame, per_frame[-1:].expand(pad, *per_frame.shape[1:])])
        t = per_frame.shape[0] // T
        pv = per_frame.view(t, T, gh // m, gw // m, m, m, C, P, P).permute(0, 2, 3, 4, 5, 6, 1, 7, 8)
        return pv.reshape(t * gh * gw, C * T * P * P).contiguous(), torch.tensor([[t, gh, gw]])

    def encode_text(self, text: str, images: list[Any], videos: list[list[Any]] = ()) -> MMPrompt:
        """Expand each image (video) placeholder in `text` to its number of merged patches and tokenize."""
        import re

        n_slots = text.count(self.image_token)
        if n_slots != len(images):
            raise MediaError(f"the prompt has {n_slots} image placeholder(s) but the row has {len(images)} image(s)")
        n_vslots = text.count(self.video_token) if self.video_token else 0
        if n_vslots != len(videos):
            if self.video_token is None:
                raise MediaError("the tokenizer has no video placeholder token '<|video_pad|>': this model takes no video")
            raise MediaError(f"the prompt has {n_vslots} video placeholder(s) but the row has {len(videos)} video(s)")
        media: dict[str, torch.Tensor] = {}
        counts: dict[str, list[int]] = {self.image_token: [], self.video_token or "": []}
        if images:
            feats = self.image_processor(images=images, return_tensors="pt")
            grid = feats["image_grid_thw"].long()
            media.update(pixel_values=feats["pixel_values"].float(), image_grid_thw=grid)
            counts[self.image_token] = [int(g.prod()) // self.merge ** 2 for g in grid]
        if videos:
            pvs, grids = zip(*(self.video_features(frames) for frames in videos))
            media.update(pixel_values_videos=torch.cat(pvs), video_grid_thw=torch.cat(grids))
            counts[self.video_token] = [int(g.prod()) // self.merge ** 2 for g in torch.cat(grids)]
        tokens = [re.escape(t) for t in (self.image_token, self.video_token) if t]
        pieces, seen = [], {self.image_token: 0, self.video_token: 0}
        for piece in re.split(f"({'|'.join(tokens)})", text):
            if piece in counts and piece:
                pieces.append(piece * counts[piece][seen[piece]])
                seen[piece] += 1
            else:
                pieces.append(piece)
        ids = self.tokenizer("".join(pieces), add_special_tokens=False)["input_ids"]
        return MMPrompt(text, ids, media, tuple(images))


class AudioProcessor:
    """An audio-language model's own transformers processor (Qwen2-Audio: a Whisper feature extractor, and the
    placeholder expanded to one token per audio frame token), which needs no torchvision; audio arrives as
    mono float samples, resampled to the feature extractor's rate."""

    def __init__(self, processor: Any):
        self.processor, self.tokenizer = processor, processor.tokenizer
        self.audio_token = getattr(processor, "audio_token", None) or "<|AUDIO|>"
        self.sampling_rate = int(getattr(processor.feature_extractor, "sampling_rate", 16000))

    @classmethod
    def from_pretrained(cls, path: str, trust_remote_code: bool = False) -> AudioProcessor:
        from transformers import AutoProcessor

        return cls(AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code))

    def save_pretrained(self, path: Path) -> None:
        """The processor's config (feature extractor, audio tokens) beside a checkpoint's weights."""
        self.processor.save_pretrained(path)

    def resample(self, audio: Audio) -> Any:
        """Linear interpolation to the feature extractor's rate (enough for the log-mel features it computes)."""
        import numpy as np

        if audio.sampling_rate == self.sampling_rate or len(audio.samples) < 2:
            return audio.samples
        n = max(1, round(len(audio.samples) * self.sampling_rate / audio.sampling_rate))
        t = np.linspace(0, len(audio.samples) - 1, n)
        return np.interp(t, np.arange(len(audio.samples)), audio.samples).astype(np.float32)

    def encode(self, messages: list[dict[str, Any]], audios: list[Audio],
               template_kwargs: dict[str, Any] | None = None) -> MMPrompt:
        template = getattr(self.processor, "chat_template", None) or getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise MediaError("audio prompts need the processor's or tokenizer's chat template (it places the audio tokens)")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                  chat_template=template, **(template_kwargs or {}))
        return self.encode_text(text, audios)

    def encode_text(self, text: str, audios: list[Audio]) -> MMPrompt:
        n_slots = text.count(self.audio_token)
        if n_slots != len(audios):
            raise MediaError(f"the prompt has {n_slots} audio placeholder(s) but the row has {len(audios)} audio(s)")
        if not audios:
            return MMPrompt(text, self.tokenizer(text, add_special_tokens=False)["input_ids"], {})
        out = self.processor(text=[text], audio=[self.resample(a) for a in audios], sampling_rate=self.sampling_rate,
                             return_tensors="pt")
        media = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)
                 and k not in ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")}
        return MMPrompt(text, out["input_ids"][0].tolist(), media)


def render_mm_prompt(row: dict[str, Any], data: Any, vision: VisionProcessor | AudioProcessor, base_dir: Path) -> MMPrompt:
    """A row with images, a video or audio -> prompt text, token ids and media inputs (data: the RunSpec's
    DataSection; `vision`: the model's processor)."""
    image_items, video_cells, audio_items = _row_media(row, data)
    prompt = data.prompt_template.format_map(row) if data.prompt_template else row[data.prompt_column]
    if isinstance(vision, AudioProcessor):
        if image_items or video_cells:
            raise MediaError("an audio model takes no images or videos")
        audios = [load_audio(a, base_dir) for a in audio_items]
        return vision.encode(mm_messages(prompt, 0, data.system_prompt, n_audios=len(audios)), audios,
                             data.chat_template_kwargs)
    if audio_items:
        raise MediaError("a vision-language model takes no audio")
    images = [load_image(i, base_dir) for i in image_items]
    videos = [load_video(v, base_dir, data.max_video_frames) for v in video_cells]
    return vision.encode(vision.messages(prompt, len(images), data.system_prompt, len(videos)), images, videos,
                         data.chat_template_kwargs)
