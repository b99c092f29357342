"""Pattern families, in the order they run. Each family is one module with a ``RULES`` list.

The order matters only across families whose fused ops feed each other (norm_linear consumes
the norms this family produces); within one family, rules are tried in their listed order.
"""

from __future__ import annotations

from otfuse.patterns import norm
from otfuse.rewriter.rule import Rule

FAMILIES: dict[str, list[Rule]] = {
    "norm": norm.RULES,
}


def select_families(only=None, skip=None) -> list[str]:
    """Family names to run, validated: ``only`` keeps, ``skip`` removes."""
    known = list(FAMILIES)
    for name in list(only or []) + list(skip or []):
        if name not in FAMILIES:
            raise ValueError(f"unknown pattern family {name!r} (known: {', '.join(known)})")
    chosen = [name for name in known if not only or name in only]
    return [name for name in chosen if name not in set(skip or [])]
