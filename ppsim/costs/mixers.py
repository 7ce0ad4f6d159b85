"""The hybrid pattern's layer kinds: shapes, parameters, ops and kept tensors.

Each symbol of a Megatron hybrid pattern (ppsim.costs.hybrid) is one layer with its
own pre-norm and residual: "mamba" (Mamba-2: in_proj to z, x, B, C, dt; a causal
depthwise conv; the chunked SSD scan; a gated RMSNorm; out_proj), "gdn"
(GatedDeltaNet: in_proj to q, k, v, z, beta, alpha; a conv; the chunked gated delta
rule; a gated RMSNorm; out_proj), "attention" / "mla" (an attention block alone),
"dsa" (MLA whose queries attend to the top-k keys a lightning indexer picks), "mlp"
and "moe-mlp" (an MLP or a MoE block alone). Shapes follow Megatron-LM's MambaMixer
(megatron/core/ssm/mamba_mixer.py) and GatedDeltaNet (ssm/gated_delta_net/gdn.py).

The two scans are priced as attention is (ppsim.costs.ops): fused kernels over
chunks (mamba_ssm's SSD, FLA's chunked delta rule) at FlashAttention's efficiency
and backward ratio; their FLOPs are the chunked algorithms' matmuls (docs/model.md).
Mamba-2 keeps what mamba_ssm's fused training kernel keeps (its input and the scan's
output: the conv and the inter-chunk states are recomputed in its backward);
GatedDeltaNet's inter-chunk states are kept in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.attention_shape import attention_shape
from ppsim.costs.fp8 import MX_BLOCK, fp8_bytes, fp8_ops
from ppsim.costs.layerops import (
    _mlp_ops,
    _mm,
    _norm_bytes,
    _residual,
    _stream_norm_ops,
    _tokens,
    attention_ops,
    mlp_ops,
    rank_bytes,
)
from ppsim.costs.modules import layer_activation_bytes
from ppsim.costs.ops import Op
from ppsim.costs.params import KindParams, attention_params, kind_params
from ppsim.costs.saved import HYBRID_HALVES
from ppsim.errors import UserError

MAMBA_CONV = 4
"""Mamba-2's causal conv width (MambaMixer's d_conv default)."""
MAMBA_CHUNK = 128
"""SSD chunk length (MambaMixer's chunk_size default)."""
GDN_CHUNK = 64
"""The chunk of FLA's chunk_gated_delta_rule."""
FP8_ALIGN = 16
"""What an FP8 GEMM's dimensions divide by (megatron/core/fp8_utils.py
get_fp8_align_size; MX_BLOCK under mxfp8)."""
MIXER_KINDS = ("mamba", "gdn", "attention", "mla", "dsa", "mlp", "moe-mlp")
ATTENTION_KINDS = ("dense", "moe", "attention", "mla", "dsa")
"""Layer kinds with a full attention block: its cost grows with the sequence, and context
parallelism splits it by sequence chunks. Mamba and GatedDeltaNet mixers are linear in
the sequence and split by heads; MLP and MoE blocks alone have no attention."""


@dataclass(frozen=True, kw_only=True)
class MambaShape:
    """Widths of one Mamba-2 layer (whole, before tensor parallelism)."""

    heads: int
    """H: SSM heads (Megatron's nheads)."""
    head_dim: int
    """P: channels per head."""
    groups: int
    """G: groups sharing one B and one C."""
    state: int
    """N: state size per head and channel."""
    inner: int
    """d_inner = heads x head_dim."""
    conv: int
    """Channels the conv runs over: x, B and C."""
    in_proj: int
    """in_proj's output: z, x, B, C and dt."""


def _need(a: Architecture, names: tuple[str, ...], layers: str) -> None:
    for name in names:
        if getattr(a, name) < 1:
            raise UserError(f"model.{name}", f"is {getattr(a, name)} but {layers} layers need "
                            "at least 1", f"set {name} >= 1")


def _fp8_aligned(a: Architecture, in_proj: int, layer: str, field: str) -> None:
    """Megatron's FP8 assertion on a mixer (MambaMixer, GatedDeltaNet): FP8 GEMMs take
    dimensions in multiples of 16 (32 under MXFP8)."""
    align = MX_BLOCK if a.fp8_recipe == "mxfp8" else FP8_ALIGN
    if a.fp8 and not a.nvfp4 and in_proj % align:  # Megatron asserts FP8's
        raise UserError(field, f"For FP8, the innermost dimension of the {layer} layer input "
                        f"projection output tensor must be a multiple of {align} (it is "
                        f"{in_proj})",
                        "change the mixer's widths, or drop fp8 (--fp8-format)")


def mamba_shape(a: Architecture) -> MambaShape:
    _need(a, ("mamba_head_dim", "mamba_num_groups", "mamba_state_dim"), "Mamba-2 ('M')")
    heads = a.mamba_num_heads or 2 * a.hidden_size // a.mamba_head_dim
    inner, bc = heads * a.mamba_head_dim, 2 * a.mamba_num_groups * a.mamba_state_dim
    if heads < 1 or heads % a.mamba_num_groups:
        raise UserError("model.mamba_num_heads", f"{heads} heads do not divide into "
                        f"{a.mamba_num_groups} groups", "Megatron needs heads % groups == 0")
    in_proj = 2 * inner + bc + heads
    _fp8_aligned(a, in_proj, "Mamba", "model.mamba_num_heads")
    return MambaShape(heads=heads, head_dim=a.mamba_head_dim, groups=a.mamba_num_groups,
                      state=a.mamba_state_dim, inner=inner, conv=inner + bc, in_proj=in_proj)


@dataclass(frozen=True, kw_only=True)
class DeltaShape:
    """Widths of one GatedDeltaNet layer."""

    key: int
    """Query (and key) width: key heads x key head width."""
    value: int
    """Value (and gate) width: value heads x value head width."""
    value_heads: int
    """Heads of the delta rule (the value heads; query/key heads repeat over them)."""
    conv: int
    """Channels the conv runs over: q, k and v."""
    in_proj: int
    """in_proj's output: q, k, v, z, beta and alpha."""


def delta_shape(a: Architecture) -> DeltaShape:
    _need(a, ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
              "linear_value_head_dim", "linear_conv_kernel_dim"), "GatedDeltaNet ('G')")
    key = a.linear_num_key_heads * a.linear_key_head_dim
    value, hv = a.linear_num_value_heads * a.linear_value_head_dim, a.linear_num_value_heads
    if hv % a.linear_num_key_heads:
        raise UserError("model.linear_num_value_heads", f"{hv} value heads do not divide by "
                        f"{a.linear_num_key_heads} key heads", "make them divide")
    in_proj = 2 * key + 2 * value + 2 * hv
    _fp8_aligned(a, in_proj, "GDN", "model.linear_num_value_heads")
    return DeltaShape(key=key, value=value, value_heads=hv, conv=2 * key + value,
                      in_proj=in_proj)


