"""Multimodal prompts: media cells, the vision processor, and the model inputs that go with image tokens.

Contract
- A row's media column (`data.images_column`) holds one image or a list of them; an image is a local
  path (relative paths resolve against the project root), raw bytes, or a datasets Image dict
  ({"bytes": ..., "path": ...}). Remote URLs are refused: nothing is fetched at run time.
- `check_media_cell` says what is wrong with a cell (missing file, unreadable image, wrong type)
  without raising; backend.checks calls it through backend.data's scan so a bad row is reported,
  with its row and column, before a run starts.
- `VisionProcessor` turns a row into the prompt text (the chat template's image placeholders
  expanded to one `<|image_pad|>` per merged patch, as Qwen2-VL's processor does) plus `media`:
  a plain dict {"pixel_values", "image_grid_thw"} of CPU tensors, the keyword arguments of the
  model's forward. Plain dicts of tensors survive `torch.load(weights_only=True)` in checkpoints.
  It needs only the image processor's PIL backend and the tokenizer: transformers' Qwen2VLProcessor
  also builds a video processor, which needs torchvision, a package the CPU install does not have.
- Qwen2-VL places image tokens on a 3-D (time, height, width) rotary grid (M-RoPE). `rope_positions`
  gives the (3, B, L) positions of left-padded prompts and each row's delta: text after the prompt
  sits at (index in the unpadded sequence + delta) on all three axes, so a plain 2-D position for
  completion tokens is exact once the delta is added. The rollout engine and the training forward
  both use it, which keeps their logprobs equal for the same weights.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REMOTE_PREFIXES = ("http://", "https://", "ftp://", "s3://", "gs://", "hf://")


class MediaError(ValueError):
    pass


# ----------------------------------------------------------------------------- media cells


def media_items(value: Any) -> list[Any]:
    """A cell's images as a list (one image or a list of them; None or [] = none)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _is_pil(item: Any) -> bool:
    return type(item).__module__.startswith("PIL.")


def _describe(item: Any) -> str:
    if _is_pil(item):
        return f"<image {item.width}x{item.height}>"
    if isinstance(item, (bytes, bytearray)):
        return f"<{len(item)} bytes>"
    if isinstance(item, dict):
        return str(item.get("path") or f"<{len(item.get('bytes') or b'')} bytes>")
    return str(item)


def media_ref(value: Any) -> list[str]:
    """What samples.jsonl records for a cell: the paths as written, or '<N bytes>' for inline images."""
    return [_describe(i) for i in media_items(value)]


def resolve_path(ref: str, base_dir: Path) -> Path:
    p = Path(ref).expanduser()
    return p if p.is_absolute() else base_dir / p


def _source(item: Any, base_dir: Path) -> bytes | Path:
    """The bytes or the local file behind one image item; MediaError says why there is none."""
    if isinstance(item, dict):  # datasets' Image feature: bytes win, else the path
        if item.get("bytes"):
            item = item["bytes"]
        elif item.get("path"):
            item = item["path"]
        else:
            raise MediaError("an image dict needs 'bytes' or 'path'")
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if not isinstance(item, str):
        raise MediaError(f"expected an image path, bytes or a list of them, got {type(item).__name__}")
    if item.strip().lower().startswith(REMOTE_PREFIXES):
        raise MediaError(f"remote image {item!r} refused: nothing is downloaded at run time; "
                         "download it and give a local path")
    if not item.strip():
        raise MediaError("empty image path")
    return resolve_path(item, base_dir)


def load_image(item: Any, base_dir: Path):
    """One image item -> an RGB PIL image (MediaError when missing, remote or unreadable)."""
    from PIL import Image, UnidentifiedImageError

    if _is_pil(item):  # a hub dataset's decoded Image feature
        return item.convert("RGB")
    src = _source(item, base_dir)
    try:
        img = Image.open(io.BytesIO(src) if isinstance(src, bytes) else src)
        img.load()
    except FileNotFoundError as err:
        raise MediaError(f"no such image file: {src}") from err
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise MediaError(f"unreadable image {_describe(item) if isinstance(src, bytes) else src}: {err}") from err
    return img.convert("RGB")


def check_media_cell(value: Any, base_dir: Path) -> str | None:
    """Why a cell cannot be used as images (None when every image opens)."""
    if value is not None and not isinstance(value, (str, bytes, bytearray, dict, list, tuple)) and not _is_pil(value):
        return f"expected an image path, bytes or a list of them, got {type(value).__name__}"
    items = media_items(value)
    if not items:
        return "no image"
    for item in items:
        try:
            load_image(item, base_dir)
        except MediaError as err:
            return str(err)
    return None


# ----------------------------------------------------------------------------- the processor


def is_vision_config(config: Any) -> bool:
    """A vision-language model's config (Qwen2-VL, Qwen2.5-VL and the like carry a vision_config)."""
    return getattr(config, "vision_config", None) is not None


def placeholder_ids(config: Any) -> list[int]:
    """Token ids that stand for media slots (image, video) in a vision-language model's prompts."""
    if not is_vision_config(config):
        return []
    return sorted({i for i in (getattr(config, "image_token_id", None), getattr(config, "video_token_id", None))
                   if isinstance(i, int)})


