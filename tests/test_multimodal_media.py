"""Video and audio columns, and what the capability check says about media with vLLM.

Video (data.videos_column) on the shipped tiny Qwen2-VL (assets/tiny-vl):
- frames go through the image processor and are laid out as transformers' own Qwen2-VL video processor
  lays them out (its `patchify`, read from the installed transformers source, applied to frames normalised
  here by hand), and a video of two identical frames is exactly the image of that frame;
- a row with a video becomes <|vision_start|> + one <|video_pad|> per merged patch per frame pair + <|vision_end|>;
- the training forward (plain and shared-prompt) gives the rollout engine's logprobs for video rows (mixed
  with image rows in one batch), and both equal transformers' own M-RoPE forward;
- bad video cells are refused by check_spec naming row and column; the trainer runs on a video column.
Audio (data.audios_column), on a random-initialised tiny Qwen2-Audio built in a temp dir: WAV files read with
the stdlib (resampled to the feature extractor's rate), a row becomes one audio placeholder per audio frame
token (hand-counted), the training forward gives the engine's logprobs (and transformers' own forward's), bad
cells are named by row and column, and the column is refused for models whose processor takes no audio.
"""

from __future__ import annotations

import ast
import json
import struct
import textwrap
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoTokenizer

from backend.checks import check_machine, check_spec
from backend.machine import Machine, torchvision_error
from backend.multimodal import (
    MediaError,
    VisionProcessor,
    check_audio_cell,
    check_video_cell,
    first_frame,
    frame_indices,
    load_audio,
    load_image,
    load_video,
    render_mm_prompt,
    stack_media,
)
from backend.rollout.base import PromptInput, SamplingParams
from backend.rollout.hf import HFEngine, left_pad
from backend.spec import load_spec
from backend.train.forward import completion_logits
from backend.train.grpo import selective_log_softmax

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "assets/tiny-vl"
PRESET = ROOT / "presets/tiny-vl-counting-cpu.yaml"


def picture_paths(n: int) -> list[str]:
    with (ROOT / "assets/data/count_test.jsonl").open() as f:
        return [json.loads(next(f))["image"] for _ in range(n)]


def write_gif(path: Path, frames: list[str]) -> Path:
    imgs = [load_image(f, ROOT) for f in frames]
    imgs[0].save(path, save_all=True, append_images=imgs[1:], duration=100, loop=0)
    return path


# ----------------------------------------------------------------------------- video processing


