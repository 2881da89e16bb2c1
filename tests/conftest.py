"""Test-wide settings.

One torch thread per process: tests start trainer subprocesses and a studio beside pytest on a
2-core machine, and torch's spinning worker threads slow down many-fold when oversubscribed.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the trainer processes tests start
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may come from a hub at test time
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def vl():
    """The shipped tiny Qwen2-VL: (model, tokenizer, vision processor), for the multimodal tests."""
    from pathlib import Path

    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from backend.multimodal import VisionProcessor

    model_dir = Path(__file__).resolve().parent.parent / "assets/tiny-vl"
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, tok, VisionProcessor.from_pretrained(str(model_dir), tok)