def _latent(a: Architecture) -> Architecture:
    """The architecture an MLA or DSA layer runs: Megatron infers MLA from '+' or 'D'."""
    if not a.kv_lora_rank:
        raise UserError("model.kv_lora_rank", "MLA and DSA layers ('+', 'D') need the MLA "
                        "widths", "set kv_lora_rank, qk_rope_head_dim (and q_lora_rank)")
    return replace(a, attention="mla")


def attention_arch(a: Architecture, kind: str) -> Architecture:
    """The architecture a layer of `kind` attends with: MLA's for '+' and 'D' layers."""
    return _latent(a) if kind in ("mla", "dsa") else a


def _norm_width(a: Architecture) -> int:
    return a.hidden_size * (1 if a.rmsnorm else 2)


# ------------------------------------------------------------------ parameters


def mixer_params(a: Architecture, kind: str) -> KindParams:
    """Parameters of one hybrid layer of `kind`, its pre-norm included."""
    h, norm = a.hidden_size, _norm_width(a)
    if kind == "mamba":
        m = mamba_shape(a)
        mats = h * m.in_proj + m.inner * h
        # conv weight and bias, dt_bias, A_log, D, the gated norm: split by tp with heads
        other = m.conv * (MAMBA_CONV + 1) + 3 * m.heads + m.inner
        return KindParams(mats + other + norm, 0, mats + other, norm)
    if kind == "gdn":
        d = delta_shape(a)
        mats = h * d.in_proj + d.value * h
        other = d.conv * a.linear_conv_kernel_dim + 2 * d.value_heads + a.linear_value_head_dim
        return KindParams(mats + other + norm, 0, mats + other, norm)
    if kind in ("attention", "mla", "dsa"):
        b = a if kind == "attention" else _latent(a)
        block = attention_params(b)
        mats, norms = block.matmuls, block.norms * (1 if a.rmsnorm else 2)
        if kind == "dsa":
            mats += _indexer_params(b)
        return KindParams(mats + norms, 0, mats, norms, block.duplicated)
    if kind == "mlp":
        mats = h * a.ffn_hidden_size * (3 if a.gated_mlp else 2)
        return KindParams(mats + norm, 0, mats, norm)
    if kind == "moe-mlp":
        # kind_params' MoE layer without its attention block and that block's norms
        full, block = kind_params(a, "moe"), attention_params(a)
        dense = full.dense - block.matmuls - block.norms * (1 if a.rmsnorm else 2)
        return KindParams(dense, full.experts, full.active - block.matmuls, norm,
                          full.duplicated - block.duplicated)  # the router, whole
    raise UserError("model.hybrid_layer_pattern", f"unknown layer kind {kind!r}",
                    "use Megatron's symbols")