def test_a_video_of_two_identical_frames_is_the_image(vl) -> None:
    _, _, proc = vl
    img = load_image(picture_paths(1)[0], ROOT)
    as_image = proc.encode_text("a<|image_pad|>b", [img])
    as_video = proc.encode_text("a<|video_pad|>b", [], [[img, img]])
    assert torch.equal(as_video.media["pixel_values_videos"], as_image.media["pixel_values"])
    assert as_video.media["video_grid_thw"].tolist() == as_image.media["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert len(as_video.ids) == len(as_image.ids)


def _transformers_video_patchify():
    """Qwen2VLVideoProcessor.patchify, taken from the installed transformers source (its module imports
    torchvision, which the CPU install lacks; the method itself is plain torch)."""
    src = (Path(transformers.__file__).parent / "models/qwen2_vl/video_processing_qwen2_vl.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "patchify")
    ns: dict = {"torch": torch}
    exec(textwrap.dedent(ast.get_source_segment(src, fn)), ns)
    return ns["patchify"]


@pytest.mark.parametrize("n_frames", [3, 4])
def test_video_layout_is_transformers_qwen2_vl_video_layout(vl, n_frames: int) -> None:
    _, _, proc = vl
    frames = [load_image(p, ROOT) for p in picture_paths(n_frames)]
    pixels, grid = proc.video_features(frames)
    # the frames are 112x112: no resize, so normalising by hand gives the processor's pixels
    ip = proc.image_processor
    norm = [(np.asarray(f, dtype=np.float32) / 255.0 - np.array(ip.image_mean)) / np.array(ip.image_std) for f in frames]
    video = torch.tensor(np.stack(norm), dtype=torch.float32).permute(0, 3, 1, 2)[None]  # (1, F, C, H, W)
    ref, t, h, w = _transformers_video_patchify()(None, video, patch_size=14, merge_size=2, temporal_patch_size=2)
    assert grid.tolist() == [[t, h, w]] == [[(n_frames + 1) // 2, 8, 8]]  # an odd frame count repeats the last frame
    torch.testing.assert_close(pixels, ref[0], rtol=0, atol=1e-5)


def test_video_cells_read_animated_files_and_frame_lists(tmp_path: Path) -> None:
    paths = picture_paths(3)
    gif = write_gif(tmp_path / "v.gif", paths)
    assert len(load_video(str(gif), ROOT)) == 3
    assert len(load_video({"bytes": gif.read_bytes()}, ROOT)) == 3
    assert len(load_video(paths, ROOT)) == 3
    webp = tmp_path / "v.webp"
    imgs = [load_image(p, ROOT) for p in paths[:2]]
    imgs[0].save(webp, save_all=True, append_images=imgs[1:], duration=100, lossless=True)
    assert len(load_video(str(webp), ROOT)) == 2
    assert first_frame(paths) == paths[0] and first_frame(str(gif)) == str(gif)
    assert check_video_cell(str(gif), ROOT) is None and check_video_cell(paths, ROOT) is None
    assert check_video_cell([], ROOT) == "no video"
    with pytest.raises(MediaError, match="itself animated"):
        load_video([str(gif), paths[0]], ROOT)


def test_frame_indices_keep_evenly_spaced_frames() -> None:
    assert frame_indices(10, 4) == [0, 3, 6, 9]
    assert frame_indices(6, 4) == [0, 2, 3, 5]  # 0, 1.67, 3.33, 5
    assert frame_indices(4, 3) == [0, 2, 3]  # 1.5 rounds up
    assert frame_indices(5, 1) == [0]
    assert frame_indices(3, 8) == frame_indices(3, 0) == [0, 1, 2]


def test_video_frame_cap_applies_to_files_lists_and_rows(vl, tmp_path: Path) -> None:
    paths = picture_paths(5)
    gif = write_gif(tmp_path / "v.gif", paths)
    full = load_video(str(gif), ROOT)
    capped = load_video(str(gif), ROOT, max_frames=3)
    assert [f.tobytes() for f in capped] == [full[k].tobytes() for k in (0, 2, 4)]
    listed = load_video(paths, ROOT, max_frames=2)
    assert [f.tobytes() for f in listed] == [load_image(paths[k], ROOT).convert("RGB").tobytes() for k in (0, 4)]
    _, _, proc = vl
    row = {"video": str(gif), "problem": "How many?"}
    tokens = {}
    for cap in (0, 2):
        spec = load_spec(PRESET, ["data.images_column=", "data.videos_column=video", f"data.max_video_frames={cap}"])
        tokens[cap] = render_mm_prompt(row, spec.data, proc, ROOT).media["video_grid_thw"].tolist()
    assert tokens[0][0][0] == 3 and tokens[2][0][0] == 1  # temporal patches of 2 frames: 5 -> 3, 2 -> 1


def test_video_row_becomes_video_tokens(vl, tmp_path: Path) -> None:
    _, tok, proc = vl
    gif = write_gif(tmp_path / "v.gif", picture_paths(4))
    spec = load_spec(PRESET, ["data.images_column=", "data.videos_column=video"])
    mm = render_mm_prompt({"video": str(gif), "problem": "How many?"}, spec.data, proc, ROOT)
    assert mm.media["video_grid_thw"].tolist() == [[2, 8, 8]]
    assert set(mm.media) == {"pixel_values_videos", "video_grid_thw"}
    start, pad, end = tok.convert_tokens_to_ids(["<|vision_start|>", "<|video_pad|>", "<|vision_end|>"])
    i = mm.ids.index(start)
    assert mm.ids[i + 1:i + 1 + 32] == [pad] * 32 and mm.ids[i + 33] == end  # 2 frame pairs x 16 merged patches
    assert mm.text.count("<|video_pad|>") == 1 and mm.ids.count(pad) == 32


def _engine_matches_training_forward(model, tok, mms: list, G: int, max_tokens: int, seed: int) -> list:
    """Sample G completions per rendered prompt with the hf engine; assert the training forward (plain and
    shared-prompt) gives the engine's logprobs. Returns the completions, group by group."""
    groups = HFEngine(model, tok).generate([PromptInput(m.ids, m.media) for m in mms],
                                           SamplingParams(n=G, max_tokens=max_tokens, temperature=1.0, seed=seed))
    comps = [c for g in groups for c in g]
    p_ids, p_mask = left_pad([m.ids for m in mms for _ in range(G)], tok.pad_token_id)
    Lc = max(len(c.token_ids) for c in comps)
    c_ids = torch.full((len(comps), Lc), tok.pad_token_id)
    c_mask = torch.zeros((len(comps), Lc), dtype=torch.long)
    engine_lp = torch.zeros((len(comps), Lc))
    for i, c in enumerate(comps):
        c_ids[i, :len(c.token_ids)] = torch.tensor(c.token_ids)
        c_mask[i, :len(c.token_ids)] = 1
        engine_lp[i, :len(c.logprobs)] = torch.tensor(c.logprobs)
    media = [m.media for m in mms for _ in range(G)]
    with torch.no_grad():
        plain = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, None, media), c_ids)
        shared = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, G, media), c_ids)
    torch.testing.assert_close(plain * c_mask, engine_lp * c_mask, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(shared * c_mask, engine_lp * c_mask, rtol=1e-4, atol=1e-4)
    return comps


def test_training_forward_matches_engine_logprobs_for_video_rows(vl, tmp_path: Path) -> None:
    model, tok, proc = vl
    paths = picture_paths(5)
    data = load_spec(PRESET, ["data.videos_column=video"]).data
    rows = [{"video": str(write_gif(tmp_path / "a.gif", paths[:3])), "problem": "How many objects are there?"},
            {"image": paths[4], "problem": "Count."},  # an image row in the same batch: media kinds mix
            {"video": paths[1:5], "image": paths[0], "problem": "And here?"}]
    mms = [render_mm_prompt(r, data, proc, ROOT) for r in rows]
    G = 3
    comps = _engine_matches_training_forward(model, tok, mms, G, max_tokens=10, seed=5)
    # reference: transformers' own forward (it computes M-RoPE for images and videos itself), row by row
    cfg = model.config
    for k, m in enumerate(mms):
        c = comps[k * G]
        full = torch.tensor([m.ids + c.token_ids])
        types = (full == cfg.image_token_id).int() + 2 * (full == cfg.video_token_id).int()
        with torch.no_grad():
            logits = model(input_ids=full, mm_token_type_ids=types, **m.media).logits[0, len(m.ids) - 1:-1]
        ref = selective_log_softmax(logits[None], torch.tensor([c.token_ids]))[0]
        torch.testing.assert_close(ref, torch.tensor(c.logprobs), rtol=1e-4, atol=1e-4)


def test_stack_media_concatenates_each_kind_over_the_rows_that_have_it() -> None:
    a = {"pixel_values": torch.zeros(2, 3), "image_grid_thw": torch.tensor([[1, 2, 1]])}
    b = {"pixel_values_videos": torch.ones(4, 3), "video_grid_thw": torch.tensor([[2, 2, 1]])}
    out = stack_media([a, None, b, a])
    assert out["pixel_values"].shape == (4, 3) and out["image_grid_thw"].tolist() == [[1, 2, 1]] * 2
    assert out["video_grid_thw"].tolist() == [[2, 2, 1]] and torch.equal(out["pixel_values_videos"], b["pixel_values_videos"])


# ----------------------------------------------------------------------------- checks


def _spec(tmp_path: Path, lines: list[dict], *overrides: str):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return load_spec(PRESET, [f"data.sources=[{data}]", "data.eval_sources=[]", "output.eval_steps=0", *overrides])


def _issues(spec, fld: str) -> list[str]:
    return [i.message for i in check_spec(spec, ROOT) if i.field == fld]


def test_good_video_rows_pass_the_check(tmp_path: Path) -> None:
    gif = write_gif(tmp_path / "v.gif", picture_paths(2))
    rows = [{"video": str(gif), "image": picture_paths(1)[0], "problem": "How many?", "solution": "<answer>2</answer>"},
            {"video": picture_paths(3), "image": picture_paths(1)[0], "problem": "How many?", "solution": "<answer>2</answer>"}]
    assert check_spec(_spec(tmp_path, rows, "data.videos_column=video"), ROOT) == []


@pytest.mark.parametrize("cell, words", [
    ("missing.gif", ["line 2", "no such video file", "missing.gif", "'video'"]),
    ("notes.txt", ["line 2", "unreadable video", "'video'"]),
    (7, ["line 2", "expected a video path", "int", "'video'"]),
    (["FRAME", "missing.png"], ["line 2", "no such video frame file", "'video'"]),
    (["FRAME", "SMALL"], ["line 2", "frames differ in size", "'video'"]),
])
def test_bad_video_is_refused_naming_row_and_column(tmp_path: Path, cell, words: list[str]) -> None:
    (tmp_path / "notes.txt").write_text("not a video")
    load_image(picture_paths(1)[0], ROOT).resize((56, 56)).save(tmp_path / "small.png")
    subst = {"FRAME": picture_paths(1)[0], "SMALL": str(tmp_path / "small.png")}
    if isinstance(cell, list):
        cell = [subst.get(c, str(tmp_path / c)) for c in cell]
    elif isinstance(cell, str):
        cell = str(tmp_path / cell)
    good = {"video": picture_paths(2), "image": picture_paths(1)[0], "problem": "How many?", "solution": "<answer>2</answer>"}
    msgs = _issues(_spec(tmp_path, [good, {**good, "video": cell}], "data.videos_column=video"), "data.videos_column")
    assert len(msgs) == 1, msgs
    assert all(w in msgs[0] for w in words), msgs[0]


def test_media_columns_need_a_model_that_takes_them(tmp_path: Path) -> None:
    rows = [{"video": picture_paths(2), "image": picture_paths(1)[0], "problem": "How many?", "solution": "2"}]
    text_model = _spec(tmp_path, rows, "data.videos_column=video", f"model.name_or_path={ROOT / 'assets/tiny-add'}")
    msg = _issues(text_model, "data.videos_column")
    assert len(msg) == 1 and "'video'" in msg[0] and "text-only model" in msg[0]
    # an image-only vision-language model: its config has no video placeholder token
    novid = tmp_path / "no-video-vl"
    novid.mkdir()
    for f in MODEL.iterdir():
        (novid / f.name).symlink_to(f)
    cfg = json.loads((MODEL / "config.json").read_text())
    del cfg["video_token_id"]
    (novid / "config.json").unlink()
    (novid / "config.json").write_text(json.dumps(cfg))
    msg = _issues(_spec(tmp_path, rows, "data.videos_column=video", f"model.name_or_path={novid}"), "data.videos_column")
    assert len(msg) == 1 and "takes no video" in msg[0]


def test_vllm_with_media_is_refused_where_vllm_cannot_run_qwen2_vl(tmp_path: Path) -> None:
    """vLLM 0.32's Qwen2-VL code needs torchvision; the CPU vLLM profile has none that loads (see backend.checks)."""
    rows = [{"video": picture_paths(2), "image": picture_paths(1)[0], "problem": "How many?", "solution": "2"}]
    machine = Machine(engines=frozenset({"hf", "vllm"}))
    images = _spec(tmp_path, rows, "rollout.engine=vllm")
    msgs = [i.message for i in check_machine(images, machine, ROOT) if i.field == "rollout.engine"]
    import sys

    if torchvision_error(sys.executable) is None:
        assert msgs == []
    else:
        assert len(msgs) == 1 and "torchvision" in msgs[0] and "engine hf" in msgs[0]
    vllm_python = ROOT / ".venv-vllm/bin/python"
    if vllm_python.is_file():  # the CPU vLLM profile: its torchvision is removed (a CUDA build breaks `import vllm`)
        assert torchvision_error(str(vllm_python)) is not None
    video = _spec(tmp_path, rows, "rollout.engine=vllm", "data.images_column=", "data.videos_column=video")
    msgs = [i.message for i in check_machine(video, machine, ROOT) if i.field == "rollout.engine"]
    assert len(msgs) == 1 and "video prompts run with engine hf" in msgs[0]
    assert not [i for i in check_machine(_spec(tmp_path, rows), machine, ROOT) if i.field == "rollout.engine"]


# ----------------------------------------------------------------------------- audio


def write_wav(path: Path, samples: list[int], channels: int = 1, width: int = 2, rate: int = 16000) -> Path:
    fmt = {1: "B", 2: "h", 4: "i"}[width]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(struct.pack(f"<{len(samples)}{fmt}", *samples))
    return path


def test_wav_files_read_as_mono_float_samples(tmp_path: Path) -> None:
    mono = load_audio(str(write_wav(tmp_path / "m.wav", [0, 16384, -32768, 32767])), ROOT)
    assert mono.sampling_rate == 16000
    np.testing.assert_allclose(mono.samples, [0.0, 0.5, -1.0, 32767 / 32768])
    stereo = load_audio(str(write_wav(tmp_path / "s.wav", [16384, 0, -16384, -16384], channels=2, rate=8000)), ROOT)
    assert stereo.sampling_rate == 8000
    np.testing.assert_allclose(stereo.samples, [0.25, -0.5])  # channels averaged
    u8 = load_audio(write_wav(tmp_path / "u.wav", [128, 192, 0], width=1).read_bytes(), ROOT)  # bytes, 8-bit
    np.testing.assert_allclose(u8.samples, [0.0, 0.5, -1.0])
    assert check_audio_cell([str(tmp_path / "m.wav"), str(tmp_path / "s.wav")], ROOT) is None


@pytest.mark.parametrize("cell, words", [
    ("missing.wav", ["no such audio file", "missing.wav"]),
    ("notes.txt", ["unreadable audio", "notes.txt"]),
    (3.5, ["expected an audio path", "float"]),
    ("https://example.org/a.wav", ["remote audio", "refused"]),
])
def test_bad_audio_cells_say_why(tmp_path: Path, cell, words: list[str]) -> None:
    (tmp_path / "notes.txt").write_text("not audio")
    why = check_audio_cell(str(tmp_path / cell) if isinstance(cell, str) and not cell.startswith("http") else cell, ROOT)
    assert why and all(w in why for w in words), why


@pytest.fixture(scope="module")
def tiny_audio(tmp_path_factory) -> Path:
    """A random-initialised tiny Qwen2-Audio (1-layer Whisper-style encoder, 2-layer Qwen2), tokenizer and
    processor, saved as a model directory: the shipped tiny-vl character tokenizer plus the audio tokens, a
    Whisper feature extractor of 16 mel bins over 1-second windows."""
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor, WhisperFeatureExtractor

    d = tmp_path_factory.mktemp("tiny-audio")
    tok = AutoTokenizer.from_pretrained(MODEL)
    tok.add_tokens(["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"], special_tokens=True)
    cfg = Qwen2AudioConfig(
        audio_config={"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
                      "num_mel_bins": 16, "max_source_positions": 50},
        text_config={"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": len(tok),
                     "eos_token_id": tok.eos_token_id},
        audio_token_id=tok.convert_tokens_to_ids("<|AUDIO|>"))
    torch.manual_seed(0)
    model = Qwen2AudioForConditionalGeneration(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    tok.save_pretrained(d)
    Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=16, chunk_length=1), tokenizer=tok).save_pretrained(d)
    model.save_pretrained(d)
    return d


