"""GPUs and resources: the visible GPUs as chips to assign to training or rollout, the planner's verdict
(updated with validation), and on a machine without GPUs a one-click switch to CPU."""

from __future__ import annotations

from typing import Any

import gradio as gr

from app.fields import section_fields
from app.form import FieldValueError, field_doc, from_widget
from app.locales import t
from app.sections import BuildContext
from backend.machine import GPU, detect_gpus


def chip_label(gpu: GPU) -> str:
    return f"GPU {gpu.index} · {gpu.name} · {gpu.memory_gib:.0f} GiB"


def _ints(text: str, path: str) -> list[int]:
    try:
        return from_widget(field_doc(path), text)
    except FieldValueError:
        return []


def build(ctx: BuildContext) -> None:
    comps = ctx.form.comps
    gpus = detect_gpus()
    with gr.Group():
        if not gpus:
            with gr.Row():
                none_md = gr.Markdown("ⓘ " + t("gpu_none", ctx.lang), elem_id="gpu-none")
                ctx.reg.add(none_md, lambda lang: {"value": "ⓘ " + t("gpu_none", lang)})
                use_cpu = ctx.reg.value(gr.Button(t("use_cpu", ctx.lang), size="sm", scale=0, elem_id="use-cpu"), "use_cpu")
        else:
            found = gr.Markdown(t("gpu_found", ctx.lang, gpus=len(gpus)))
            ctx.reg.add(found, lambda lang: {"value": t("gpu_found", lang, gpus=len(gpus))})
            choices = [(chip_label(g), g.index) for g in gpus]
            with gr.Row():
                train = gr.CheckboxGroup(choices, value=_ints(ctx.values["resources.train_gpus"], "resources.train_gpus"),
                                         label=t("train_chips", ctx.lang), elem_id="gpu-train-chips")
                roll = gr.CheckboxGroup(choices, value=_ints(ctx.values["resources.rollout_gpus"], "resources.rollout_gpus"),
                                        label=t("rollout_chips", ctx.lang), elem_id="gpu-rollout-chips")
            ctx.reg.label(train, "train_chips")
            ctx.reg.label(roll, "rollout_chips")
        planner = gr.Markdown(elem_id="gpu-planner")
    ctx.form.extras["planner"] = planner
    section_fields("resources", ctx.form, ctx.reg, ctx.values, ctx.lang)

    if not gpus:
        use_cpu.click(lambda: ("cpu", "hf", "colocate", "", ""), None,
                      [comps["resources.device"], comps["rollout.engine"], comps["rollout.placement"],
                       comps["resources.train_gpus"], comps["resources.rollout_gpus"]], queue=False)
        ctx.form.extras["use_cpu"] = use_cpu
        return

    def chips_to_text(sel: list[int]) -> str:
        return ", ".join(str(i) for i in sorted(sel or []))

    def text_to_chips(text: str, path: str) -> Any:
        return [i for i in _ints(text, path) if any(g.index == i for g in gpus)]

    train.input(chips_to_text, train, comps["resources.train_gpus"], queue=False)
    roll.input(chips_to_text, roll, comps["resources.rollout_gpus"], queue=False)
    comps["resources.train_gpus"].change(lambda s: text_to_chips(s, "resources.train_gpus"),
                                         comps["resources.train_gpus"], train, queue=False)
    comps["resources.rollout_gpus"].change(lambda s: text_to_chips(s, "resources.rollout_gpus"),
                                           comps["resources.rollout_gpus"], roll, queue=False)
