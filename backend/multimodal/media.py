"""Media cells: reading and validating the images, videos and audio a row's media columns hold.

Contract
- A row's media column (`data.images_column`) holds one image or a list of them; an image is a local
  path (relative paths resolve against the project root), raw bytes, or a datasets Image dict
  ({"bytes": ..., "path": ...}). Remote URLs are refused: nothing is fetched at run time.
- `check_media_cell` (`check_cell` for any kind) says what is wrong with a cell (missing file, unreadable
  image, wrong type) without raising; backend.checks calls it through backend.data's scan so a bad row is
  reported, with its row and column, before a run starts.
- Videos (`data.videos_column`): a cell is one video, an animated GIF/WebP (path, bytes or dict) or a list of
  still frame images of one size; `load_video` gives its RGB frames (evenly sampled down to `max_frames`).
  No torchvision, decord or ffmpeg is involved.
- Audio (`data.audios_column`): a cell is a WAV file (path, bytes or dict) or a list of them, read with
  soundfile when installed, else the stdlib `wave` module (PCM), mono. `check_audio_cell` validates them;
  `audio_feature_extractor` says whether a model's processor takes audio at all (backend.checks refuses the
  column otherwise).

Why a module of its own: reading and checking media needs only PIL (and numpy for audio), no model; the data
scan and the studio's previews use it without loading a processor.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REMOTE_PREFIXES = ("http://", "https://", "ftp://", "s3://", "gs://", "hf://")


class MediaError(ValueError):
    """A media cell or multimodal prompt that cannot be used; the message says why (the checks report it)."""


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


def _source(item: Any, base_dir: Path, noun: str = "image") -> bytes | Path:
    """The bytes or the local file behind one media item; MediaError says why there is none."""
    if isinstance(item, dict):  # datasets' Image / Audio feature: bytes win, else the path
        if item.get("bytes"):
            item = item["bytes"]
        elif item.get("path"):
            item = item["path"]
        else:
            raise MediaError(f"{_a(noun)} dict needs 'bytes' or 'path'")
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if not isinstance(item, str):
        raise MediaError(f"expected {_a(noun)} path, bytes or a list of them, got {type(item).__name__}")
    if item.strip().lower().startswith(REMOTE_PREFIXES):
        raise MediaError(f"remote {noun} {item!r} refused: nothing is downloaded at run time; "
                         "download it and give a local path")
    if not item.strip():
        raise MediaError(f"empty {noun} path")
    return resolve_path(item, base_dir)


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _open(item: Any, base_dir: Path, noun: str = "image"):
    """One image item -> the PIL image as stored (animated files keep their frames), loaded."""
    from PIL import Image, UnidentifiedImageError

    if _is_pil(item):  # a hub dataset's decoded Image feature
        return item
    src = _source(item, base_dir, noun)
    try:
        img = Image.open(io.BytesIO(src) if isinstance(src, bytes) else src)
        img.load()
    except FileNotFoundError as err:
        raise MediaError(f"no such {noun} file: {src}") from err
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise MediaError(f"unreadable {noun} {_describe(item) if isinstance(src, bytes) else src}: {err}") from err
    return img


def load_image(item: Any, base_dir: Path):
    """One image item -> an RGB PIL image (MediaError when missing, remote or unreadable)."""
    return _open(item, base_dir).convert("RGB")


def first_frame(value: Any) -> Any:
    """What a thumbnail of a video cell shows: its first frame file, or the animated file (read as its first frame)."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