def tone(path: Path, seconds: float, rate: int = 16000, hz: float = 440.0) -> Path:
    t = np.arange(int(seconds * rate)) / rate
    return write_wav(path, [int(v) for v in 12000 * np.sin(2 * np.pi * hz * t)], rate=rate)


def test_audio_column_needs_a_processor_that_takes_audio(tmp_path: Path, tiny_audio: Path) -> None:
    wav = tone(tmp_path / "a.wav", 0.25)
    rows = [{"audio": str(wav), "image": picture_paths(1)[0], "problem": "What is it?", "solution": "2"}]
    msgs = _issues(_spec(tmp_path, rows, "data.audios_column=audio"), "data.audios_column")
    assert len(msgs) == 1 and "'audio'" in msgs[0] and "tiny-vl" in msgs[0] and "takes no audio" in msgs[0]
    audio_spec = [f"model.name_or_path={tiny_audio}", "data.audios_column=audio", "data.images_column="]
    assert check_spec(_spec(tmp_path, rows, *audio_spec), ROOT) == []
    bad = _spec(tmp_path, [rows[0], {**rows[0], "audio": str(tmp_path / "gone.wav")}], *audio_spec)
    msgs = _issues(bad, "data.audios_column")
    assert len(msgs) == 1 and "line 2" in msgs[0] and "no such audio file" in msgs[0] and "'audio'" in msgs[0], msgs
    both = _issues(_spec(tmp_path, rows, f"model.name_or_path={tiny_audio}", "data.audios_column=audio"), "data.images_column")
    assert len(both) == 1 and "audio-language model" in both[0]
    vllm = [i.message for i in check_machine(_spec(tmp_path, rows, *audio_spec, "rollout.engine=vllm"),
                                             Machine(engines=frozenset({"hf", "vllm"})), ROOT) if i.field == "rollout.engine"]
    assert len(vllm) == 1 and "audio prompts run with engine hf" in vllm[0]


