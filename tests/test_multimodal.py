"""Multimodal GRPO pieces on the shipped tiny Qwen2-VL (assets/tiny-vl):

- a row with an image becomes exactly the expected token sequence (image placeholders expanded to the
  image's merged-patch count) and the expected pixel inputs;
- the training forward (plain and shared-prompt) gives the rollout engine's logprobs for the same weights,
  and both agree with transformers' own M-RoPE forward (the reference implementation);
- bad media (missing file, unreadable image, wrong type, remote URL) is refused by check_spec, naming
  row and column, before anything trains;
- the trainer records image references in samples.jsonl, saves checkpoints that take images, shards
  images with their rows, and its GRPO update moves image-prompt logprobs with the advantage;
- the studio shows images (dataset preview, samples browser), only from inside the workspace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText

from backend.checks import check_spec
from backend.models import model_class
from backend.multimodal import check_media_cell, media_ref, render_mm_prompt
from backend.rollout.base import PromptInput, SamplingParams
from backend.rollout.hf import HFEngine, left_pad
from backend.spec import load_spec
from backend.train.forward import completion_logits
from backend.train.grpo import selective_log_softmax

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "assets/tiny-vl"
PRESET = ROOT / "presets/tiny-vl-counting-cpu.yaml"


def rows(n: int = 3) -> list[dict]:
    with (ROOT / "assets/data/count_test.jsonl").open() as f:
        return [json.loads(next(f)) for _ in range(n)]


def test_model_class_picks_the_vision_language_auto_class() -> None:
    assert model_class(str(MODEL)) is AutoModelForImageTextToText


def test_row_becomes_the_expected_tokens_with_image_tokens(vl) -> None:
    _, tok, proc = vl
    spec = load_spec(PRESET)
    mm = render_mm_prompt(rows(1)[0], spec.data, proc, ROOT)
    # 112x112 px -> 8x8 patches of 14 px -> merged 2x2 -> 16 image tokens
    assert mm.media["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert tuple(mm.media["pixel_values"].shape) == (64, 3 * 2 * 14 * 14)
    ids = tok.convert_tokens_to_ids

    def chars(s: str) -> list[int]:
        return [ids(c) for c in s]

    system = spec.data.system_prompt
    expected = ([ids("<|im_start|>")] + chars("system\n" + system) + [ids("<|im_end|>")] + chars("\n") if system else [])
    expected += ([ids("<|im_start|>")] + chars("user\n") + [ids("<|vision_start|>")] + [ids("<|image_pad|>")] * 16
                 + [ids("<|vision_end|>")] + chars("How many objects are there?") + [ids("<|im_end|>")] + chars("\n")
                 + [ids("<|im_start|>")] + chars("assistant\n"))
    assert mm.ids == expected
    assert mm.text.count("<|image_pad|>") == 1  # the readable text keeps one placeholder per image


def test_placeholders_must_match_the_images(vl) -> None:
    _, _, proc = vl
    from backend.multimodal import MediaError, load_image

    img = load_image(rows(1)[0]["image"], ROOT)
    with pytest.raises(MediaError, match="1 image placeholder"):
        proc.encode([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}], [img, img])


def _engine_completions(model, tok, prompts, n=3, max_tokens=12):
    eng = HFEngine(model, tok)
    return eng.generate(prompts, SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0, seed=1))


def test_training_forward_matches_rollout_logprobs(vl) -> None:
    model, tok, proc = vl
    spec = load_spec(PRESET)
    rs = rows(3)
    rs[1]["problem"] = "Count them."  # a shorter prompt: left padding shifts its M-RoPE grid
    mms = [render_mm_prompt(r, spec.data, proc, ROOT) for r in rs]
    G = 3
    groups = _engine_completions(model, tok, [PromptInput(m.ids, m.media) for m in mms], n=G)
    comps = [c for g in groups for c in g]
    p_ids, p_mask = left_pad([m.ids for m in mms for _ in range(G)], tok.pad_token_id)
    Lc = max(len(c.token_ids) for c in comps)
    c_ids = torch.full((len(comps), Lc), tok.pad_token_id)
    c_mask = torch.zeros((len(comps), Lc), dtype=torch.long)
    for i, c in enumerate(comps):
        c_ids[i, :len(c.token_ids)] = torch.tensor(c.token_ids)
        c_mask[i, :len(c.token_ids)] = 1
    engine_lp = torch.zeros((len(comps), Lc))
    for i, c in enumerate(comps):
        engine_lp[i, :len(c.logprobs)] = torch.tensor(c.logprobs)
    media = [m.media for m in mms for _ in range(G)]
    with torch.no_grad():
        plain = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, None, media), c_ids)
        shared = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, G, media), c_ids)
    torch.testing.assert_close(plain * c_mask, engine_lp * c_mask, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(shared * c_mask, engine_lp * c_mask, rtol=1e-4, atol=1e-4)

    # reference: transformers' own forward (it computes M-RoPE itself), one unpadded row at a time
    for k, m in enumerate(mms):
        c = comps[k * G]
        full = torch.tensor([m.ids + c.token_ids])
        types = (full == model.config.image_token_id).int()
        with torch.no_grad():
            logits = model(input_ids=full, mm_token_type_ids=types, **m.media).logits[0, len(m.ids) - 1:-1]
        ref = selective_log_softmax(logits[None], torch.tensor([c.token_ids]))[0]
        torch.testing.assert_close(ref, torch.tensor(c.logprobs), rtol=1e-4, atol=1e-4)


def test_shared_prompt_gradients_match_plain_with_images(vl) -> None:
    model, tok, proc = vl
    model = AutoModelForImageTextToText.from_pretrained(MODEL, dtype=torch.float32)  # own copy: it gets gradients
    spec = load_spec(PRESET)
    rs = rows(2)
    rs[0]["problem"] = "Count them."
    mms = [render_mm_prompt(r, spec.data, proc, ROOT) for r in rs]
    G = 2
    p_ids, p_mask = left_pad([m.ids for m in mms for _ in range(G)], tok.pad_token_id)
    torch.manual_seed(0)
    c_ids = torch.randint(10, 60, (len(mms) * G, 5))
    c_mask = torch.ones_like(c_ids)
    c_mask[1, 3:] = 0
    media = [m.media for m in mms for _ in range(G)]

    def grads(group):
        model.zero_grad()
        lp = selective_log_softmax(completion_logits(model, p_ids, p_mask, c_ids, c_mask, group, media), c_ids)
        (lp * c_mask).sum().backward()
        return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    lp_plain, g_plain = grads(None)
    lp_shared, g_shared = grads(G)
    torch.testing.assert_close(lp_shared * c_mask, lp_plain * c_mask, rtol=1e-4, atol=1e-5)
    assert any(n.startswith("model.visual") for n in g_plain)  # the vision tower trains too
    assert g_plain.keys() == g_shared.keys()
    for name in g_plain:
        torch.testing.assert_close(g_shared[name], g_plain[name], rtol=1e-3, atol=1e-5)


# ----------------------------------------------------------------------------- bad media


def _spec_with_rows(tmp_path: Path, lines: list[str]):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(lines) + "\n")
    return load_spec(PRESET, [f"data.sources=[{data}]", "data.eval_sources=[]", "output.eval_steps=0"])


def _image_issues(spec) -> list[str]:
    return [str(i) for i in check_spec(spec, ROOT) if i.field == "data.images_column"]


def test_good_rows_pass_the_check() -> None:
    assert check_spec(load_spec(PRESET), ROOT) == []


@pytest.mark.parametrize("cell, words", [
    ('"assets/data/nope.png"', ["line 2", "'image'", "no such image file"]),
    ('"BROKEN"', ["line 2", "'image'", "unreadable image"]),
    ("42", ["line 2", "'image'", "got int"]),
    ('"https://example.com/cat.png"', ["line 2", "'image'", "remote image", "refused"]),
])
def test_bad_media_is_refused_naming_row_and_column(tmp_path: Path, cell: str, words: list[str]) -> None:
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png at all")
    cell = cell.replace("BROKEN", str(broken))
    good = json.dumps(rows(1)[0])
    spec = _spec_with_rows(tmp_path, [good, f'{{"image": {cell}, "problem": "How many?", "solution": "1"}}'])
    issues = _image_issues(spec)
    assert len(issues) == 1, issues
    for w in words:
        assert w in issues[0], issues[0]


def test_images_need_a_vision_language_model(tmp_path: Path) -> None:
    spec = load_spec(PRESET, ["model.name_or_path=assets/tiny-add"])
    assert any("text-only model" in m for m in _image_issues(spec))


def test_media_cells_accept_paths_bytes_dicts_and_lists(tmp_path: Path) -> None:
    path = rows(1)[0]["image"]
    raw = (ROOT / path).read_bytes()
    for cell in (path, raw, {"bytes": raw, "path": None}, {"path": path}, [path, raw]):
        assert check_media_cell(cell, ROOT) is None, cell
    assert check_media_cell([], ROOT) == "no image"
    assert media_ref([path, raw]) == [path, f"<{len(raw)} bytes>"]


# ----------------------------------------------------------------------------- studio


def test_studio_thumbnails_stay_inside_the_workspace(tmp_path: Path) -> None:
    from app.media import thumb_uris
    from app.paths import Workspace

    path = rows(1)[0]["image"]
    raw = (ROOT / path).read_bytes()
    ws = Workspace(ROOT)
    uris = thumb_uris([path, raw, {"bytes": raw}, f"<{len(raw)} bytes>"], ws)
    assert len(uris) == 3 and all(u.startswith("data:image/png;base64,") for u in uris)
    outside = tmp_path / "x.png"
    outside.write_bytes(raw)
    assert thumb_uris(str(outside), ws) == []  # outside the workspace: not shown
    assert thumb_uris("assets/data/nope.png", ws) == []


def test_samples_browser_shows_each_groups_image() -> None:
    from app.samples_view import render_step

    samples = [{"group": g, "prompt": "p", "completion": f"c{k}", "reward": float(k), "images": [f"img{g}.png"]}
               for g in range(2) for k in range(2)]
    out = render_step(samples, image_uris=lambda refs: [f"data:image/png;base64,{refs[0]}"])
    assert out.count('class="gs-thumb"') == 2  # one picture per group, not per completion
    assert "base64,img0.png" in out and "base64,img1.png" in out
    assert 'class="gs-thumb"' not in render_step(samples)  # no resolver: nothing shown


def test_dataset_preview_renders_image_placeholders() -> None:
    from app.data_preview import preview_rows

    got, note = preview_rows(load_spec(PRESET), ROOT, n=2)
    assert note == "" and len(got) == 2
    assert got[0]["rendered"].count("<|image_pad|>") == 1 and "How many objects are there?" in got[0]["rendered"]
    assert got[0]["images"] == [got[0]["columns"]["image"]]


# ----------------------------------------------------------------------------- the trainer


def test_trainer_writes_image_references_and_a_loadable_checkpoint(tmp_path: Path) -> None:
    from backend.rundir import create_run, read_jsonl
    from backend.train.loop import GRPOTrainer

    spec = load_spec(PRESET, [f"output.runs_dir={tmp_path}", "algorithm.max_steps=1", "algorithm.prompts_per_step=2",
                              "rollout.num_generations=2", "rollout.max_completion_length=8", "output.eval_steps=0",
                              "output.save_steps=0", "data.eval_sources=[]"])
    run = create_run(spec, ROOT)
    GRPOTrainer(spec, run, ROOT).setup().train()
    samples = read_jsonl(run.samples_path)[0]
    assert len(samples) == 4
    for s in samples:
        assert len(s["images"]) == 1 and (ROOT / s["images"][0]).is_file()
        assert s["prompt"].count("<|image_pad|>") == 1
    ckpt = run.latest_checkpoint() / "model"
    assert (ckpt / "preprocessor_config.json").is_file()  # the checkpoint is a model directory that takes images
    assert check_spec(load_spec(PRESET, [f"model.name_or_path={ckpt}"]), ROOT) == []


def test_rollout_shards_carry_their_rows_images() -> None:
    from backend.train.batch import Rollout
    from backend.train.dist import join_rollouts, shard_rollout

    B = 4
    z = torch.zeros((B, 2), dtype=torch.long)
    media = [{"pixel_values": torch.full((1, 3), float(i)), "image_grid_thw": torch.tensor([[1, 2, 2]])} for i in range(B)]
    ro = Rollout(1, 0, z, z, z, z, z, None, torch.zeros(B), {}, [], media=media)
    shards = [shard_rollout(ro, r, 2, keep_samples=r == 0) for r in range(2)]
    assert [float(m["pixel_values"][0, 0]) for m in shards[1].media] == [2.0, 3.0]
    assert join_rollouts(shards).media == media


def test_grpo_update_on_image_prompts_moves_logprobs_with_the_advantage(tmp_path: Path) -> None:
    """In the real trainer: the engine's sampling logprobs equal the training forward's, and a few updates
    raise the completions with positive advantage and lower those with negative advantage."""
    from backend.rundir import create_run
    from backend.train.loop import GRPOTrainer

    spec = load_spec(PRESET, [f"output.runs_dir={tmp_path}", "algorithm.prompts_per_step=4", "output.eval_steps=0",
                              "output.save_steps=0", "data.eval_sources=[]", "algorithm.learning_rate=1e-4"])
    tr = GRPOTrainer(spec, create_run(spec, ROOT), ROOT).setup()
    ro = tr.make_rollout(1, 0)
    assert ro.media is not None and len(ro.media) == ro.completion_ids.shape[0]
    tr.prepare_logps(ro)

    def seq_logps() -> torch.Tensor:
        tr.policy.eval()
        with torch.no_grad():
            lp = tr.logps(tr.policy, ro, slice(0, ro.completion_ids.shape[0])).logps
        tr.policy.train()
        return (lp * ro.completion_mask).sum(-1)

    before = seq_logps()
    torch.testing.assert_close(before, (ro.sampling_logps * ro.completion_mask).sum(-1), rtol=1e-4, atol=1e-4)
    for _ in range(3):
        tr.optimizer_step(ro)
    moved = seq_logps() - before
    assert (ro.advantages > 0).any() and (ro.advantages < 0).any()
    assert moved[ro.advantages > 0].mean() > 0.02 and moved[ro.advantages < 0].mean() < -0.02


def test_micro_batch_rows_pick_their_images() -> None:
    from backend.train.forward import rows_of

    media = [{"pixel_values": torch.full((1, 1), float(i))} for i in range(6)]
    assert rows_of(media, slice(2, 4)) == media[2:4]
    assert rows_of(media, torch.tensor([0, 1, 4, 5])) == [media[0], media[1], media[4], media[5]]  # live groups only
    assert rows_of(None, slice(0, 2)) is None
