"""Multimodal prompts: the door of the room. Importers use `from backend.multimodal import X` only.

Three layers, one module each (an importer need not know which):
- `media.py`: reading and validating the media cells of a row (images, videos, audio; the WAV reader);
- `processors.py`: the vision and audio processors (a row to prompt text, token ids and media tensors,
  Qwen2-VL's video layout included);
- `mrope.py`: the model's media inputs (a batch's media, M-RoPE positions, token types).
Each module's docstring states its contract.
"""

from backend.multimodal.media import (
    Audio,
    MediaError,
    audio_feature_extractor,
    check_audio_cell,
    check_cell,
    check_media_cell,
    check_video_cell,
    first_frame,
    frame_indices,
    load_audio,
    load_image,
    load_video,
    media_items,
    media_ref,
)
from backend.multimodal.mrope import forward_media, media_positions, mm_token_types, rope_positions, stack_media
from backend.multimodal.processors import (
    AudioProcessor,
    MMPrompt,
    VisionProcessor,
    is_audio_config,
    is_vision_config,
    placeholder_ids,
    render_mm_prompt,
    render_mm_text,
)

__all__ = [
    "Audio", "AudioProcessor", "MMPrompt", "MediaError", "VisionProcessor", "audio_feature_extractor", "check_audio_cell",
    "check_cell", "check_media_cell", "check_video_cell", "first_frame", "forward_media", "frame_indices",
    "is_audio_config", "is_vision_config", "load_audio", "load_image", "load_video", "media_items", "media_positions",
    "media_ref", "mm_token_types", "placeholder_ids", "render_mm_prompt", "render_mm_text", "rope_positions", "stack_media",
]