def video_items(value: Any) -> list[Any]:
    """A video cell as a list of videos: one per row (None or [] = none)."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return []
    return [value]


def frame_indices(n: int, cap: int) -> list[int]:
    """Which of n frames a video keeps under a cap of `cap` frames (0 = no cap): all when n <= cap, else cap
    evenly spaced ones from the first to the last (frame i*(n-1)/(cap-1), rounded half up)."""
    if cap <= 0 or n <= cap:
        return list(range(n))
    if cap == 1:
        return [0]
    return [int(i * (n - 1) / (cap - 1) + 0.5) for i in range(cap)]


def load_video(value: Any, base_dir: Path, max_frames: int = 0) -> list[Any]:
    """One video cell -> its RGB frames: every frame of an animated GIF/WebP (or one still image), or a list
    of still frame images, at most `max_frames` of them evenly spaced (0 = all; frames left out are not read
    from a list). MediaError when a frame is missing or unreadable, or the frames differ in size."""
    from PIL import ImageSequence

    if isinstance(value, (list, tuple)):
        if not value:
            raise MediaError("an empty list of frames")
        frames = []
        for k in frame_indices(len(value), max_frames):
            item = value[k]
            if isinstance(item, (list, tuple)):
                raise MediaError("a video is an animated image or a list of frame images (one video per row); "
                                 f"frame {k} is a list")
            img = _open(item, base_dir, "video frame")
            if getattr(img, "n_frames", 1) > 1:
                raise MediaError(f"frame {k} ({_describe(item)}) is itself animated: give one animated file, "
                                 "or a list of still frames")
            frames.append(img.convert("RGB"))
    else:
        img = _open(value, base_dir, "video")
        try:
            keep = set(frame_indices(getattr(img, "n_frames", 1), max_frames))
            frames = [f.convert("RGB") for k, f in enumerate(ImageSequence.Iterator(img)) if k in keep]
        except (OSError, ValueError, EOFError) as err:
            raise MediaError(f"unreadable video {_describe(value)}: {err}") from err
    sizes = {f.size for f in frames}
    if len(sizes) > 1:
        raise MediaError(f"video frames differ in size ({', '.join(f'{w}x{h}' for w, h in sorted(sizes))}); "
                         "resize them to one size")
    return frames


def check_video_cell(value: Any, base_dir: Path) -> str | None:
    """Why a cell cannot be used as a video (None when every frame opens)."""
    if value is not None and not isinstance(value, (str, bytes, bytearray, dict, list, tuple)) and not _is_pil(value):
        return f"expected a video path (animated GIF/WebP), bytes or a list of frame paths, got {type(value).__name__}"
    if not video_items(value):
        return "no video"
    try:
        load_video(value, base_dir)
    except MediaError as err:
        return str(err)
    return None


# ----------------------------------------------------------------------------- audio


@dataclass(frozen=True)
class Audio:
    samples: Any  # float32 numpy array, mono, in [-1, 1]
    sampling_rate: int


def load_audio(item: Any, base_dir: Path) -> Audio:
    """One audio item (a WAV path, bytes or an Audio dict) -> mono float32 samples and their rate."""
    import numpy as np

    if isinstance(item, dict) and "array" in item and "sampling_rate" in item:  # datasets' decoded Audio feature
        arr = np.asarray(item["array"], dtype=np.float32)
        return Audio(arr.mean(-1) if arr.ndim > 1 else arr, int(item["sampling_rate"]))
    src = _source(item, base_dir, "audio")
    name = _describe(item) if isinstance(src, bytes) else str(src)
    if isinstance(src, Path) and not src.is_file():
        raise MediaError(f"no such audio file: {src}")
    try:
        import soundfile  # optional: more formats than WAV
    except ImportError:
        soundfile = None
    try:
        if soundfile is not None:
            data, rate = soundfile.read(io.BytesIO(src) if isinstance(src, bytes) else str(src), dtype="float32")
            arr = np.asarray(data, dtype=np.float32)
            return Audio(arr.mean(-1) if arr.ndim > 1 else arr, int(rate))
        return _read_wav(io.BytesIO(src) if isinstance(src, bytes) else src)
    except MediaError:
        raise
    except Exception as err:  # wave.Error, EOFError, soundfile's LibsndfileError...
        raise MediaError(f"unreadable audio {name}: {err}") from err


def _read_wav(f: Any) -> Audio:
    """PCM WAV through the stdlib (8-bit unsigned, 16/24/32-bit signed), channels averaged."""
    import wave

    import numpy as np

    with wave.open(f if not isinstance(f, Path) else str(f), "rb") as w:
        width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
        raw = w.readframes(w.getnframes())
    if width == 1:
        arr = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width in (2, 4):
        arr = np.frombuffer(raw, f"<i{width}").astype(np.float32) / float(2 ** (8 * width - 1))
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        arr = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
    else:
        raise MediaError(f"unsupported WAV sample width {width} bytes")
    arr = arr.reshape(-1, channels).mean(-1) if channels > 1 else arr
    return Audio(arr, rate)


def check_audio_cell(value: Any, base_dir: Path) -> str | None:
    """Why a cell cannot be used as audio (None when every file reads)."""
    if value is not None and not isinstance(value, (str, bytes, bytearray, dict, list, tuple)):
        return f"expected an audio path (WAV), bytes or a list of them, got {type(value).__name__}"
    items = media_items(value)
    if not items:
        return "no audio"
    for item in items:
        try:
            load_audio(item, base_dir)
        except MediaError as err:
            return str(err)
    return None


def audio_feature_extractor(model_dir: Path) -> str | None:
    """The audio feature extractor a model's processor declares (e.g. 'WhisperFeatureExtractor'), or None
    when its processor takes no audio (a text or vision-language model)."""
    import json

    for name in ("preprocessor_config.json", "processor_config.json"):
        try:
            cfg = json.loads((model_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(cfg, dict):
            continue
        sub = cfg.get("feature_extractor") if isinstance(cfg.get("feature_extractor"), dict) else cfg
        kind = sub.get("feature_extractor_type") or ""
        if kind or "audio" in str(cfg.get("processor_class", "")).lower():
            return kind or str(cfg.get("processor_class"))
    return None


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


def check_cell(kind: str, value: Any, base_dir: Path) -> str | None:
    """Why a cell of a media column of `kind` ('image', 'video', 'audio') cannot be used (None when it can)."""
    return {"image": check_media_cell, "video": check_video_cell, "audio": check_audio_cell}[kind](value, base_dir)
