"""Training data: read sources with the datasets library, mix them, and serve prompts in a resumable order."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from backend.spec import DataSection

SUPPORTED_DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def split_source(source: str) -> tuple[str, int | None]:
    """'train.jsonl#1800' -> ('train.jsonl', 1800). Raises ValueError on a bad count."""
    path, sep, count = source.rpartition("#")
    if not sep:
        return source, None
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"sample count after '#' must be a positive integer, got {count!r}")
    return path, int(count)


def template_columns(template: str) -> list[str]:
    """Column names a prompt template refers to ('{nums}' -> 'nums'); ValueError when malformed."""
    import string

    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def is_hub_id(ref: str, base_dir: str | Path = ".") -> bool:
    """A hub id looks like org/name and names nothing on disk under base_dir; 'assets/missing' is a
    missing local path (its first component exists), not a hub id."""
    base = Path(base_dir)
    if Path(ref).expanduser().is_absolute() or (base / ref).exists() or not _HUB_ID.match(ref):
        return False
    return not (base / ref.split("/")[0]).exists()


class DataError(ValueError):
    pass


@dataclass(frozen=True)
class SourceScan:
    """What a full read of a local source found: its columns, where each needed column is first
    missing ('line 3' in JSONL, 'row 3' elsewhere, 1-based), or why it cannot be read at all."""

    columns: frozenset[str] = frozenset()
    missing: dict[str, str] = field(default_factory=dict)
    error: str = ""
    bad_media: dict[str, str] = field(default_factory=dict)  # media column -> "line 3: no such image file: ..."

    first: str = ""  # where the first row is ('line 1', or 'line 4' after blank lines)

    def absent(self, column: str) -> bool:
        """Missing from the first row, the header or the schema: the column is absent, not one row broken."""
        where = self.missing.get(column)
        return where is not None and (where == self.first or where.startswith("("))


def scan_source(path: Path, needed: list[str], media: list[str] | None = None, media_base: Path | None = None
                ) -> SourceScan:
    """Read a whole local source cheaply (no Arrow conversion) and check every row has the needed columns.

    `media` columns hold images (backend.multimodal): every one is opened, relative paths resolved against
    `media_base`, and the first bad cell of each column is reported with its row. Cached by path, size and
    mtime, so the studio's validation on every change does not re-read it."""
    try:
        st = path.stat()
    except OSError as err:
        return SourceScan(error=f"cannot read: {err.strerror or err}")
    base = str(media_base if media_base is not None else path.parent)
    return _scan(str(path), st.st_size, st.st_mtime_ns, tuple(sorted(set(needed))), tuple(sorted(set(media or []))), base)


