"""ALiBi generated inside the CPU attention kernel (`alibi_slopes`, `alibi_positions`; docs/ops.md
"ALiBi") against otfuse.verify.reference, and its memory: no [.., Sq, Skv] tensor, so the peak
RSS of a session grows with S, not S^2 (measured in a subprocess, nothing timed)."""

from __future__ import annotations

import numpy as np
import pytest
from peak_memory import run_child

from kernels.attention.test_cpu import DTYPES, F16, F32, check, qkv, seeded, with_past


def bloom_slopes(n: int) -> np.ndarray:
    """BLOOM's / Press et al.'s geometric slopes 2^(-8 h / n) for a power-of-two n."""
    return np.array([2.0 ** (-8.0 * (h + 1) / n) for h in range(n)], np.float32)


def padding(rng, batch: int, skv: int) -> np.ndarray:
    """Left padding in row 0, holes of 0 and non-1 values (3) elsewhere: the cumsum positions of
    "mask_cumsum" then differ from j, and any non-zero value attends."""
    mask = rng.choice(np.array([0, 1, 3], np.int64), size=(batch, skv), p=[0.2, 0.6, 0.2])
    mask[0, : skv // 3] = 0
    mask[:, -1] = 1
    return mask


@pytest.mark.parametrize("positions", ["index", "mask_cumsum"])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("path", ["direct", "packed"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_alibi_matches_reference(library, monkeypatch, dtype, path, causal, positions):
    # Small tiles: the bias crosses tile edges, the KV cache puts the query rows at P + i.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "5x16")
    rng = seeded("alibi", dtype.name, path, causal, positions)
    for sq, skv in [(37, 37), (11, 53), (1, 70)]:
        inputs = qkv(rng, 2, 4, 2, sq, skv, 32, dtype)
        if skv > sq:
            inputs = with_past(inputs, skv - sq)
        inputs["alibi_slopes"] = bloom_slopes(4)
        if positions == "mask_cumsum":
            inputs["key_padding_mask"] = padding(rng, 2, skv)
        check(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "causal": causal, "alibi_positions": positions},
              outputs=("Y", "present_key", "present_value"))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_alibi_with_window_softcap_bias_and_rope(library, dtype):
    rng = seeded("alibi-all", dtype.name)
    sq, skv = 40, 40
    inputs = qkv(rng, 1, 2, 2, sq, skv, 32, dtype)
    inputs["cos"] = np.cos(rng.standard_normal((1, 1, sq, 32), dtype=np.float32))
    inputs["sin"] = np.sin(rng.standard_normal((1, 1, sq, 32), dtype=np.float32))
    inputs["attn_bias"] = rng.standard_normal((1, 2, sq, skv), dtype=np.float32)
    inputs["alibi_slopes"] = np.array([0.5, -0.125], np.float32)  # any value: the kernel reads them
    check(library, inputs, {"num_heads": 2, "causal": 1, "window": 9, "softcap": 4.0}, op="RopeAttention")


@pytest.mark.parametrize("positions", ["index", "mask_cumsum"])
@pytest.mark.parametrize("isa", ["default", "avx2", "baseline"])
def test_alibi_with_window_and_padding_on_edge_and_inner_tiles(library, monkeypatch, isa, positions):
    # ALiBi's score pass takes each row's max as it stores the row, except on the tiles of the
    # causal / window edge (their masked columns are set after it): 8 x 32 tiles over 100 keys with
    # a window of 40 give both kinds, padding holes mask keys inside both; with and without a bias.
    if isa == "avx2":
        monkeypatch.setenv("OTFUSE_ATTENTION_ISA", "avx2")
    elif isa == "baseline":
        monkeypatch.setenv("OTFUSE_CPU_ISA", "baseline")
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "8x32")
    rng = seeded("alibi-window-padding", isa, positions)
    inputs = qkv(rng, 2, 4, 2, 100, 100, 32, F32)
    inputs["alibi_slopes"] = bloom_slopes(4)
    inputs["key_padding_mask"] = padding(rng, 2, 100)
    attrs = {"num_heads": 4, "kv_num_heads": 2, "causal": 1, "window": 40, "alibi_positions": positions}
    check(library, inputs, attrs)
    inputs["attn_bias"] = rng.standard_normal((1, 1, 1, 100), dtype=np.float32)
    check(library, inputs, attrs)


def test_mask_cumsum_without_a_mask_counts_every_key(library):
    # k_pos = j (all ones); against "index" the rows differ by the constant slope * t only.
    rng = seeded("alibi-nomask")
    inputs = qkv(rng, 1, 4, 4, 9, 9, 16, F32)
    inputs["alibi_slopes"] = bloom_slopes(4) * 8
    (cumsum,) = check(library, inputs, {"num_heads": 4, "causal": 1, "alibi_positions": "mask_cumsum"})
    (index,) = check(library, inputs, {"num_heads": 4, "causal": 1})
    np.testing.assert_allclose(cumsum, index, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", ["shape", "type", "positions"])
def test_bad_alibi_inputs_fail_with_one_message(library, bad):
    from kernels.attention.test_cpu import run_op

    rng = seeded("alibi-bad", bad)
    inputs = qkv(rng, 1, 4, 4, 3, 3, 16, F32)
    attrs = {"num_heads": 4}
    inputs["alibi_slopes"] = bloom_slopes(4)
    if bad == "shape":
        inputs["alibi_slopes"] = bloom_slopes(8)
    elif bad == "type":
        inputs["alibi_slopes"] = bloom_slopes(4).astype(np.float16)
    else:
        attrs["alibi_positions"] = "cumsum"
    with pytest.raises(Exception, match="alibi"):
        run_op(library, "Attention", inputs, attrs)


_PEAK_RSS = """
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[4])
    import ir_version
    ir_version.install()  # as tests/conftest.py does in the parent
    from kernels.attention.test_cpu import make_session, build_model
    seq, library, bias = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    n, d = 8, 16
    rng = np.random.default_rng(0)
    inputs = {name: rng.standard_normal((1, n, seq, d), dtype=np.float32) for name in ("Q", "K", "V")}
    inputs["key_padding_mask"] = np.ones((1, seq), np.int64)
    slopes = np.array([2.0 ** -(h + 1) for h in range(n)], np.float32)
    attrs = {"num_heads": n, "causal": 1}
    if bias == "slopes":
        inputs["alibi_slopes"], attrs["alibi_positions"] = slopes, "mask_cumsum"
    else:  # the control: the same ALiBi materialised as a [1, N, S, S] attn_bias
        positions = np.broadcast_to(np.arange(seq, dtype=np.float32), (1, n, seq, seq))
        inputs["attn_bias"] = slopes[None, :, None, None] * positions
    session = make_session(build_model("Attention", inputs, attrs), library, threads=1)
    session.run(None, inputs)
    print(json.dumps(peak_rss()))
"""


def _peak_rss(library: str, seq: int, bias: str = "slopes") -> int:
    from pathlib import Path

    return run_child(_PEAK_RSS, seq, library, bias, Path(__file__).resolve().parents[2])


def test_alibi_memory_grows_linearly_with_the_sequence(library):
    # A [1, 8, S, S] float32 bias (or scores) would be 128 MiB at S = 2048 and 2 MiB at 256; the
    # inputs and outputs grow by 2.5 MiB. Allow 24 MiB for everything O(S) and allocator noise.
    short, long = _peak_rss(library, 256), _peak_rss(library, 2048)
    assert long - short < 24 * 2**20, (short, long)
    # The control: the same measurement sees a materialised [1, 8, 2048, 2048] bias (128 MiB).
    control = _peak_rss(library, 2048, "materialised") - short
    assert control > 96 * 2**20, (short, long, control)



@pytest.mark.parametrize("path", ["direct", "packed"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_alibi_rounded_to_float16_matches_reference_at_4096_keys(library, monkeypatch, dtype, path):
    # alibi_round = 1: float16(slope * float16(k_pos)). Past key 2048 float16 skips integers and
    # rounds the products (by up to 1 at slope 2^-0.5), so the reference of the exact form is far
    # off where the rounded one matches, under the default (AVX-512 here), AVX2 and baseline kernels.
    from kernels.attention.test_cpu import _under_each_isa, assert_close, reference_outputs

    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    rng = seeded("alibi_round", dtype.name, path)
    sq, skv = 3, 4096
    inputs = with_past(qkv(rng, 1, 4, 4, sq, skv, 16, dtype), skv - sq)
    inputs["alibi_slopes"] = np.array([2.0**-0.5, 0.3, 2.0**-3, 2.0**-8], np.float32)
    inputs["key_padding_mask"] = padding(rng, 1, skv)
    inputs["key_padding_mask"][0, : skv // 3] = 1  # keeps the last positions past 2048
    attrs = {"num_heads": 4, "causal": 1, "alibi_positions": "mask_cumsum", "alibi_round": 1}
    outputs = _under_each_isa(library, monkeypatch, inputs, attrs)  # each checked against the reference
    (exact, _, _) = reference_outputs("Attention", inputs, {**attrs, "alibi_round": 0})
    for got in outputs:
        assert_close(got, outputs[-1])
        with pytest.raises(AssertionError):
            assert_close(got, exact)


def test_alibi_round_needs_mask_cumsum(library):
    rng = seeded("alibi_round_index")
    inputs = qkv(rng, 1, 2, 2, 4, 4, 8, F32)
    inputs["alibi_slopes"] = bloom_slopes(2)
    with pytest.raises(Exception, match="alibi_round = 1 needs"):
        check(library, inputs, {"num_heads": 2, "alibi_round": 1})



@pytest.mark.parametrize("positions", ["index", "mask_cumsum", "rounded"])
@pytest.mark.parametrize("isa", ["default", "avx2", "baseline"])
@pytest.mark.parametrize("tiles", ["8x32", "5x16"])
def test_alibi_terms_equal_the_materialised_bias_bit_for_bit(library, monkeypatch, isa, positions, tiles):
    # The kernel forms one head's ALiBi terms once per tile and every row reads them at its own
    # offset ("index": row i + 1's term at key j is row i's at j - 1; "mask_cumsum": the same row).
    # Each term must still be slope * float32(k_pos - q_pos) (float16-rounded with alibi_round),
    # added where attn_bias is: Y equal bit for bit to the same ALiBi given as a float32
    # [B, N, Sq, Skv] attn_bias (reference.alibi_bias). With a KV cache (q_pos = P + i), a window,
    # padding holes, partial tiles of rows and keys (17 rows, 66 new keys). Negative slopes: the
    # kernel walks the key tiles forwards then, as for attn_bias (positive ones: backwards).
    from kernels.attention.test_cpu import run_op
    from otfuse.verify.reference import alibi_bias

    if isa == "avx2":
        monkeypatch.setenv("OTFUSE_ATTENTION_ISA", "avx2")
    elif isa == "baseline":
        monkeypatch.setenv("OTFUSE_CPU_ISA", "baseline")
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", tiles)
    rng = seeded("alibi-terms-bias", isa, positions, tiles)
    sq, skv = 17, 83
    inputs = with_past(qkv(rng, 2, 4, 2, sq, skv, 32, F32), skv - sq)
    slopes = -np.array([0.5, 0.25, 2.0**-3, 0.3], np.float32)
    inputs["key_padding_mask"] = padding(rng, 2, skv)
    attrs = {"num_heads": 4, "kv_num_heads": 2, "causal": 1, "window": 60}
    mode = "index" if positions == "index" else "mask_cumsum"
    round_half = int(positions == "rounded")
    if mode != "index":
        attrs["alibi_positions"] = mode
    if round_half:
        attrs["alibi_round"] = 1
    (generated,) = run_op(library, "Attention", {**inputs, "alibi_slopes": slopes}, attrs)
    bias = alibi_bias(slopes, inputs["key_padding_mask"], mode, 2, sq, skv, round_half)
    plain = {k: v for k, v in attrs.items() if not k.startswith("alibi")}
    (materialised,) = run_op(library, "Attention", {**inputs, "attn_bias": np.ascontiguousarray(bias)}, plain)
    np.testing.assert_array_equal(generated, materialised)
