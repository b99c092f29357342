"""A mask transformers' TorchScript exports can trace.

transformers 4.57 builds every causal / sliding / padding mask by `torch.vmap` of its mask functions
(masking_utils.sdpa_mask), which the TorchScript tracer cannot run (`IndexError: unordered_map::at`
for every decoder). `broadcast_masks()` swaps in the same mask evaluated on broadcast index
tensors (`b [B,1,1,1]`, `h [1,1,1,1]`, `q [1,1,Q,1]`, `kv [1,1,1,KV]`): the mask functions are
element-wise comparisons and `padding_mask[b, kv]` gathers, so the values are the same. Used around
TorchScript exports only; the dynamo exporter traces the vmap itself.

transformers 5.x's `sdpa_mask(batch_size, q_length, kv_length, ...)` builds its masks without vmap
by default (`use_vmap=False`) and traces as it is: there `broadcast_masks()` changes nothing.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from transformers import masking_utils as mu


def broadcast_sdpa_mask(batch_size, cache_position, kv_length, kv_offset=0, mask_function=mu.causal_mask_function,
                        attention_mask=None, local_size=None, allow_is_causal_skip=True, **kwargs):
    q_length = cache_position.shape[0]
    padding_mask = mu.prepare_padding_mask(attention_mask, kv_length, kv_offset, _slice=False)
    if allow_is_causal_skip and mu._ignore_causal_mask_sdpa(padding_mask, q_length, kv_length, kv_offset, local_size):
        return None
    kv_arange = torch.arange(kv_length, device=cache_position.device) + kv_offset
    if padding_mask is not None:
        mask_function = mu.and_masks(mask_function, mu.padding_mask_function(padding_mask))
    b = torch.arange(batch_size, device=cache_position.device).view(-1, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=cache_position.device)
    q = cache_position.view(1, 1, -1, 1)
    kv = kv_arange.view(1, 1, 1, -1)
    mask = mask_function(b, h, q, kv)
    return mask.expand(batch_size, 1, q_length, kv_length)


@contextlib.contextmanager
def broadcast_masks():
    """transformers' sdpa (and, through it, eager) masks built without vmap, for the duration."""
    if "cache_position" not in inspect.signature(mu.sdpa_mask).parameters:  # transformers 5: no vmap
        yield
        return
    mapping = mu.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    saved_module, saved_sdpa = mu.sdpa_mask, mapping["sdpa"]
    mu.sdpa_mask = mapping["sdpa"] = broadcast_sdpa_mask  # eager_mask calls the module's sdpa_mask
    try:
        yield
    finally:
        mu.sdpa_mask, mapping["sdpa"] = saved_module, saved_sdpa