def _indexer_params(a: Architecture) -> int:
    """DSA's lightning indexer: queries from the query latent, one shared key head
    (with its LayerNorm), per-head weights."""
    n, d = a.dsa_indexer_n_heads, a.dsa_indexer_head_dim
    return (a.q_lora_rank or a.hidden_size) * n * d + a.hidden_size * d + 2 * d \
        + a.hidden_size * n


# ------------------------------------------------------------------ ops


def mamba_ops(a: Architecture) -> list[Op]:
    """in_proj, conv + SiLU, dt, the SSD scan, state passing, gated norm, out_proj."""
    m, t, tok, w = mamba_shape(a), a.tp, _tokens(a), DTYPE_BYTES[a.dtype]
    q, n = MAMBA_CHUNK, m.state
    # SSD per token: C B^T in each chunk (per group), its masked product with x (per
    # head), the chunk state B^T x, and the output from the passed state C h.
    scan = 2 * tok * (q * n * m.groups + q * m.inner + 2 * n * m.inner) / t
    return [_mm("mamba.in_proj", tok, m.in_proj / t, a.hidden_size),
            Op("mamba.conv1d", nbytes=4 * tok * m.conv * w / t),  # conv, then SiLU
            Op("mamba.dt", nbytes=tok * m.heads * (w + 12) / t),  # softplus, exp(A dt), cumsum
            Op("mamba.ssd_scan", flops=scan, attention=True),
            Op("mamba.state_passing", nbytes=2 * tok / q * m.inner * n * 4 / t),
            Op("mamba.gated_norm", nbytes=4 * tok * m.inner * w / t),  # y + D x, z, out
            _mm("mamba.out_proj", tok, a.hidden_size, m.inner / t)]


def delta_ops(a: Architecture) -> list[Op]:
    """in_proj, conv + SiLU, gates and l2 norms, the chunked delta rule, gated norm,
    out_proj."""
    d, t, tok, w = delta_shape(a), a.tp, _tokens(a), DTYPE_BYTES[a.dtype]
    c, dk, dv = GDN_CHUNK, a.linear_key_head_dim, a.linear_value_head_dim
    # Per token and value head: K K^T, the triangular inverse, W = A K and U = A V,
    # Q K^T and its product with U - W S, and W S, Q S, the state update K^T (U - W S).
    scan = 2 * tok * d.value_heads * (3 * c * dk + 2 * c * dv + c * c / 3 + 3 * dk * dv) / t
    return [_mm("gdn.in_proj", tok, d.in_proj / t, a.hidden_size),
            Op("gdn.conv1d", nbytes=4 * tok * d.conv * w / t),
            Op("gdn.gates", nbytes=tok * (4 * d.key * w + d.value_heads * 16) / t),
            Op("gdn.delta_rule", flops=scan, attention=True),
            Op("gdn.gated_norm", nbytes=3 * tok * d.value * w / t),
            _mm("gdn.out_proj", tok, a.hidden_size, d.value / t)]


def _sparse_keys(a: Architecture) -> float:
    """Keys a query attends to under DSA, averaged over positions (causal, at most top-k)."""
    s, k = a.seq_length, a.dsa_indexer_topk
    return sum(min(i + 1, k) for i in range(min(s, k))) / s + max(0, s - k) * k / s


