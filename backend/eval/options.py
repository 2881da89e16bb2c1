"""Every option of one evaluation, declared once: `EvalConfig`'s fields with their help (English and Chinese),
bounds, flag and, for those the studio shows, their label.

The command line (backend.eval.cli, backend.eval.compare) and the studio's Evaluate page (app.eval_tab) are
projections of this one table, as the run forms are of RunSpec: `add_arguments` makes the flags, `from_namespace`
reads them back, `problems` holds every bound (the CLI and the page report the same sentence), `from_form` turns
the page's widget values into an EvalConfig and `to_argv` turns an EvalConfig into the command the page launches
(`from_namespace(parse(to_argv(c))) == c`). A new option is one field here; its flag, check and, with a label,
its widget follow.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Literal

from backend.eval.benchmarks import BENCHMARKS
from backend.eval.thinking import DEFAULT_SWITCHES

ENGINES = ("hf", "vllm", "lmdeploy")
Kind = Literal["str", "int", "float", "float?", "ints", "names"]


@dataclass(frozen=True)
class Opt:
    """What the projections need of one option besides its name and default."""

    kind: Kind
    help: str
    help_zh: str
    label: str = ""  # the Evaluate page's label; '' = a command-line-only option
    label_zh: str = ""
    group: str = "main"  # the page's row: main, or columns (a collapsed group)
    flag: str = ""  # '' = --the-name-with-dashes
    minimum: float | None = None
    exclusive_min: bool = False
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    required: bool = False


def _opt(default: Any, kind: Kind, help: str, help_zh: str, **meta: Any) -> Any:
    extra = {"metadata": {"opt": Opt(kind, help, help_zh, **meta)}}
    if isinstance(default, list):
        return field(default_factory=lambda d=tuple(default): list(d), **extra)
    return field(default=default, **extra)


_MEDIA = {"images": ("image", "图片"), "videos": ("video", "视频"), "audios": ("audio", "音频")}


@dataclass
class EvalConfig:
    model: str = field(metadata={"opt": Opt(
        "str", "model dir, adapter dir, RUN_DIR, RUN_DIR:STEP or RUN_DIR:base",
        "模型目录、适配器目录、RUN_DIR、RUN_DIR:STEP 或 RUN_DIR:base", label="Model", label_zh="模型",
        required=True)})
    data: str = _opt("", "str", f"data file, or a format name ({', '.join(BENCHMARKS)}) optionally =FILE; "
                                "default: the run's data.eval_sources",
                     f"数据文件，或基准格式名（{', '.join(BENCHMARKS)}），可写作 NAME=FILE；默认：运行的 data.eval_sources",
                     label="Data", label_zh="数据")
    ks: list[int] = _opt([1], "ints", "pass@k values, e.g. 1,4", "pass@k 的 k 值，如 1,4", flag="--k",
                         label="pass@k", label_zh="pass@k", minimum=1)
    n: int = _opt(0, "int", "samples per prompt (0 = the largest k)", "每题采样数（0 = 最大的 k）",
                  label="Samples per prompt", label_zh="每题采样数", minimum=0)
    temperature: float | None = _opt(
        None, "float?", "0 = greedy; empty = greedy for n=1, else the run's temperature (or 1.0)",
        "0 = 贪心；留空 = n=1 时贪心，否则沿用运行的温度（或 1.0）", label="Temperature", label_zh="温度", minimum=0)
    top_p: float = _opt(1.0, "float", "nucleus sampling mass", "核采样的概率质量", minimum=0, exclusive_min=True,
                        maximum=1)
    top_k: int = _opt(0, "int", "keep the k most likely tokens (0 = off)", "只保留概率最高的 k 个 token（0 = 关闭）",
                      minimum=0)
    max_tokens: int = _opt(0, "int", "max new tokens (0 = the run's max_completion_length, else 1024)",
                           "最大生成长度（0 = 运行的 max_completion_length，否则 1024）",
                           label="Max new tokens", label_zh="最大生成长度", minimum=0)
    limit: int = _opt(0, "int", "evaluate the first N prompts only (0 = all)", "只评测前 N 道题（0 = 全部）",
                      label="First N prompts", label_zh="前 N 道题", minimum=0)
    seed: int = _opt(0, "int", "sampling seed: the same seed, data and batch give the same prompts in the same order",
                     "随机种子：相同的种子、数据与批大小给出相同顺序的相同题目", label="Seed", label_zh="随机种子")
    batch: int = _opt(16, "int", "prompts per engine call (also how often progress is written)",
                      "每次调用引擎的题目数（也是进度更新的粒度）", minimum=1)
    engine: str = _opt("hf", "str", "hf (transformers, here); vllm and lmdeploy where installed (GPU)",
                       "hf（transformers，本机）；vllm 与 lmdeploy（需安装，GPU）", choices=ENGINES)
    device: str = _opt("cpu", "str", "cpu, cuda, cuda:1 ...", "cpu、cuda、cuda:1 等")
    rewards: list[str] = _opt([], "names", "reward functions to score with (empty = the benchmark's, the run's, "
                                           "else accuracy)", "用于打分的奖励函数（留空 = 基准的、运行的，否则 accuracy）",
                              label="Rewards", label_zh="奖励函数")
    correct: str = _opt("", "str", "the reward whose score 1 means correct (default: the first of accuracy, "
                                   "multiple_choice, exact_match, countdown, counting)",
                        "得分为 1 即判为正确的奖励函数（默认：accuracy、multiple_choice、exact_match、countdown、"
                        "counting 中第一个）")
    system_prompt: str = _opt("", "str", "system prompt for benchmark data", "基准数据使用的系统提示词")
    think_markers: list[str] = _opt(list(DEFAULT_SWITCHES), "names",
                                    "comma-separated thought-switch markers (default: an English and Chinese set)",
                                    "思路切换标记，逗号分隔（默认：一组英文与中文标记）")
    judge: str = _opt("", "str", "local causal LM directory that finds the first correct position in a think block "
                                 "instead of the rule", "本地因果语言模型目录，代替规则判断思考块中首次答对的位置")
    prompt_column: str = _opt("", "str", "the data's prompt column (empty = the run's data.prompt_column, else prompt)",
                              "数据的提示列（留空 = 运行的 data.prompt_column，否则 prompt）",
                              label="Prompt column", label_zh="提示列", group="columns")
    images_column: str = _opt("", "str", "the data's image column (empty = the run's data.images_column, else a "
                                         "column named images or image for a model that takes images)",
                              "数据的图片列（留空 = 运行的 data.images_column，视觉模型则为 images 或 image 列）",
                              label="Images column", label_zh="图片列", group="columns")
    videos_column: str = _opt("", "str", "the data's video column (empty = the run's data.videos_column, else a "
                                         "column named videos or video for a model that takes videos)",
                              "数据的视频列（留空 = 运行的 data.videos_column，视觉模型则为 videos 或 video 列）",
                              label="Videos column", label_zh="视频列", group="columns")
    audios_column: str = _opt("", "str", "the data's audio column (empty = the run's data.audios_column, else a "
                                         "column named audios or audio for a model that takes audio)",
                              "数据的音频列（留空 = 运行的 data.audios_column，音频模型则为 audios 或 audio 列）",
                              label="Audios column", label_zh="音频列", group="columns")
    tools: list[str] = _opt([], "names", "tools the model may call (built-in python, or functions of --tool-files); "
                                         "empty = the run's tools section", "模型可调用的工具（内置 python，或 --tool-files 中的函数）；"
                                                                           "留空 = 运行的工具设置",
                            label="Tools", label_zh="工具")
    tool_files: list[str] = _opt([], "names", "Python files defining the tools", "定义工具的 Python 文件")
    max_turns: int = _opt(0, "int", "most assistant turns per episode (0 = the run's rollout.max_turns, else 5)",
                          "每个回合中助手最多的轮数（0 = 运行的 rollout.max_turns，否则 5）", minimum=0, maximum=100)
    out: str = _opt("", "str", "output folder (default RUN_DIR/eval/<id>, or ./evals/<id>)",
                    "输出文件夹（默认 RUN_DIR/eval/<id>，或 ./evals/<id>）")
    base_dir: str = "."  # relative paths resolve against it; not an option (the CLI's is its working directory)


def option_fields() -> list[Field[Any]]:
    """EvalConfig's options, in declaration order (base_dir is not one)."""
    return [f for f in fields(EvalConfig) if "opt" in f.metadata]


