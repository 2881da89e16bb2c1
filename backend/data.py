"""Training data: read sources with the datasets library, mix them, and serve prompts in a resumable order."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from backend.spec import DataSection

SUPPORTED_DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# '#N' repeats a source's rows to N: its index costs 8 bytes a row, so 1e11 would need 800 GB before a step.
# Ten million rows is more prompts than any run here takes (max_steps x prompts_per_step).
MAX_SAMPLE_COUNT = 10_000_000


def split_source(source: str) -> tuple[str, int | None]:
    """'train.jsonl#1800' -> ('train.jsonl', 1800). Raises ValueError on a bad count."""
    path, sep, count = source.rpartition("#")
    if not sep:
        return source, None
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"sample count after '#' must be a positive integer, got {count!r}")
    if int(count) > MAX_SAMPLE_COUNT:
        raise ValueError(f"sample count after '#' is at most {MAX_SAMPLE_COUNT:,} rows, got {int(count):,}")
    return path, int(count)


def split_subset(ref: str) -> tuple[str, str | None]:
    """A hub dataset's subset (its config name), written as ms-swift writes it: 'org/name:subset' ->
    ('org/name', 'subset'); a ref without one -> (ref, None)."""
    name, sep, subset = ref.partition(":")
    return (name, subset) if sep and subset else (ref, None)


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


def is_hub_dataset(ref: str, base_dir: str | Path = ".") -> bool:
    """A data source that names a hub dataset: a hub id (is_hub_id) without a data file's extension; a missing
    'data/train.jsonl' is a missing local file, never a hub id (the hub would be asked for it and fail late)."""
    name, _ = split_subset(ref)  # a dataset may name its subset: 'org/name:subset' (ms-swift's form)
    return is_hub_id(name, base_dir) and Path(name).suffix.lower() not in SUPPORTED_DATA_SUFFIXES


class DataError(ValueError):
    pass


def cell_kind(value: Any) -> str:
    """What a cell holds, in the words the checks use: 'text', 'blank' (empty or white space), 'int', 'float',
    'bool', 'chat' (a list of {'role', 'content'} messages), 'chat without content', 'list of int', 'dict',
    'bytes', ... A prompt is text or chat; what each reward needs is its `kinds` (backend.rewards.registry)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return "text" if value.strip() else "blank"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    if isinstance(value, dict):
        return "dict"
    if isinstance(value, (list, tuple)):
        if not value:
            return "empty list"
        if all(isinstance(m, dict) for m in value):
            ok = all(isinstance(m.get("role"), str) and isinstance(m.get("content"), (str, list)) for m in value)
            if not ok:
                return "chat message without 'content'" if all("role" in m for m in value) else "list of dicts"
            return "chat" if any(_has_text(m["content"]) for m in value) else "blank chat"
        inner = sorted({cell_kind(v) for v in value})
        if any(k.startswith(("list", "empty list")) for k in inner):
            return "nested list"
        return f"list of {inner[0]} values" if len(inner) == 1 else "list of mixed values"
    return type(value).__name__


def describe_kind(kind: str) -> str:
    """A cell_kind as a message says it: 'a dict', 'bytes', 'empty (or only white space)'."""
    if kind in ("blank", "blank chat"):
        return "empty (or only white space)"
    if kind == "null":
        return "missing (null)"
    return kind if kind in ("bytes", "text") else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def prompt_kinds(data: DataSection) -> tuple[tuple[str, ...], str]:
    """The cell kinds a prompt's columns may hold, and why: the one rule behind the check before launch and
    load_rows (for the sources the check cannot read: hub datasets)."""
    if data.prompt_template:  # str() formats these as themselves; a dict or a list would show as its repr
        return ("text", "blank", "int", "float", "bool"), "the prompt template formats its columns as text"
    return ("text", "chat"), "a prompt is non-empty text or a list of chat messages {'role', 'content'}"


