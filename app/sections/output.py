"""Output section: where runs go, checkpoint/sample/eval intervals, extra metric sinks."""

from __future__ import annotations

from app.fields import section_fields
from app.sections import BuildContext


def build(ctx: BuildContext) -> None:
    section_fields("output", ctx.form, ctx.reg, ctx.values, ctx.lang)
