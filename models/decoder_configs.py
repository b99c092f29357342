"""Tiny configs of decoders that spell RoPE, attention, norms or the MLP activation differently from
the first corpus families (export_fixtures.py, export_matrix.py): the same tiny sizes (hidden 64,
2 layers, 4 heads of 16, 2 kv heads), for models/export_matrix.py's ARCHS.

Each function names what its architecture spells differently; transformers 4.57 key names.
"""

from __future__ import annotations

import transformers

import export_fixtures as ef

_HALF = ef.HEAD_DIM // 2  # rotary frequencies of a full-width rotary


def cohere_config():  # interleaved RoPE, bias-free LayerNorm (mean subtracted), parallel attention + MLP
    return transformers.CohereConfig(**ef._gqa_sizes(layer_norm_eps=1e-5, logit_scale=0.25, use_qk_norm=False,
                                                     pad_token_id=0, bos_token_id=1, eos_token_id=2))


def cohere_qknorm_config():  # as cohere + per-head LayerNorm of q and k (CohereLayerNorm over head_dim)
    return transformers.CohereConfig(**ef._gqa_sizes(layer_norm_eps=1e-5, logit_scale=0.25, use_qk_norm=True,
                                                     pad_token_id=0, bos_token_id=1, eos_token_id=2))


def olmo2_config():  # q/k RMSNorm over the whole projection (before the head split), post-norms
    return transformers.Olmo2Config(**ef._gqa_sizes(rms_norm_eps=1e-6, pad_token_id=1, bos_token_id=None,
                                                    eos_token_id=2))


def gemma3_config():  # layer 0 sliding (local rope base 1e4), layer 1 full (base 1e6); q/k (1 + w) RMSNorm
    return transformers.Gemma3TextConfig(**ef._gqa_sizes(
        head_dim=ef.HEAD_DIM, rms_norm_eps=1e-6, sliding_window=4, layer_types=["sliding_attention",
                                                                                "full_attention"],
        rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, query_pre_attn_scalar=ef.HEAD_DIM,
        final_logit_softcapping=None, attn_logit_softcapping=None, pad_token_id=0, bos_token_id=2,
        eos_token_id=1))


def llama3_rope_config():  # llama-3.1's frequency-dependent rope scaling (inv_freq rescaled, constant)
    return transformers.LlamaConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}))


def llama_yarn_config():  # YaRN: rescaled inv_freq and cos/sin multiplied by the attention factor
    return transformers.LlamaConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-5, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}))


def llama_dynamic_config():  # dynamic NTK: inv_freq recomputed when the positions pass max_position_embeddings
    return transformers.LlamaConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-5, rope_scaling={
        "rope_type": "dynamic", "factor": 2.0}))


def phi3_longrope_config():  # longrope: short/long factors per frequency, cos/sin scaled by the mscale
    return transformers.Phi3Config(**ef._gqa_sizes(
        rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0,
        original_max_position_embeddings=32,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(_HALF)],
                      "long_factor": [2.0 + 0.5 * i for i in range(_HALF)]}))


def nemotron_config():  # relu² MLP (no gate), partial rotary (half), LayerNorm1P: (1 + w) LayerNorm
    return transformers.NemotronConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, partial_rotary_factor=0.5,
                                                       norm_eps=1e-5, hidden_act="relu2", pad_token_id=0,
                                                       bos_token_id=1, eos_token_id=2))


def glm_config():  # interleaved partial rotary (half of head_dim), fused gate_up projection
    return transformers.GlmConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, partial_rotary_factor=0.5,
                                                  rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=[1],
                                                  bos_token_id=None))


def glm4_config():  # as glm + post-attention and post-MLP RMSNorms (4 per layer)
    return transformers.Glm4Config(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, partial_rotary_factor=0.5,
                                                   rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=[1],
                                                   bos_token_id=None))


def helium_config():
    return transformers.HeliumConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-8, pad_token_id=0,
                                                     bos_token_id=1, eos_token_id=2))


def exaone4_config():  # q/k per-head RMSNorm, post-norms (no pre-norm), layer 0 sliding without rope-less
    return transformers.Exaone4Config(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-5, sliding_window=4,
                                                      layer_types=["sliding_attention", "full_attention"],
                                                      pad_token_id=0, bos_token_id=1, eos_token_id=2))


