"""The evaluation options' one definition (backend.eval.options): the CLI's flags, its bound checks, the
Evaluate page's values and the command the page launches are projections of EvalConfig's fields."""

from __future__ import annotations

import dataclasses
import re

import pytest

from backend.eval import options
from backend.eval.cli import main, parser
from backend.eval.options import EvalConfig, from_form, from_namespace, option_fields, problems, to_argv


def test_every_option_has_a_flag_help_in_both_languages_and_its_default() -> None:
    ap = parser()
    by_dest = {a.dest: a for a in ap._actions}
    names = {f.name for f in option_fields()}
    assert names == {f.name for f in dataclasses.fields(EvalConfig)} - {"base_dir"}
    for f in option_fields():
        o = options.opt(f)
        assert f.name in by_dest, f.name
        assert o.help and o.help_zh and o.help_zh != o.help, f.name
        assert o.help in by_dest[f.name].help
        if not o.required:
            assert by_dest[f.name].default == options.default(f), f.name
    assert by_dest["ks"].option_strings == ["--k"] and by_dest["max_tokens"].option_strings == ["--max-tokens"]


def test_argv_round_trips_through_the_parser() -> None:
    cfg = EvalConfig(model="runs/r1:20", data="gsm8k=/d/test.parquet", ks=[1, 4], n=8, temperature=0.0, top_p=0.9,
                     top_k=5, max_tokens=64, limit=3, seed=7, batch=2, engine="vllm", device="cuda:1",
                     rewards=["accuracy", "format"], correct="accuracy", system_prompt="Think.",
                     think_markers=["wait"], judge="/j", prompt_column="q", images_column="img", videos_column="v",
                     audios_column="a", out="/o")
    argv = to_argv(cfg)
    assert from_namespace(parser().parse_args(argv)) == cfg
    assert to_argv(EvalConfig(model="m")) == ["--model", "m"]  # defaults are not spelled out
    assert from_namespace(parser().parse_args(["--model", "m"])) == EvalConfig(model="m")


@pytest.mark.parametrize(("argv", "message"), [
    (["--n", "-1"], "--n must be >= 0, got -1"),
    (["--top-p", "0"], "--top-p must be > 0, <= 1, got 0.0"),
    (["--top-p", "1.5"], "--top-p must be > 0, <= 1, got 1.5"),
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--k", "0,2", "--n", "2"], "--k must be >= 1, got 0,2"),
    (["--k", "1,8", "--n", "4"], "pass@8 needs --n >= 8 samples per prompt (got 4)"),
    (["--temperature", "-0.5"], "--temperature must be >= 0, got -0.5"),
])
def test_the_cli_refuses_out_of_bounds_values_with_the_pages_sentence(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "m", *argv]) == 2
    assert f"error: {message}" in capsys.readouterr().err
    parsed = from_namespace(parser().parse_args(["--model", "m", *argv]))
    values = {f.name: getattr(parsed, f.name) for f in option_fields() if f.name != "model"}
    with pytest.raises(ValueError, match=re.escape(message)):  # the page's check is the same rule
        from_form(values, model="m")


def test_form_values_are_typed_like_flags() -> None:
    cfg = from_form({"ks": " 1, 4 ", "n": 8.0, "temperature": "", "rewards": "accuracy, format", "limit": None},
                    model="m")
    assert (cfg.ks, cfg.n, cfg.temperature, cfg.rewards, cfg.limit) == ([1, 4], 8, None, ["accuracy", "format"], 0)
    with pytest.raises(ValueError, match="--n: expected an integer, got 2.5"):
        from_form({"n": 2.5}, model="m")
    with pytest.raises(ValueError, match="--k: expected comma-separated integers like 1,4, got '1,x'"):
        from_form({"ks": "1,x"}, model="m")
    with pytest.raises(ValueError, match="--model is required"):
        from_form({}, model=" ")


def test_the_page_shows_the_labelled_options_and_the_engine_choice_is_checked() -> None:
    main_row = [f.name for f in options.form_fields("main")]
    assert main_row[:2] == ["model", "data"] and {"ks", "n", "temperature", "seed", "rewards"} <= set(main_row)
    assert [f.name for f in options.form_fields("columns")] == ["prompt_column", "images_column", "videos_column",
                                                               "audios_column"]
    assert problems(EvalConfig(model="m", engine="sglang")) == ["--engine must be one of hf, vllm, lmdeploy, "
                                                                "got 'sglang'"]
