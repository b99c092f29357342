"""Pattern families, in the order they run. Each family is one module whose ``PASSES`` list
says what runs: usually one ``RulePass`` over its rules, sometimes followed by a pass that
combines what the first produced (e.g. pairing the q and k rotations of one attention).

The order matters only across families whose fused ops feed each other (norm_linear consumes
the norms this family produces); within one pass, the largest match at each root wins.
"""

from __future__ import annotations

from otfuse.patterns import (attention, attention_onnx, norm, norm_linear, rope, rope_attention_fold, rope_onnx,
                             rope_pairs, shape_reads)
from otfuse.rewriter.passes import Pass

FAMILIES: dict[str, list[Pass]] = {
    "norm": norm.PASSES,
    "norm_linear": norm_linear.PASSES,
    "rope": rope_onnx.PASSES + rope_pairs.PASSES + rope.PASSES,  # before rope's pairing pass, so all pair
    # shape_reads first: TorchScript's Shape reads of the rotated q / repeated v would pin them.
    "attention": shape_reads.PASSES + attention.PASSES + attention_onnx.PASSES + rope_attention_fold.PASSES,
}


# Families that run only when named with ``only``. norm_linear: its packed weights sit beside the
# initializers ORT keeps, doubling the projections' memory, for ~1.3x at 8-32 tokens, 2x in fp16
# decode, but only 1.0-1.1x in fp32 decode and at long prompts (MLAS at this CPU's FMA peak or the
# memory bandwidth; bench/README.md): a trade-off to opt into.
OPT_IN = frozenset({"norm_linear"})


def select_families(only=None, skip=None) -> list[str]:
    """Family names to run, in registry order: ``only`` (any family) or the default ones (all but
    ``OPT_IN``), minus ``skip``."""
    known = list(FAMILIES)
    for name in list(only or []) + list(skip or []):
        if name not in FAMILIES:
            raise ValueError(f"unknown pattern family {name!r} (known: {', '.join(known)})")
    chosen = [name for name in known if (name in only if only else name not in OPT_IN)]
    return [name for name in chosen if name not in set(skip or [])]