def test_audio_row_becomes_one_placeholder_per_audio_frame_token(tmp_path: Path, tiny_audio: Path) -> None:
    from backend.multimodal import AudioProcessor

    proc = AudioProcessor.from_pretrained(str(tiny_audio))
    data = load_spec(PRESET, ["data.images_column=", "data.audios_column=audio"]).data
    audio_id = proc.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    # 0.25 s at 16 kHz = 4000 samples = 25 mel frames (hop 160) -> conv stride 2: 13 -> pool 2: 6 tokens
    mm = render_mm_prompt({"audio": str(tone(tmp_path / "a.wav", 0.25)), "problem": "What?"}, data, proc, ROOT)
    assert mm.ids.count(audio_id) == 6 and mm.text.count("<|AUDIO|>") == 1
    assert tuple(mm.media["input_features"].shape) == (1, 16, 100) and int(mm.media["feature_attention_mask"].sum()) == 25
    # the same length at 8 kHz is resampled to 16 kHz first: the same number of tokens
    mm8 = render_mm_prompt({"audio": str(tone(tmp_path / "b.wav", 0.25, rate=8000)), "problem": "What?"}, data, proc, ROOT)
    assert mm8.ids.count(audio_id) == 6
    two = render_mm_prompt({"audio": [str(tmp_path / "a.wav"), str(tone(tmp_path / "c.wav", 0.5))], "problem": "Q"},
                           data, proc, ROOT)
    assert two.ids.count(audio_id) == 6 + 12  # 0.5 s: 50 mel frames -> 25 -> 12 tokens
    assert two.media["input_features"].shape[0] == 2


