"""The fusion families, in the order they run. Each is one package ``otfuse/fusions/<name>/``
exporting one ``FAMILY`` (``otfuse.rewriter.family.Family``: its passes in order, the ops it
emits, whether it is opt-in (none is today), the canonicalisers it needs). A family imports the engine
(``otfuse/rewriter/``), ``otfuse.domain``, ``otfuse/canonicalise/`` and (for masks)
``otfuse.run.feeds``, never another family (docs/architecture.md).

The order matters only across families whose fused ops feed each other: norm_linear consumes the
norms the norm family produces, attention folds in the rope family's rotations. activation runs
last: its ops feed no other family, and attention's soft-capping Tanh is not its to take. Within one pass,
the largest match at each root wins.
"""

from __future__ import annotations

from collections.abc import Callable

from otfuse.fusions import activation, attention, norm, norm_linear, rope
from otfuse.rewriter.family import Family

FAMILIES: dict[str, Family] = {family.name: family for family in (
    norm.FAMILY,
    norm_linear.FAMILY,
    rope.FAMILY,
    attention.FAMILY,
    activation.FAMILY,
)}

# Families that run only when named with ``only`` (none today; ``Family.opt_in``).
OPT_IN = frozenset(name for name, family in FAMILIES.items() if family.opt_in)


def select_families(only=None, skip=None, *, writable: Callable[[Family], bool] | None = None) -> list[str]:
    """Family names to run, in registry order: ``only`` (any family) or the default ones (all but
    ``OPT_IN`` and those ``writable`` refuses: families whose ops a target cannot write), minus
    ``skip``. A family named in ``only`` runs whatever ``writable`` says: its sites then go back
    with the target's reason (a near miss), which is what the user asked to see."""
    known = list(FAMILIES)
    for name in list(only or []) + list(skip or []):
        if name not in FAMILIES:
            raise ValueError(f"unknown pattern family {name!r} (known: {', '.join(known)})")
    if only:
        chosen = [name for name in known if name in only]
    else:
        chosen = [name for name in known if name not in OPT_IN and (writable is None or writable(FAMILIES[name]))]
    return [name for name in chosen if name not in set(skip or [])]