def dsa_ops(a: Architecture) -> list[Op]:
    """MLA with the indexer's projections and scores, top-k, and a sparse core."""
    b, t, tok = _latent(a), a.tp, _tokens(a)
    n, d, s = a.dsa_indexer_n_heads, a.dsa_indexer_head_dim, a.seq_length
    sh = attention_shape(b)
    core = Op("attention", flops=2 * tok * _sparse_keys(a) * (sh.q + sh.out) / t,
              attention=True)
    ops = [core if op.name == "attention" else op for op in attention_ops(b)]
    return ops + [_mm("dsa.index_q", tok, n * d / t, a.q_lora_rank or a.hidden_size),
                  _mm("dsa.index_k", tok, d, a.hidden_size),
                  _mm("dsa.index_weights", tok, n / t, a.hidden_size),
                  Op("dsa.index_scores", flops=s * s * a.micro_batch_size * n * d / t,
                     attention=True),
                  Op("dsa.topk", nbytes=(s * s * a.micro_batch_size / 2
                                         + tok * a.dsa_indexer_topk) * 4 / t)]


def mixer_ops(a: Architecture, kind: str) -> list[Op]:
    """The forward ops of one hybrid layer, per tp rank: pre-norm, mixer, residual; its
    TE linears (a mixer's in_proj and out_proj among them) marked FP8 under
    --fp8-format."""
    h = a.hidden_size
    if kind == "mamba":
        body = mamba_ops(a)
    elif kind == "gdn":
        body = delta_ops(a)
    elif kind in ("attention", "mla"):
        body = attention_ops(attention_arch(a, kind))
    elif kind == "dsa":
        body = dsa_ops(a)
    elif kind == "mlp":
        body = _mlp_ops(a, "mlp", _tokens(a), a.ffn_hidden_size)
    else:
        body = mlp_ops(a, "moe")
    return fp8_ops(a, _stream_norm_ops(a, "norm", h) + body + [_residual(a, "residual")])


# ------------------------------------------------------------------ activation memory


def _mixer_bytes(a: Architecture, kind: str) -> float:
    """What a Mamba or GatedDeltaNet mixer keeps beyond the pre-norm and its output,
    before tp (whole widths)."""
    tok, w = _tokens(a), DTYPE_BYTES[a.dtype]
    # The gated norm's output is out_proj's input only: FP8 linears keep it quantized
    # (ppsim.costs.fp8).
    f = fp8_bytes(a) if a.fp8_copies else w
    if kind == "mamba":
        m = mamba_shape(a)
        # Megatron trains through mamba_ssm's mamba_split_conv1d_scan_combined (its
        # default memory-efficient path), which keeps in_proj's output (z x B C dt) and
        # the scan's output before the gate, and recomputes the conv, dt and the chunk
        # states in the backward; then its RMSNormGated keeps the gated output and one
        # fp32 rstd a group, and out_proj keeps the norm's output.
        return (tok * m.inner * f + tok * (m.in_proj + 2 * m.inner) * w
                + tok * m.groups * 4)
    d = delta_shape(a)
    c = GDN_CHUNK
    # in_proj output, conv output, l2-normed q and k, the chunk's A matrix, g and beta
    # (fp32), the chunk states (fp32), core and norm outputs
    return (tok * d.value * f
            + tok * (d.in_proj + d.conv + 2 * d.key + d.value) * w
            + tok * d.value_heads * (c + 3) * 4
            + tok / c * d.value_heads * a.linear_key_head_dim * a.linear_value_head_dim * 4)


def mixer_activation_bytes(a: Architecture, kind: str) -> int:
    """Bytes one microbatch's forward keeps for the backward, per tp rank: an attention,
    MLP or MoE layer its half of a decoder layer's (ppsim.costs.saved.HYBRID_HALVES),
    a Mamba or GatedDeltaNet layer all its tensors, or its input when recomputed whole."""
    if kind in HYBRID_HALVES:
        return layer_activation_bytes(a, kind)
    tok, h, w = _tokens(a), a.hidden_size, DTYPE_BYTES[a.dtype]
    if a.recompute == "full":
        return int(tok * h * a.residual_bytes / a.token_ranks)  # only the layer's input
    # The pre-norm's input, statistics and output (in_proj's input: quantized under FP8)
    # and dropout's mask are hidden-wide: split by tokens under sequence parallelism.
    normed = tok * h * (fp8_bytes(a) if a.fp8_copies else w)
    hidden = _norm_bytes(a, h) + normed + (tok * h if a.dropout else 0)
    return int(rank_bytes(a, hidden, _mixer_bytes(a, kind)))