def test_training_forward_matches_engine_logprobs_for_audio_rows(tmp_path: Path, tiny_audio: Path) -> None:
    from backend.models import model_class
    from backend.multimodal import AudioProcessor

    model = model_class(str(tiny_audio)).from_pretrained(tiny_audio, dtype=torch.float32).eval()
    proc = AudioProcessor.from_pretrained(str(tiny_audio))
    tok = proc.tokenizer
    data = load_spec(PRESET, ["data.images_column=", "data.audios_column=audio"]).data
    rows = [{"audio": str(tone(tmp_path / "a.wav", 0.25)), "problem": "What is this sound?"},
            {"audio": str(tone(tmp_path / "b.wav", 0.6, hz=220)), "problem": "And this?"}]  # longer: more audio tokens
    mms = [render_mm_prompt(r, data, proc, ROOT) for r in rows]
    assert len(mms[0].ids) != len(mms[1].ids)  # left padding in the batch
    G = 3
    comps = _engine_matches_training_forward(model, tok, mms, G, max_tokens=8, seed=2)
    for k, m in enumerate(mms):  # reference: transformers' own forward on the processor's output, unpadded
        c = comps[k * G]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([m.ids + c.token_ids]), **m.media).logits[0, len(m.ids) - 1:-1]
        ref = selective_log_softmax(logits[None], torch.tensor([c.token_ids]))[0]
        torch.testing.assert_close(ref, torch.tensor(c.logprobs), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- the trainer


def test_trainer_runs_on_a_video_column(tmp_path: Path) -> None:
    from backend.rundir import create_run, read_jsonl
    from backend.train.loop import GRPOTrainer

    paths = picture_paths(4)
    rows = [{"video": str(write_gif(tmp_path / f"v{i}.gif", paths[i:i + 3])) if i % 2 else paths[i:i + 2],
             "problem": "How many objects are there?", "solution": "<answer>3</answer>"} for i in range(2)]
    spec = _spec(tmp_path, rows, "data.images_column=", "data.videos_column=video", f"output.runs_dir={tmp_path}",
                 "algorithm.max_steps=1", "algorithm.prompts_per_step=2", "rollout.num_generations=2",
                 "rollout.max_completion_length=6", "output.save_steps=0")
    assert check_spec(spec, ROOT) == []
    run = create_run(spec, ROOT)
    assert GRPOTrainer(spec, run, ROOT).setup().train() == "finished"
    samples = read_jsonl(run.samples_path)[0]
    assert len(samples) == 4
    assert all(s["prompt"].count("<|video_pad|>") == 1 and s["videos"] for s in samples)
    assert {len(s["videos"]) for s in samples} == {1, 2}  # a GIF file, or its list of frame files
    assert read_jsonl(run.metrics_path)[0][0]["step"] == 1


def test_vllm_prompts_carry_the_images_and_the_unexpanded_placeholders(vl) -> None:
    from backend.rollout.base import RawMedia
    from backend.rollout.vllm_engine import vllm_prompt

    _, tok, proc = vl
    data = load_spec(PRESET).data
    mm = render_mm_prompt({"image": picture_paths(1)[0], "problem": "How many?"}, data, proc, ROOT)
    raw = RawMedia(tok(mm.text, add_special_tokens=False)["input_ids"], list(mm.images))
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    out = vllm_prompt(PromptInput(mm.ids, mm.media, raw_media=raw))
    assert out["prompt_token_ids"].count(pad) == 1 and mm.ids.count(pad) == 16  # vLLM expands it to the 16 patches
    assert out["multi_modal_data"]["image"][0].size == (112, 112)
    assert vllm_prompt(PromptInput([1, 2, 3])) == {"prompt_token_ids": [1, 2, 3]}
    with pytest.raises(ValueError, match="needs its images"):
        vllm_prompt(PromptInput(mm.ids, mm.media))


def test_trainer_runs_on_an_audio_column(tmp_path: Path, tiny_audio: Path) -> None:
    from backend.rundir import create_run, read_jsonl
    from backend.train.loop import GRPOTrainer

    rows = [{"audio": str(tone(tmp_path / f"t{i}.wav", 0.2 + 0.1 * i, hz=200 * (i + 1))), "problem": "Which tone?",
             "solution": "<answer>1</answer>"} for i in range(2)]
    spec = _spec(tmp_path, rows, f"model.name_or_path={tiny_audio}", "data.images_column=", "data.audios_column=audio",
                 f"output.runs_dir={tmp_path}", "algorithm.max_steps=1", "algorithm.prompts_per_step=2",
                 "rollout.num_generations=2", "rollout.max_completion_length=6", "output.save_steps=1")
    assert check_spec(spec, ROOT) == []
    run = create_run(spec, ROOT)
    assert GRPOTrainer(spec, run, ROOT).setup().train() == "finished"
    samples = read_jsonl(run.samples_path)[0]
    assert len(samples) == 4 and all(s["prompt"].count("<|AUDIO|>") == 1 and len(s["audios"]) == 1 for s in samples)
    ckpt = run.latest_checkpoint() / "model"  # a checkpoint takes audio again: its processor is saved beside it
    assert check_spec(_spec(tmp_path, rows, f"model.name_or_path={ckpt}", "data.images_column=", "data.audios_column=audio"),
                      ROOT) == []


# ----------------------------------------------------------------------------- the studio


def test_studio_shows_a_videos_first_frame(tmp_path: Path) -> None:
    import base64
    import io

    from PIL import Image

    from app.media import thumb_uris
    from app.paths import Workspace
    from app.samples_view import render_step

    paths = picture_paths(3)
    gif = write_gif(tmp_path / "v.gif", paths[::-1])
    for cell, first, ws in ((paths, paths[0], Workspace(ROOT)), ("v.gif", paths[-1], Workspace(tmp_path))):
        uris = thumb_uris(first_frame(cell), ws)
        assert len(uris) == 1
        shown = Image.open(io.BytesIO(base64.b64decode(uris[0].split(",", 1)[1]))).convert("RGB")
        assert np.array_equal(np.asarray(shown), np.asarray(load_image(first, ROOT)))  # the first frame, not another
    assert gif.is_file()
    samples = [{"group": g, "prompt": "p", "completion": f"c{k}", "reward": float(k), "videos": [f"f{g}a.png", f"f{g}b.png"]}
               for g in range(2) for k in range(2)]
    out = render_step(samples, image_uris=lambda refs: [f"data:image/png;base64,{r}" for r in refs])
    assert out.count('class="gs-thumb"') == 2 and "f0a.png" in out and "f0b.png" not in out  # one first frame per group


def test_frames_take_the_video_processors_pixel_budget_when_the_model_ships_one(tmp_path: Path) -> None:
    model = tmp_path / "vl"
    model.mkdir()
    for f in MODEL.iterdir():
        (model / f.name).symlink_to(f)
    # Qwen2-VL's video processor config: 56x56 = 3136 pixels per frame -> 4x4 patches of 14 px (112 px frames shrink)
    (model / "video_preprocessor_config.json").write_text(json.dumps({"size": {"shortest_edge": 3136, "longest_edge": 3136}}))
    proc = VisionProcessor.from_pretrained(str(model), AutoTokenizer.from_pretrained(MODEL))
    frames = [load_image(p, ROOT) for p in picture_paths(2)]
    pixels, grid = proc.video_features(frames)
    assert grid.tolist() == [[1, 4, 4]] and pixels.shape == (16, 3 * 2 * 14 * 14)
    assert proc.encode_text("<|image_pad|>", frames[:1]).media["image_grid_thw"].tolist() == [[1, 8, 8]]  # images: unchanged