def smollm3_config():  # NoPE on every 2nd layer here (no rope on layer 1)
    return transformers.SmolLM3Config(**ef._gqa_sizes(rms_norm_eps=1e-6, no_rope_layer_interval=2,
                                                      use_sliding_window=False, pad_token_id=0,
                                                      bos_token_id=1, eos_token_id=2))


def arcee_config():  # relu² MLP without a gate, llama otherwise
    return transformers.ArceeConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-5, hidden_act="relu2",
                                                    pad_token_id=0, bos_token_id=1, eos_token_id=2))


def apertus_config():  # xIELU activation, q/k RMSNorm, llama3 rope
    return transformers.ApertusConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-5, pad_token_id=0,
                                                      bos_token_id=1, eos_token_id=2))


# The MoE decoders' routing (which tokens each expert takes) is data: dynamo refuses it
# (GuardOnDataDependentSymNode on nonzero), TorchScript bakes the traced routing into constants.
# GraniteMoE's parallel experts export with dynamo.
MOE_TRACE = {"torchscript": "the traced routing (tokens per expert) is baked in as constants; qwen2_moe's "
                            "ts17 export passed the two checked inputs and fails on a third (Split sizes)"}


def mixtral_config():  # SwiGLU in 4 experts, top-2 routing
    return transformers.MixtralConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-5, num_local_experts=4,
                                                      num_experts_per_tok=2, sliding_window=None,
                                                      router_jitter_noise=0.0))


def qwen2_moe_config():  # experts + a gated shared expert
    return transformers.Qwen2MoeConfig(**ef._gqa_sizes(rms_norm_eps=1e-6, num_experts=4, num_experts_per_tok=2,
                                                       moe_intermediate_size=ef.INTERMEDIATE // 2,
                                                       shared_expert_intermediate_size=ef.INTERMEDIATE,
                                                       decoder_sparse_step=1, use_sliding_window=False))


def granitemoe_config():  # parallel experts (one batched matmul), granite's multipliers
    return transformers.GraniteMoeConfig(**ef._gqa_sizes(rms_norm_eps=1e-6, num_local_experts=4,
                                                         num_experts_per_tok=2, embedding_multiplier=2.0,
                                                         residual_multiplier=0.5, attention_multiplier=0.2,
                                                         logits_scaling=4.0))


def qwen2_vl_text_config():  # multimodal rope (mrope sections t/h/w over 3 position rows)
    return transformers.Qwen2VLTextConfig(**ef._gqa_sizes(rms_norm_eps=1e-6, rope_scaling={
        "type": "mrope", "mrope_section": [2, 3, 3]}))


def deepseek_v3_config():  # MLA: low-rank q and kv, rope on a separate 8-dim slice, interleaved
    # Both layers dense (first_k_dense_replace = layers): the routed experts export with neither
    # exporter (MOE_TRACE), and MLA is what this architecture spells differently.
    return transformers.DeepseekV3Config(
        hidden_size=ef.HIDDEN, num_hidden_layers=ef.LAYERS, num_attention_heads=ef.HEADS,
        num_key_value_heads=ef.HEADS, intermediate_size=ef.INTERMEDIATE, moe_intermediate_size=32,
        vocab_size=ef.VOCAB, max_position_embeddings=ef.MAX_POS, use_cache=False, attention_dropout=0.0,
        q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
        first_k_dense_replace=ef.LAYERS, rope_interleave=True, rms_norm_eps=1e-6)


def persimmon_config():  # partial rotary, q/k LayerNorm per head, relu² MLP, fused QKV
    return transformers.PersimmonConfig(hidden_size=ef.HIDDEN, num_hidden_layers=ef.LAYERS,
                                        num_attention_heads=ef.HEADS, intermediate_size=ef.INTERMEDIATE,
                                        vocab_size=ef.VOCAB, max_position_embeddings=ef.MAX_POS,
                                        partial_rotary_factor=0.5, qk_layernorm=True, hidden_dropout=0.0,
                                        attention_dropout=0.0, use_cache=False, pad_token_id=0, bos_token_id=1,
                                        eos_token_id=2)


