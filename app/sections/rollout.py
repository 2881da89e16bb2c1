"""Rollout section: engine, placement, group size, sampling, async; advanced engine knobs collapsed.
`rollout.max_turns` is shown in the Tools & environment section (app/sections/tools.py), beside the tools."""

from __future__ import annotations

from app.fields import section_fields
from app.sections import BuildContext

SHOWN_IN_TOOLS = ("rollout.max_turns",)


def build(ctx: BuildContext) -> None:
    section_fields("rollout", ctx.form, ctx.reg, ctx.values, ctx.lang, per_row=4, skip=SHOWN_IN_TOOLS)