@lru_cache(maxsize=64)
def _scan(path_str: str, _size: int, _mtime: int, needed: tuple[str, ...], media: tuple[str, ...] = (),
          media_base: str = ".") -> SourceScan:
    path = Path(path_str)
    missing: dict[str, str] = {}
    bad_media: dict[str, str] = {}

    def check_media(col: str, value: Any, where: str) -> None:
        from backend.multimodal import check_media_cell

        if col not in bad_media and value is not None:
            why = check_media_cell(value, Path(media_base))
            if why:
                bad_media[col] = f"{where}: {why}"

    def visit(row: Any, where: str) -> str | None:
        if not isinstance(row, dict):
            return f"{where}: not an object with columns (got {type(row).__name__})"
        for c in needed:
            if c not in missing and row.get(c) is None:
                missing[c] = where
        for c in media:
            check_media(c, row.get(c), where)
        return None

    try:
        if path.is_dir():
            from datasets import Dataset, load_from_disk

            ds = load_from_disk(str(path))
            if not isinstance(ds, Dataset):
                ds = ds["train"] if "train" in ds else next(iter(ds.values()))
            cols = set(ds.column_names)
            missing.update({c: "(every row)" for c in needed if c not in cols})
            for c in media:
                if c in cols:
                    for k, v in enumerate(ds.with_format(None)[c], 1):  # raw cells, not decoded images
                        check_media(c, v, f"row {k}")
            return SourceScan(frozenset(cols), missing, first="row 1", bad_media=bad_media)
        suffix = path.suffix.lower()
        first: dict[str, Any] | None = None
        first_at = ""
        if suffix == ".jsonl":
            n = 0
            with path.open(encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as err:
                        return SourceScan(error=f"line {lineno}: not valid JSON ({err.msg})")
                    bad = visit(row, f"line {lineno}")
                    if bad:
                        return SourceScan(error=bad)
                    if first is None:
                        first, first_at = row, f"line {lineno}"
                    n += 1
            if n == 0:
                return SourceScan(error="no rows")
            return SourceScan(frozenset(first or {}), missing, first=first_at, bad_media=bad_media)
        if suffix == ".json":
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                return SourceScan(error=f"line {err.lineno}: not valid JSON ({err.msg})")
            rows = data if isinstance(data, list) else next((v for v in data.values() if isinstance(v, list)), None) \
                if isinstance(data, dict) else None
            if rows is None:
                return SourceScan(error="expected a list of rows (or an object holding one)")
            if not rows:
                return SourceScan(error="no rows")
            for k, row in enumerate(rows, 1):
                bad = visit(row, f"row {k}")
                if bad:
                    return SourceScan(error=bad)
            return SourceScan(frozenset(rows[0]), missing, first="row 1", bad_media=bad_media)
        if suffix == ".csv":
            import csv

            with path.open(newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                header = set(reader.fieldnames or [])
                missing.update({c: "(header)" for c in needed if c not in header})
                k = 0
                for k, row in enumerate(reader, 1):
                    visit(row, f"row {k}")  # a short row leaves its last columns None
            if k == 0:
                return SourceScan(error="no rows")
            return SourceScan(frozenset(header), missing, first="row 1", bad_media=bad_media)
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            cols = set(table.column_names)
            for c in needed:
                if c not in cols:
                    missing[c] = "(every row)"
                elif table[c].null_count:
                    import pyarrow.compute as pc

                    first_null = pc.index(pc.is_null(table[c]), True).as_py()
                    missing[c] = f"row {first_null + 1}"
            if table.num_rows == 0:
                return SourceScan(error="no rows")
            for c in media:
                if c in cols:
                    for k, v in enumerate(table[c].to_pylist(), 1):
                        check_media(c, v, f"row {k}")
            return SourceScan(frozenset(cols), missing, first="row 1", bad_media=bad_media)
    except UnicodeDecodeError:
        return SourceScan(error="not UTF-8 text")
    except Exception as err:  # a corrupt Parquet file, an unreadable directory...
        return SourceScan(error=f"cannot read: {type(err).__name__}: {err}")
    return SourceScan(error=f"unsupported format {path.suffix!r}")


def head_rows(path: Path, n: int = 5) -> list[dict[str, Any]]:
    """The first n rows of a local source without reading all of it (the studio's preview)."""
    if path.is_dir():
        from datasets import Dataset, load_from_disk

        ds = load_from_disk(str(path))
        if not isinstance(ds, Dataset):
            ds = ds["train"] if "train" in ds else next(iter(ds.values()))
        return ds.select(range(min(n, len(ds)))).to_list()
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        out = []
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    out.append(json.loads(line))
                    if len(out) >= n:
                        break
        return out
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = data if isinstance(data, list) else next((v for v in data.values() if isinstance(v, list)), [])
        return rows[:n]
    if suffix == ".csv":
        import csv

        with path.open(newline="", encoding="utf-8") as f:
            return [row for _, row in zip(range(n), csv.DictReader(f))]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(path).iter_batches(batch_size=n), None)
        return batch.to_pylist() if batch is not None else []
    raise DataError(f"unsupported format {suffix!r}")


def peek_columns(path: Path) -> set[str] | None:
    """Column names from the first row, or None when it cannot be read cheaply."""
    try:
        rows = head_rows(path, 1)
    except Exception:  # unreadable here; the checks report why
        return None
    return set(rows[0]) if rows and isinstance(rows[0], dict) else set()


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