def stablelm_qk_config():  # q/k LayerNorm per head (one nn.LayerNorm per head), partial rotary
    # use_qkv_bias: without it transformers 4.57's _init_weights fails on the bias-free per-head norms
    return transformers.StableLmConfig(**ef._gqa_sizes(partial_rotary_factor=0.25, layer_norm_eps=1e-5,
                                                       qk_layernorm=True, use_qkv_bias=True))


# --------------------------------------------------------------------------------------------
# transformers 5.x decoders (5.24's key names: rope_parameters, layer_types). MoE layers export
# with dynamo only (MOE_TRACE); the Mamba / linear-attention hybrids' attention layers are their
# sites (models/sites.py counts softmax / sdpa calls, so the recurrent mixers are none).
# --------------------------------------------------------------------------------------------

_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)


def gpt_oss_config():  # attention sinks (a per-head logit in the softmax), sliding/full layers, clamped SwiGLU
    return transformers.GptOssConfig(**ef._gqa_sizes(
        head_dim=ef.HEAD_DIM, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], rms_norm_eps=1e-5, attention_bias=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2))


def qwen3_moe_config():  # qwen3 (q/k per-head RMSNorm) with experts
    return transformers.Qwen3MoeConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, num_experts=4, **_MOE,
                                                       rms_norm_eps=1e-6, decoder_sparse_step=1))


def qwen3_next_config():  # gated DeltaNet layer + gated full attention (q gate, partial rotary, (1 + w) RMSNorm)
    return transformers.Qwen3NextConfig(**ef._gqa_sizes(
        head_dim=ef.HEAD_DIM, num_experts=4, **_MOE, shared_expert_intermediate_size=32,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"], rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.25}))


def llama4_text_config():  # layer 0 chunked attention with complex RoPE + L2 qk norm, layer 1 NoPE
    # full attention with temperature tuning; MoE on layer 1 (interleave step 2), dense on layer 0
    return transformers.Llama4TextConfig(**ef._gqa_sizes(
        head_dim=ef.HEAD_DIM, intermediate_size_mlp=ef.INTERMEDIATE, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layers=[1, 0], attention_chunk_size=4,
        use_qk_norm=True, attn_temperature_tuning=True, floor_scale=4, attn_scale=0.1, rms_norm_eps=1e-5,
        pad_token_id=0, bos_token_id=1, eos_token_id=2))


def gemma3n_text_config():  # AltUp, Laurel, per-layer inputs, KV-shared layers, q/k/v RMSNorm, sparse GELU
    return transformers.Gemma3nTextConfig(**ef._gqa_sizes(
        head_dim=ef.HEAD_DIM, rms_norm_eps=1e-6, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], vocab_size_per_layer_input=ef.VOCAB,
        hidden_size_per_layer_input=16, altup_num_inputs=2, laurel_rank=8, num_kv_shared_layers=0,
        activation_sparsity_pattern=[0.95, 0.0], final_logit_softcapping=30.0, intermediate_size=[128, 128]))


def olmo3_config():  # olmo2's whole-projection q/k RMSNorm + sliding/full layers
    return transformers.Olmo3Config(**ef._gqa_sizes(rms_norm_eps=1e-6, sliding_window=4,
                                                    layer_types=["sliding_attention", "full_attention"],
                                                    pad_token_id=1, bos_token_id=None, eos_token_id=2))


def ernie4_5_config():  # interleaved RoPE (cos/sin repeat_interleave), llama otherwise
    return transformers.Ernie4_5Config(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-5,
                                                       tie_word_embeddings=False))


def hunyuan_v1_dense_config():  # q/k per-head RMSNorm after the rotation
    return transformers.HunYuanDenseV1Config(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-5,
                                                             eod_token_id=3))


def seed_oss_config():  # q/k/v biases, no o bias
    return transformers.SeedOssConfig(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, rms_norm_eps=1e-6,
                                                      attention_dropout=0.0, residual_dropout=0.0))


