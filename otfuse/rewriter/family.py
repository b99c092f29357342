"""What a fusion family is to the pipeline and the CLI: its name, its passes in order, the otfuse
ops it emits, whether it runs by default, and the canonicalisers it needs before its passes.

Each ``otfuse/fusions/<name>/`` package exports one ``FAMILY``; ``otfuse/fusions/__init__.py``
lists them in the order they run (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from otfuse.rewriter.passes import Pass
from otfuse.rewriter.sites import SiteSignature


@dataclass(frozen=True)
class Family:
    name: str  # what ``--only`` / ``--skip`` take
    passes: tuple[Pass, ...]  # run in this order, each over the whole graph
    emits: tuple[str, ...]  # the otfuse ops (docs/ops.md) its passes put in the graph
    opt_in: bool = False  # runs only when named with ``only`` (a trade-off to choose, not a default)
    # Passes of otfuse/canonicalise/ the family's patterns rely on: each runs once per model,
    # right before the first selected family that lists it.
    canonicalise: tuple[Pass, ...] = ()
    # What the family's sites look like (rewriter/sites.py): one left in the graph that no near
    # miss names is reported as unfused, so no site goes unmentioned.
    sites: tuple[SiteSignature, ...] = ()