def opt(f: Field[Any]) -> Opt:
    return f.metadata["opt"]


def flag(f: Field[Any]) -> str:
    return opt(f).flag or "--" + f.name.replace("_", "-")


def default(f: Field[Any]) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


def help_text(f: Field[Any], lang: str = "en") -> str:
    o = opt(f)
    return o.help_zh if lang == "zh" else o.help


def label(f: Field[Any], lang: str = "en") -> str:
    o = opt(f)
    return (o.label_zh if lang == "zh" else "") or o.label or f.name


def bounds_text(f: Field[Any]) -> str:
    o = opt(f)
    parts = []
    if o.minimum is not None:
        parts.append(f"{'>' if o.exclusive_min else '>='} {o.minimum:g}")
    if o.maximum is not None:
        parts.append(f"<= {o.maximum:g}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------- values


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,4, got {s!r}") from None


def _names(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def parse_value(f: Field[Any], raw: Any) -> Any:
    """A value as typed (a flag's text, a widget's value) -> the field's type; None or '' -> the default.
    Raises ValueError with the flag's name."""
    kind = opt(f).kind
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return default(f)
    try:
        if kind == "int":
            x = float(raw)
            if not x.is_integer():
                raise ValueError
            return int(x)
        if kind in ("float", "float?"):
            return float(raw)
        if kind == "ints":
            return list(raw) if isinstance(raw, list) else _ints(str(raw))
        if kind == "names":
            return list(raw) if isinstance(raw, list) else _names(str(raw))
        return str(raw).strip()
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        what = {"int": "an integer", "float": "a number", "float?": "a number or empty",
                "ints": "comma-separated integers like 1,4"}.get(kind, "text")
        raise ValueError(f"{flag(f)}: expected {what}, got {raw!r}") from None


def format_value(f: Field[Any], v: Any) -> str:
    if opt(f).kind in ("ints", "names"):
        return ",".join(str(x) for x in v)
    return str(v)


def problems(cfg: EvalConfig) -> list[str]:
    """Every bound and choice an EvalConfig breaks, one sentence each, named by flag. run_eval refuses a config
    with any; the CLI and the Evaluate page show them before anything starts."""
    out = []
    for f in option_fields():
        o, v = opt(f), getattr(cfg, f.name)
        if o.required and not str(v or "").strip():
            out.append(f"{flag(f)} is required")
        values = v if o.kind == "ints" else [v] if o.kind in ("int", "float", "float?") else []
        for x in values:
            if x is None:
                continue
            low = o.minimum is not None and (x <= o.minimum if o.exclusive_min else x < o.minimum)
            high = o.maximum is not None and x > o.maximum
            if low or high:
                out.append(f"{flag(f)} must be {bounds_text(f)}, got {format_value(f, v)}")
                break
        if o.choices and v not in o.choices:
            out.append(f"{flag(f)} must be one of {', '.join(o.choices)}, got {v!r}")
    if cfg.ks and cfg.n > 0 and max(cfg.ks) > cfg.n:
        out.append(f"pass@{max(cfg.ks)} needs --n >= {max(cfg.ks)} samples per prompt (got {cfg.n})")
    if not cfg.ks:
        out.append("--k needs at least one value")
    return out


# ----------------------------------------------------------------------------- projections


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """One flag per option, with its help, default and bounds (checked by `problems`, not by argparse, so the
    sentence is the page's too)."""
    for f in option_fields():
        o = opt(f)
        kw: dict[str, Any] = {"dest": f.name, "metavar": flag(f)[2:].upper().replace("-", "_")}
        if o.kind in ("int", "float", "float?", "ints", "names"):
            kw["type"] = lambda s, f=f: _typed(f, s)
        if o.choices:
            kw["choices"] = o.choices
            del kw["metavar"]
        extra = "; ".join(x for x in (bounds_text(f), f"default {format_value(f, default(f))}"
                                      if default(f) not in (None, "", []) else "") if x)
        kw["help"] = o.help + (f" ({extra})" if extra else "")
        if o.required:
            kw["required"] = True
        else:
            kw["default"] = default(f)
        ap.add_argument(flag(f), **kw)


def _typed(f: Field[Any], s: str) -> Any:
    try:
        return parse_value(f, s)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).split(": ", 1)[1]) from None


