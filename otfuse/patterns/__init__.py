"""Pattern families, in the order they run. Each family is one module whose ``PASSES`` list
says what runs: usually one ``RulePass`` over its rules, sometimes followed by a pass that
combines what the first produced (e.g. pairing the q and k rotations of one attention).

The order matters only across families whose fused ops feed each other (norm_linear consumes
the norms this family produces); within one pass, the largest match at each root wins.
"""

from __future__ import annotations

from otfuse.patterns import attention, norm, norm_linear, rope
from otfuse.rewriter.passes import Pass

FAMILIES: dict[str, list[Pass]] = {
    "norm": norm.PASSES,
    "norm_linear": norm_linear.PASSES,
    "rope": rope.PASSES,
    "attention": attention.PASSES,
}


def select_families(only=None, skip=None) -> list[str]:
    """Family names to run, validated: ``only`` keeps, ``skip`` removes."""
    known = list(FAMILIES)
    for name in list(only or []) + list(skip or []):
        if name not in FAMILIES:
            raise ValueError(f"unknown pattern family {name!r} (known: {', '.join(known)})")
    chosen = [name for name in known if not only or name in only]
    return [name for name in chosen if name not in set(skip or [])]
