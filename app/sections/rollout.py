"""Rollout section: engine, placement, group size, sampling, async; advanced engine knobs collapsed."""

from __future__ import annotations

from app.fields import section_fields
from app.sections import BuildContext


def build(ctx: BuildContext) -> None:
    section_fields("rollout", ctx.form, ctx.reg, ctx.values, ctx.lang, per_row=4)