def glm4_moe_config():  # partial rotary (half), layer 0 dense, layer 1 grouped top-k experts + shared
    return transformers.Glm4MoeConfig(**ef._gqa_sizes(
        head_dim=ef.HEAD_DIM, n_routed_experts=4, n_shared_experts=1, **_MOE, first_k_dense_replace=1,
        n_group=1, topk_group=1, use_qk_norm=True, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}))


def dots1_config():  # qwen3-style q/k RMSNorm, deepseek-style experts
    return transformers.Dots1Config(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, n_routed_experts=4, n_shared_experts=1,
                                                    **_MOE, first_k_dense_replace=1, rms_norm_eps=1e-6))


def minimax_config():  # lightning (linear) attention layer + softmax attention layer, experts
    return transformers.MiniMaxConfig(**ef._gqa_sizes(
        head_dim=ef.HEAD_DIM, num_local_experts=4, num_experts_per_tok=2, block_size=4,
        layer_types=["linear_attention", "full_attention"], rms_norm_eps=1e-5))


_MAMBA = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4,
              mamba_expand=1, mamba_chunk_size=4)


def falcon_h1_config():  # attention and Mamba2 in parallel in every layer, muP multipliers
    return transformers.FalconH1Config(**ef._gqa_sizes(head_dim=ef.HEAD_DIM, **_MAMBA, mamba_d_ssm=64,
                                                       rms_norm_eps=1e-5))


def bamba_config():  # layer 0 Mamba2, layer 1 attention (partial rotary, half)
    return transformers.BambaConfig(**ef._gqa_sizes(**_MAMBA, attn_layer_indices=[1], rms_norm_eps=1e-5))


def granitemoehybrid_config():  # layer 0 Mamba2, layer 1 attention (NoPE), parallel experts + shared MLP
    return transformers.GraniteMoeHybridConfig(**ef._gqa_sizes(
        **_MAMBA, layer_types=["mamba", "attention"], num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=64, embedding_multiplier=2.0, residual_multiplier=0.5,
        attention_multiplier=0.2, logits_scaling=4.0, position_embedding_type="rope", rms_norm_eps=1e-6))


def lfm2_config():  # layer 0 short gated convolution, layer 1 attention with q/k per-head RMSNorm
    return transformers.Lfm2Config(**ef._gqa_sizes(norm_eps=1e-5, layer_types=["conv", "full_attention"],
                                                   block_auto_adjust_ff_dim=False))


def deepseek_v2_config():  # MLA with complex (view_as_complex) RoPE on the 8-lane slice, dense layers
    return transformers.DeepseekV2Config(
        hidden_size=ef.HIDDEN, num_hidden_layers=ef.LAYERS, num_attention_heads=ef.HEADS,
        num_key_value_heads=ef.HEADS, intermediate_size=ef.INTERMEDIATE, moe_intermediate_size=32,
        vocab_size=ef.VOCAB, max_position_embeddings=ef.MAX_POS, use_cache=False, attention_dropout=0.0,
        q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=ef.LAYERS,
        rms_norm_eps=1e-6)


# Committed fixtures (models/fixtures/arch5): the same architectures at sizes whose weights fit in
# well under 100 KB (hidden 32, 2 heads of 16, 1 kv head, MLP 32, vocab 32, 2 experts of 16).
_FIXTURE_SIZES = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      intermediate_size=32, vocab_size=32, vocab_size_per_layer_input=32, moe_intermediate_size=16,
                      num_local_experts=2, num_experts=2, mamba_n_heads=2, mamba_d_ssm=32)


def fixture_config(make):
    """``make``'s config shrunk to the fixture sizes (only the keys it has)."""
    def shrunk():
        config = make()
        per_layer = isinstance(getattr(config, "intermediate_size", None), list)  # gemma3n: one per layer
        for key, value in _FIXTURE_SIZES.items():
            if hasattr(config, key):
                setattr(config, key, value)
        if per_layer:
            config.intermediate_size = [_FIXTURE_SIZES["intermediate_size"]] * config.num_hidden_layers
        if hasattr(config, "intermediate_size_mlp"):  # llama4's dense layers
            config.intermediate_size_mlp = _FIXTURE_SIZES["intermediate_size"]
        return config
    shrunk.__name__ = f"{make.__name__}_fixture"
    return shrunk