def _has_text(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    return any(isinstance(p, dict) and (p.get("type") != "text" or _has_text(p.get("text", ""))) for p in content)




def iter_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """Every row of a local source with where it is ('line 3' in JSONL, 'row 3' elsewhere, 1-based): the one
    reader behind the preview (first rows) and the checks (all rows), streaming, without Arrow conversion.
    Raises DataError naming the line for text that is not JSON or not UTF-8."""
    if path.is_dir():
        from datasets import Dataset, load_from_disk

        ds = load_from_disk(str(path))
        if not isinstance(ds, Dataset):
            ds = ds["train"] if "train" in ds else next(iter(ds.values()))
        for k, row in enumerate(ds, 1):
            yield f"row {k}", row
        return
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            with path.open(encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            yield f"line {lineno}", json.loads(line)
                        except json.JSONDecodeError as err:
                            raise DataError(f"line {lineno}: not valid JSON ({err.msg})") from None
        elif suffix == ".json":
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise DataError(f"line {err.lineno}: not valid JSON ({err.msg})") from None
            rows = data if isinstance(data, list) else \
                next((v for v in data.values() if isinstance(v, list)), None) if isinstance(data, dict) else None
            if rows is None:
                raise DataError("expected a list of rows (or an object holding one)")
            for k, row in enumerate(rows, 1):
                yield f"row {k}", row
        elif suffix == ".csv":
            import csv

            with path.open(newline="", encoding="utf-8") as f:
                for k, row in enumerate(csv.DictReader(f), 1):  # a short row leaves its last columns None
                    yield f"row {k}", row
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            k = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    k += 1
                    yield f"row {k}", row
        else:
            raise DataError(f"unsupported format {suffix!r}")
    except UnicodeDecodeError:
        raise DataError("not UTF-8 text") from None


def head_rows(path: Path, n: int = 5) -> list[dict[str, Any]]:
    """The first n rows of a local source without reading all of it (the studio's preview)."""
    return [row for _, row in itertools.islice(iter_rows(path), n)]


def peek_columns(path: Path) -> set[str] | None:
    """Column names from the first row, or None when it cannot be read cheaply."""
    try:
        rows = head_rows(path, 1)
    except Exception:  # unreadable here; the checks report why
        return None
    return set(rows[0]) if rows and isinstance(rows[0], dict) else set()


LONGEST_KEPT = 8  # prompts by size the scan keeps for the check to measure in tokens
KEEP_CELLS_BYTES = 1 << 20  # a larger prompt's cells are not kept (scans are cached): its size alone refuses it


@dataclass(frozen=True)
class LongPrompt:
    """One of a source's largest prompts: where, its size in UTF-8 bytes, and its prompt cells (None when
    larger than KEEP_CELLS_BYTES)."""

    where: str
    nbytes: int
    cells: dict[str, Any] | None


def text_bytes(value: Any) -> int:
    """Size of a prompt cell's text in UTF-8 bytes (chat messages: their contents)."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "replace"))
    if isinstance(value, list):
        return sum(text_bytes(m.get("content", "") if isinstance(m, dict) else m) for m in value)
    if isinstance(value, dict):
        return text_bytes(value.get("text", ""))
    return len(str(value))


@dataclass(frozen=True)
class SourceScan:
    """What a full read of a local source found: its columns (the first row's), where each needed column is
    first missing or None, or why it cannot be read at all."""

    columns: frozenset[str] = frozenset()
    missing: dict[str, str] = field(default_factory=dict)
    error: str = ""
    first: str = ""  # where the first row is ('line 1', or 'line 4' after blank lines)
    bad_media: dict[str, str] = field(default_factory=dict)  # media column -> "line 3: no such image file: ..."
    kinds: dict[str, dict[str, str]] = field(default_factory=dict)  # needed column -> {cell_kind: where first seen}
    longest: tuple[LongPrompt, ...] = ()  # the largest prompts by size, largest first (see scan_source)

    def absent(self, column: str) -> bool:
        """Missing from the first row: the column is absent, not one row broken."""
        return self.missing.get(column) == self.first


def scan_source(path: Path, needed: list[str], media: list[str] | dict[str, str] | None = None,
                media_base: Path | None = None, prompt_columns: list[str] | None = None) -> SourceScan:
    """Read a whole local source and check every row has the needed columns.

    `media` columns hold media (backend.multimodal): a list of image columns, or {column: 'image' | 'video' |
    'audio'}. Every item is opened, relative paths resolved against `media_base`, and the first bad cell of
    each column (missing file, unreadable image / video / audio, wrong type, remote URL) is reported with its
    row. The LONGEST_KEPT largest prompts (the `prompt_columns` cells together) are kept for the check to measure
    in tokens. Cached by path, size and mtime, so the studio's validation on every change does not re-read it."""
    try:
        st = path.stat()
    except OSError as err:
        return SourceScan(error=f"cannot read: {err.strerror or err}")
    base = str(media_base if media_base is not None else path.parent)
    kinds = media if isinstance(media, dict) else dict.fromkeys(media or [], "image")
    return _scan(str(path), st.st_size, st.st_mtime_ns, tuple(sorted(set(needed))), tuple(sorted(kinds.items())), base,
                 tuple(prompt_columns or ()))


@lru_cache(maxsize=64)
def _scan(path_str: str, _size: int, _mtime: int, needed: tuple[str, ...], media: tuple[tuple[str, str], ...] = (),
          media_base: str = ".", prompt_columns: tuple[str, ...] = ()) -> SourceScan:
    import heapq

    from backend.multimodal import check_cell

    missing: dict[str, str] = {}
    bad_media: dict[str, str] = {}
    kinds: dict[str, dict[str, str]] = {c: {} for c in needed}
    longest: list[tuple[int, int, LongPrompt]] = []  # a min-heap of (size, -row index: earlier rows win ties, prompt)
    columns: frozenset[str] | None = None
    first = ""
    try:
        for k, (where, row) in enumerate(iter_rows(Path(path_str))):
            if not isinstance(row, dict):
                return SourceScan(error=f"{where}: not an object with columns (got {type(row).__name__})")
            if columns is None:
                columns, first = frozenset(row), where
            for c in needed:
                value = row.get(c)
                if value is None:
                    missing.setdefault(c, where)
                else:
                    kinds[c].setdefault(cell_kind(value), where)
            if prompt_columns:
                size = sum(text_bytes(row.get(c)) for c in prompt_columns if row.get(c) is not None)
                if len(longest) < LONGEST_KEPT or size > longest[0][0]:
                    cells = {c: row.get(c) for c in prompt_columns} if size <= KEEP_CELLS_BYTES else None
                    item = (size, -k, LongPrompt(where, size, cells))
                    (heapq.heappush if len(longest) < LONGEST_KEPT else heapq.heapreplace)(longest, item)
            for c, kind in media:
                if c not in bad_media and row.get(c) is not None:
                    why = check_cell(kind, row[c], Path(media_base))
                    if why:
                        bad_media[c] = f"{where}: {why}"
    except DataError as err:
        return SourceScan(error=str(err))
    except Exception as err:  # a corrupt Parquet file, an unreadable directory...
        return SourceScan(error=f"cannot read: {type(err).__name__}: {err}")
    if columns is None:
        return SourceScan(error="no rows")
    return SourceScan(columns, missing, first=first, bad_media=bad_media, kinds=kinds,
                      longest=tuple(p for _, _, p in sorted(longest, key=lambda x: -x[0])))


def load_source(ref: str, base_dir: Path, seed: int):
    """One source -> datasets.Dataset, with the '#N' sample count applied (repeating when N > rows)."""
    from datasets import Dataset, concatenate_datasets, load_dataset, load_from_disk

    path_str, count = split_source(ref)
    try:
        if is_hub_dataset(path_str, base_dir):
            name, subset = split_subset(path_str)
            ds = load_dataset(name, subset, split="train")
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
        media = (data.images_column, data.videos_column, data.audios_column)
        missing = [c for c in (*wanted, *media) if c and c not in ds.column_names]
        if missing:
            raise DataError(f"{ref}: column(s) {missing} missing (columns: {ds.column_names})")
        allowed, why = prompt_kinds(data)
        for k, row in enumerate(ds.to_list(), 1):
            bad = next((c for c in wanted if cell_kind(row.get(c)) not in allowed), None)
            if bad is not None:  # the check before launch says this for local files; hub datasets land here
                raise DataError(f"{ref} row {k}: {bad!r} is {describe_kind(cell_kind(row.get(bad)))}; {why}")
            rows.append(row)
    order = np.random.default_rng(seed).permutation(len(rows))
    rows = [rows[i] for i in order]
    if data.limit:
        rows = rows[: data.limit]
    if data.solution_column != "solution":
        for r in rows:
            if data.solution_column in r:
                r["solution"] = r.pop(data.solution_column)
    return rows


def render_prompt(row: dict[str, Any], data: DataSection, tokenizer: Any, tools: list[dict[str, Any]] | None = None,
                  observation: str | None = None) -> str:
    """The exact text the model is prompted with (chat template applied when enabled). `tools` (JSON schemas) go
    to the template, as `apply_chat_template(tools=...)` takes them; an environment's first `observation` is
    appended to the last user message (TRL's environments do the same). data.chat_template_kwargs go to the
    template; with data.prompt_truncation 'left', a prompt over data.max_prompt_tokens keeps its last tokens (as
    TRL's max_prompt_length did: the template's opening tokens go first)."""
    text = _render(row, data, tokenizer, tools, observation)
    if data.prompt_truncation == "left":
        text = keep_last_tokens(text, getattr(tokenizer, "tokenizer", tokenizer), data.max_prompt_tokens)
    return text


def keep_last_tokens(text: str, tok: Any, n: int) -> str:
    """The end of `text` that encodes to at most `n` tokens. The engines re-tokenize the prompt text, and a cut
    inside a character (byte-level BPE) decodes to U+FFFD, so the kept tail starts at a whole character and is
    re-encoded until it fits."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    keep = n
    while len(ids) > n and keep > 0:
        tail = tok.decode(ids[-keep:], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        tail = tail.lstrip("\ufffd")  # the rest of a character cut in two
        got = len(tok(tail, add_special_tokens=False)["input_ids"])
        if got <= n:
            return tail
        keep -= got - n
    return text if len(ids) <= n else ""


def prompt_tokens(row: dict[str, Any], data: DataSection, tokenizer: Any) -> int:
    """The prompt's length in tokens as the model sees it (chat template applied, before any truncation)."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    return len(tok(_render(row, data, tokenizer, None, None), add_special_tokens=False)["input_ids"])


def drop_long_prompts(rows: list[dict[str, Any]], data: DataSection, tokenizer: Any) -> list[dict[str, Any]]:
    """The rows whose prompt fits data.max_prompt_tokens, when data.prompt_truncation is 'delete' (ms-swift's
    truncation_strategy delete); every row otherwise. DataError when no row is left."""
    if data.prompt_truncation != "delete" or not rows:
        return rows
    kept = [r for r in rows if prompt_tokens(r, data, tokenizer) <= data.max_prompt_tokens]
    if not kept:
        raise DataError(f"every prompt is longer than data.max_prompt_tokens ({data.max_prompt_tokens:,}): "
                        "data.prompt_truncation 'delete' dropped them all")
    return kept


def _render(row: dict[str, Any], data: DataSection, tokenizer: Any, tools: list[dict[str, Any]] | None,
            observation: str | None) -> str:
    prompt = data.prompt_template.format_map(row) if data.prompt_template else row[data.prompt_column]
    use_template = data.chat_template == "on" or (data.chat_template == "auto" and getattr(tokenizer, "chat_template", None))
    if isinstance(prompt, list) or use_template:
        messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        if data.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": data.system_prompt}, *messages]
        if observation:
            last = next((m for m in reversed(messages) if m.get("role") == "user"), None)
            if last is None:
                messages.append({"role": "user", "content": observation})
            else:
                last["content"] = f"{last.get('content', '')}\n{observation}"
        if not getattr(tokenizer, "chat_template", None):
            raise DataError("prompts are chat messages (or data.chat_template is 'on') but the tokenizer has no chat template")
        kw = {**data.chat_template_kwargs, **({"tools": tools} if tools else {})}
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)
    text = f"{prompt}\n{observation}" if observation else str(prompt)
    return f"{data.system_prompt}\n{text}" if data.system_prompt else text


@dataclass
class PromptSampler:
    """Epoch-wise shuffled order over n rows; its state (epoch, position, solved rows) is saved in checkpoints.

    With `skip_solved` > 0, a row whose last group was solved (`mark`: every completion reached the reward a
    solved prompt scores) is passed over with that probability each time the order reaches it: its group would
    most likely score all alike again, which carries no advantage, so the rollout goes to prompts that still teach
    (as GRESO's selective rollouts). Rows scored all wrong are never skipped: a rare right answer is how they learn.
    The draw is a fixed function of (seed, epoch, row), so the order is the same however batches are split and a
    resumed run takes the same prompts."""

    n: int
    seed: int
    epoch: int = 0
    pos: int = 0
    skip_solved: float = 0.0
    solved: set[int] = field(default_factory=set)
    skipped: int = 0  # rows passed over so far (a metric; not part of the order)

    def _order(self) -> np.ndarray:
        return np.random.default_rng(self.seed + self.epoch).permutation(self.n)

    def _skips(self) -> np.ndarray:
        """This epoch's uniform draw per row, compared with skip_solved for the solved ones."""
        return np.random.default_rng([self.seed, self.epoch, 1]).random(self.n)

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        order = self._order()
        draws = self._skips() if self.skip_solved else None
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                order = self._order()
                draws = self._skips() if self.skip_solved else None
            row = int(order[self.pos])
            self.pos += 1
            if draws is not None and row in self.solved and draws[row] < self.skip_solved:
                self.skipped += 1
                continue
            out.append(row)
        return out

    def mark(self, row: int, solved: bool) -> None:
        """Record how the row's latest group scored (only kept when skipping is on)."""
        if not self.skip_solved:
            return
        if solved:
            self.solved.add(row)
        else:
            self.solved.discard(row)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pos": self.pos, "solved": sorted(self.solved)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self.solved = set(state.get("solved", []))  # checkpoints from before skipping existed hold none
