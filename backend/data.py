"""Training data: read sources with the datasets library, mix them, and serve prompts in a resumable order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backend.spec import SUPPORTED_DATA_SUFFIXES, DataSection, is_hub_id, split_source, template_columns


class DataError(ValueError):
    pass


def peek_columns(path: Path) -> set[str] | None:
    """Column names from the first row or the schema, without reading the whole file."""
    try:
        if path.is_dir():
            from datasets import load_from_disk

            ds = load_from_disk(str(path))
            cols = ds.column_names
            return set(cols if isinstance(cols, list) else next(iter(cols.values())))
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            with path.open() as f:
                for line in f:
                    if line.strip():
                        row = json.loads(line)
                        return set(row) if isinstance(row, dict) else None
            return set()
        if suffix == ".csv":
            import csv

            with path.open(newline="") as f:
                return set(next(csv.reader(f), []))
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return set(pq.read_schema(path).names)
        if suffix == ".json":
            data = json.loads(path.read_text())
            rows = data if isinstance(data, list) else next((v for v in data.values() if isinstance(v, list)), [])
            return set(rows[0]) if rows and isinstance(rows[0], dict) else None
    except Exception:  # unreadable here; load_source reports the real error at launch
        return None
    return None


def load_source(ref: str, base_dir: Path, seed: int):
    """One source -> datasets.Dataset, with the '#N' sample count applied (repeating when N > rows)."""
    from datasets import Dataset, concatenate_datasets, load_dataset, load_from_disk

    path_str, count = split_source(ref)
    try:
        if is_hub_id(path_str, base_dir):
            ds = load_dataset(path_str, split="train")
        else:
            p = Path(path_str) if Path(path_str).is_absolute() else base_dir / path_str
            if p.is_dir():
                ds = load_from_disk(str(p))
                if not isinstance(ds, Dataset):
                    ds = ds["train"] if "train" in ds else next(iter(ds.values()))
            else:
                fmt = SUPPORTED_DATA_SUFFIXES.get(p.suffix.lower())
                if fmt is None:
                    raise DataError(f"{ref}: unsupported format {p.suffix!r}")
                if fmt == "csv":
                    # CSV is text: keep '01' as '01' instead of letting type inference turn it into 1
                    import pandas as pd

                    ds = Dataset.from_pandas(pd.read_csv(p, dtype=str, keep_default_na=False), preserve_index=False)
                else:
                    ds = load_dataset(fmt, data_files=str(p), split="train")
    except DataError:
        raise
    except Exception as err:
        raise DataError(f"{ref}: cannot read: {err}") from err
    if len(ds) == 0:
        raise DataError(f"{ref}: no rows")
    if count is not None:
        ds = ds.shuffle(seed=seed)
        if count > len(ds):
            ds = concatenate_datasets([ds] * (count // len(ds) + 1))
        ds = ds.select(range(count))
    return ds


def load_rows(sources: list[str], data: DataSection, seed: int, base_dir: Path) -> list[dict[str, Any]]:
    """Mix sources (shuffled by the seed) into plain rows; the solution column is renamed 'solution'.

    Rows are mixed as Python objects, not Arrow tables, so sources whose column types differ
    (a Parquet large_string and a JSONL string, say) still mix.
    """
    rows: list[dict[str, Any]] = []
    for ref in sources:
        ds = load_source(ref, base_dir, seed)
        wanted = template_columns(data.prompt_template) if data.prompt_template else [data.prompt_column]
        missing = [c for c in (*wanted, data.images_column) if c and c not in ds.column_names]
        if missing:
            raise DataError(f"{ref}: column(s) {missing} missing (columns: {ds.column_names})")
        rows.extend(ds.to_list())
    order = np.random.default_rng(seed).permutation(len(rows))
    rows = [rows[i] for i in order]
    if data.limit:
        rows = rows[: data.limit]
    if data.solution_column != "solution":
        for r in rows:
            if data.solution_column in r:
                r["solution"] = r.pop(data.solution_column)
    return rows


def render_prompt(row: dict[str, Any], data: DataSection, tokenizer: Any) -> str:
    """The exact text the model is prompted with (chat template applied when enabled)."""
    prompt = data.prompt_template.format_map(row) if data.prompt_template else row[data.prompt_column]
    use_template = data.chat_template == "on" or (data.chat_template == "auto" and getattr(tokenizer, "chat_template", None))
    if isinstance(prompt, list) or use_template:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        if data.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": data.system_prompt}, *messages]
        if not getattr(tokenizer, "chat_template", None):
            raise DataError("prompts are chat messages (or data.chat_template is 'on') but the tokenizer has no chat template")
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    text = str(prompt)
    return f"{data.system_prompt}\n{text}" if data.system_prompt else text


@dataclass
class PromptSampler:
    """Epoch-wise shuffled order over n rows; its state (epoch, position) is saved in checkpoints."""

    n: int
    seed: int
    epoch: int = 0
    pos: int = 0

    def _order(self) -> np.ndarray:
        return np.random.default_rng(self.seed + self.epoch).permutation(self.n)

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        order = self._order()
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                order = self._order()
            take = min(k - len(out), self.n - self.pos)
            out.extend(order[self.pos:self.pos + take].tolist())
            self.pos += take
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