def mm_messages(prompt: Any, n_images: int, system_prompt: str = "") -> list[dict[str, Any]]:
    """Chat messages with the images first in the user turn (Qwen2-VL's convention); a prompt that is
    already a message list keeps its own image parts, or gets them on its first user turn."""
    if isinstance(prompt, list):
        msgs = [dict(m) for m in prompt]
        has_parts = any(isinstance(m.get("content"), list) and any(
            isinstance(p, dict) and (p.get("type") == "image" or "image" in p) for p in m["content"]) for m in msgs)
        if not has_parts:
            for m in msgs:
                if m.get("role") == "user":
                    m["content"] = [{"type": "image"}] * n_images + [{"type": "text", "text": str(m["content"])}]
                    break
    else:
        msgs = [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": str(prompt)}]}]
    if system_prompt and not any(m.get("role") == "system" for m in msgs):
        msgs = [{"role": "system", "content": system_prompt}, *msgs]
    return msgs


def render_mm_text(row: dict[str, Any], data: Any, tokenizer: Any) -> str:
    """A multimodal row's prompt text, one placeholder per image, without processing any image (previews)."""
    n = len(media_items(row.get(data.images_column)))
    prompt = data.prompt_template.format_map(row) if data.prompt_template else row[data.prompt_column]
    if not getattr(tokenizer, "chat_template", None):
        raise MediaError("multimodal prompts need the tokenizer's chat template (it places the image tokens)")
    return tokenizer.apply_chat_template(mm_messages(prompt, n, data.system_prompt), add_generation_prompt=True,
                                         tokenize=False)


@dataclass(frozen=True)
class MMPrompt:
    text: str  # the rendered prompt, one placeholder per image (what rewards and samples.jsonl see)
    ids: list[int]  # its tokens with each placeholder expanded to the image's patch count
    media: dict[str, torch.Tensor]  # {"pixel_values": (patches, dim), "image_grid_thw": (n_images, 3)}


class VisionProcessor:
    """Image processor + tokenizer, the Qwen2-VL way (placeholder expansion by grid size)."""

    def __init__(self, tokenizer: Any, image_processor: Any, image_token: str = "<|image_pad|>"):
        self.tokenizer, self.image_processor, self.image_token = tokenizer, image_processor, image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        if self.image_token_id is None or self.image_token_id == tokenizer.unk_token_id:
            raise MediaError(f"the tokenizer has no image placeholder token {image_token!r}")
        self.merge = int(getattr(image_processor, "merge_size", 2))

    @classmethod
    def from_pretrained(cls, path: str, tokenizer: Any, trust_remote_code: bool = False) -> VisionProcessor:
        from transformers import AutoImageProcessor

        try:  # the PIL backend needs no torchvision
            ip = AutoImageProcessor.from_pretrained(path, backend="pil", trust_remote_code=trust_remote_code)
        except (TypeError, ValueError):
            ip = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
        return cls(tokenizer, ip, getattr(tokenizer, "image_token", None) or "<|image_pad|>")

    def messages(self, prompt: Any, n_images: int, system_prompt: str = "") -> list[dict[str, Any]]:
        return mm_messages(prompt, n_images, system_prompt)

    def encode(self, messages: list[dict[str, Any]], images: list[Any]) -> MMPrompt:
        if not getattr(self.tokenizer, "chat_template", None):
            raise MediaError("multimodal prompts need the tokenizer's chat template (it places the image tokens)")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.encode_text(text, images)

    def encode_text(self, text: str, images: list[Any]) -> MMPrompt:
        """Expand each image placeholder in `text` to its number of merged patches and tokenize."""
        n_slots = text.count(self.image_token)
        if n_slots != len(images):
            raise MediaError(f"the prompt has {n_slots} image placeholder(s) but the row has {len(images)} image(s)")
        feats = self.image_processor(images=images, return_tensors="pt")
        grid = feats["image_grid_thw"].long()
        parts = text.split(self.image_token)
        pieces = [parts[0]]
        for k, g in enumerate(grid):
            pieces.append(self.image_token * (int(g.prod()) // self.merge ** 2))
            pieces.append(parts[k + 1])
        ids = self.tokenizer("".join(pieces), add_special_tokens=False)["input_ids"]
        return MMPrompt(text, ids, {"pixel_values": feats["pixel_values"].float(), "image_grid_thw": grid})


def render_mm_prompt(row: dict[str, Any], data: Any, vision: VisionProcessor, base_dir: Path) -> MMPrompt:
    """A row with images -> prompt text, token ids and image inputs (data: the RunSpec's DataSection)."""
    images = [load_image(i, base_dir) for i in media_items(row.get(data.images_column))]
    prompt = data.prompt_template.format_map(row) if data.prompt_template else row[data.prompt_column]
    return vision.encode(vision.messages(prompt, len(images), data.system_prompt), images)


# ----------------------------------------------------------------------------- model inputs


def stack_media(items: list[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor] | None:
    """Media of a batch, in row order (the model scatters image features into image tokens row by row);
    None when no row has any."""
    rows = [m for m in items if m]
    if not rows:
        return None
    return {k: torch.cat([m[k] for m in rows], 0) for k in rows[0]}


def _vl_core(model: Any) -> Any:
    """The module that owns get_rope_index (Qwen2VLModel), through PEFT and ForConditionalGeneration wrappers."""
    todo, seen = [model], set()
    while todo:
        m = todo.pop(0)
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        if hasattr(m, "get_rope_index"):
            return m
        todo += [getattr(m, "base_model", None), getattr(m, "model", None)]
    raise MediaError(f"{type(model).__name__} takes no images (no M-RoPE position index)")


def rope_positions(model: Any, ids: torch.Tensor, mask: torch.Tensor, media: dict[str, torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, B, L) M-RoPE positions of left-padded prompts with image tokens, and (B, 1) deltas:
    the position of a text token after the prompt is its unpadded index + delta."""
    core = _vl_core(model)
    cfg = core.config
    types = torch.zeros_like(ids, dtype=torch.int)
    types[ids == cfg.image_token_id] = 1
    types[ids == getattr(cfg, "video_token_id", -1)] = 2
    return core.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=media.get("image_grid_thw"),
                               video_grid_thw=media.get("video_grid_thw"), attention_mask=mask)


def forward_media(media: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in media.items()}
