"""The fusion families, in the order they run. Each is one package ``otfuse/fusions/<name>/``
exporting one ``FAMILY`` (``otfuse.rewriter.family.Family``: its passes in order, the ops it
emits, whether it is opt-in, the canonicalisers it needs). A family imports the engine
(``otfuse/rewriter/``), ``otfuse.domain``, ``otfuse/canonicalise/`` and (for masks)
``otfuse.run.feeds``, never another family (docs/architecture.md).

The order matters only across families whose fused ops feed each other: norm_linear consumes the
norms the norm family produces, attention folds in the rope family's rotations. activation runs
last: its ops feed no other family, and attention's soft-capping Tanh is not its to take. Within one pass,
the largest match at each root wins.
"""

from __future__ import annotations

from otfuse.fusions import activation, attention, norm, norm_linear, rope
from otfuse.rewriter.family import Family

FAMILIES: dict[str, Family] = {family.name: family for family in (
    norm.FAMILY,
    norm_linear.FAMILY,
    rope.FAMILY,
    attention.FAMILY,
    activation.FAMILY,
)}

# Families that run only when named with ``only`` (norm_linear: see its package's docstring).
OPT_IN = frozenset(name for name, family in FAMILIES.items() if family.opt_in)


def select_families(only=None, skip=None) -> list[str]:
    """Family names to run, in registry order: ``only`` (any family) or the default ones (all but
    ``OPT_IN``), minus ``skip``."""
    known = list(FAMILIES)
    for name in list(only or []) + list(skip or []):
        if name not in FAMILIES:
            raise ValueError(f"unknown pattern family {name!r} (known: {', '.join(known)})")
    chosen = [name for name in known if (name in only if only else name not in OPT_IN)]
    return [name for name in chosen if name not in set(skip or [])]
