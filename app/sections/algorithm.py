"""Algorithm section: every GRPO setting, help text shown under each field."""

from __future__ import annotations

from app.fields import section_fields
from app.sections import BuildContext


def build(ctx: BuildContext) -> None:
    section_fields("algorithm", ctx.form, ctx.reg, ctx.values, ctx.lang, per_row=4)