def from_namespace(a: argparse.Namespace, **override: Any) -> EvalConfig:
    """The EvalConfig of parsed arguments; `override` replaces fields (backend.eval.compare: per model and folder)."""
    return EvalConfig(**{**{f.name: getattr(a, f.name) for f in option_fields()}, **override})


def form_fields(group: str) -> list[Field[Any]]:
    """The options the Evaluate page shows in one of its groups, in declaration order (model and data first)."""
    return [f for f in option_fields() if opt(f).label and opt(f).group == group]


def from_form(values: dict[str, Any], **fixed: Any) -> EvalConfig:
    """The page's widget values (by field name) -> an EvalConfig; `fixed` sets fields the page resolves itself
    (the model and data references). Raises ValueError on a value of the wrong type or out of bounds."""
    by_name = {f.name: f for f in option_fields()}
    cfg = EvalConfig(**{k: parse_value(by_name[k], v) for k, v in values.items()}, **fixed)
    bad = problems(cfg)
    if bad:
        raise ValueError("; ".join(bad))
    return cfg


def to_argv(cfg: EvalConfig, skip: tuple[str, ...] = ()) -> list[str]:
    """`python -m backend.eval`'s arguments for an EvalConfig: the required options, then every option that
    differs from its default (the inverse of parsing them)."""
    out = []
    for f in option_fields():
        v = getattr(cfg, f.name)
        if f.name in skip or (not opt(f).required and v == default(f)) or v is None:
            continue
        out += [flag(f), format_value(f, v)]
    return out
