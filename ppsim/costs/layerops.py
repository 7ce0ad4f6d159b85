"""A decoder layer, the head and the embedding as ops (for time) and as the tensors
autograd keeps (for activation memory), per tensor-parallel rank; a decoder layer's
kept tensors, by Megatron module, are in ppsim.costs.modules.

Activations are counted tensor by tensor as PyTorch's autograd saves them with
FlashAttention (scaled_dot_product_attention, causal; with or without recompute,
no s x s scores are ever stored), Q, K
and V at their own widths, the output and a fp32 log-sum-exp per head and
token. Norms keep their input and fp32 statistics (mean and rstd for
LayerNorm, rstd for RMSNorm), matmuls their input, an eager SwiGLU its two
projections, the SiLU output and the product, dropout a 1-byte mask. At tp > 1 the
tensors inside a tensor-parallel block are split by width; the hidden-wide ones between
the blocks (norms, residuals, dropout, a block's input) by tokens under sequence
parallelism, and whole on every tensor rank without it (Architecture.token_ranks).
Each piece counts its own input (the previous piece's output), so summing pieces counts
a boundary once.
"""

from __future__ import annotations

from ppsim.costs.arch import DTYPE_BYTES, Architecture
from ppsim.costs.attention_shape import attention_shape
from ppsim.costs.fp8 import fp8_ops, mtp_precision
from ppsim.costs.kv_split import held_attention_shape
from ppsim.costs.ops import Op
from ppsim.costs.state import landed


def padded_vocab(a: Architecture) -> int:
    """Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by
    (128 by default) x tp, unless --padded-vocab-size gave it as it is."""
    if not a.pad_vocab:
        return a.vocab_size
    m = a.vocab_divisor * a.tp
    return -(-a.vocab_size // m) * m


def vocab_split_problem(vocab_size: int, pad_vocab: bool, tp: int) -> str | None:
    """Megatron's VocabParallelEmbedding and output layer give each tensor-parallel rank
    vocab_size / tp rows (`divide`, megatron/core/utils.py): a vocabulary taken as it is
    must divide by tp. What Megatron's assertion says, or None."""
    if pad_vocab or vocab_size % tp == 0:
        return None
    return f"{vocab_size} is not divisible by {tp}"


def sequence_split_problem(seq_length: int, cp: int, tp: int,
                           sequence_parallel: bool) -> str | None:
    """Under sequence parallelism Megatron scatters a context-parallel rank's seq_length /
    cp tokens over the tp ranks (`_split_along_first_dim`, megatron/core/tensor_parallel/
    mappings.py), which asserts they divide. What is wrong, or None."""
    if not sequence_parallel or tp == 1 or (seq_length // cp) % tp == 0:
        return None
    return (f"seq_length / cp = {seq_length // cp:,} tokens do not divide over tp = {tp} "
            "(First dimension of the tensor should be divisible by tensor parallel size)")


def splittable_seq_length(seq_length: int, cp: int, tp: int) -> int:
    """The first sequence from `seq_length` on that Megatron's causal context parallelism
    (2 x cp chunks, arguments.py) and its sequence-parallel scatter both split."""
    return next(s for s in range(seq_length, seq_length + 2 * cp * tp + 1)
                if not s % (2 * cp) and sequence_split_problem(s, cp, tp, True) is None)


def _tokens(a: Architecture) -> int:
    return a.seq_length * a.micro_batch_size


def rank_bytes(a: Architecture, hidden: float, split: float) -> float:
    """One tensor rank's share of `hidden` whole bytes of hidden-wide tensors
    (Architecture.token_ranks) and `split` whole bytes split by width over tp."""
    return (hidden * (a.tp // a.token_ranks) + split) / a.tp


def _norm_ops(a: Architecture, name: str, width: int, split: int = 0) -> list[Op]:
    """A norm of `width` a token inside a sublayer, over `split` ranks (default: a
    latent's, Architecture.token_ranks): read, write."""
    w = DTYPE_BYTES[a.dtype]
    return [Op(name, nbytes=2 * _tokens(a) * width * w / (split or a.token_ranks))]


def _stream_norm_ops(a: Architecture, name: str, width: int) -> list[Op]:
    """A norm of the residual stream: reads it (Architecture.residual_bytes), writes its
    output in the training dtype."""
    moved = _tokens(a) * width * (a.residual_bytes + DTYPE_BYTES[a.dtype])
    return [Op(name, nbytes=moved / a.token_ranks)]


def _residual(a: Architecture, name: str) -> Op:
    """dropout(x) + residual: read the sublayer's output and the residual stream, write
    the stream (and a mask when dropout is on)."""
    th = _tokens(a) * a.hidden_size / a.token_ranks
    moved = DTYPE_BYTES[a.dtype] + 2 * a.residual_bytes + (1 if a.dropout else 0)
    return Op(name, nbytes=th * moved)


def _mm(name: str, m: int, n: float, k: float, count: float = 1, weights: bool = True) -> Op:
    n, k = max(1, int(n)), max(1, int(k))
    return Op(name, flops=2.0 * m * n * k * count, shape=(m, n, k),
              params=int(n * k * count) if weights else 0)


def window_share(s: int, window: int) -> float:
    """The share of the causal core's work a window keeps: each query attends to itself
    and at most `window` keys before it, against the s(s+1)/2 query-key pairs of full
    causal attention; 1 without a window."""
    keys = window + 1
    if not window or keys >= s:
        return 1.0
    return (keys * (keys + 1) / 2 + (s - keys) * keys) / (s * (s + 1) / 2)


def attention_ops(a: Architecture, window: int = 0) -> list[Op]:
    """QKV projections (MLA: through the latents; the output gate's too), the query and
    key norms, rotary, the core (over a sliding `window` when one is given), the output
    gate, the output projection."""
    t, h, tok, w = a.tp, a.hidden_size, _tokens(a), DTYPE_BYTES[a.dtype]
    sh = attention_shape(a)
    if a.attention == "mla":
        hd = a.head_dim or h // a.num_heads
        kv_up = a.num_heads * (hd + (a.v_head_dim or hd))
        normed = a.qk_layernorm  # the latents' norms (Megatron builds them with the flag)
        d = a.token_ranks  # the down projections are whole on each rank, over its tokens
        ops = ([_mm("q_down", tok, a.q_lora_rank / d, h),
                *(_norm_ops(a, "q_norm", a.q_lora_rank) if normed else []),
                _mm("q_up", tok, sh.q / t, a.q_lora_rank)] if a.q_lora_rank
               else [_mm("q_proj", tok, sh.q / t, h)])
        ops += [_mm("kv_down", tok, (a.kv_lora_rank + a.qk_rope_head_dim) / d, h),
                *(_norm_ops(a, "kv_norm", a.kv_lora_rank) if normed else []),
                _mm("kv_up", tok, kv_up / t, a.kv_lora_rank)]
    else:  # the projection splits its whole output; the ranks hold kv_copies of K and V
        ops = [_mm("qkv", tok, (sh.q + sh.k + sh.v + sh.gate) / t, h)]
        sh = held_attention_shape(a)
        ops += _norm_ops(a, "qk_norm", sh.q + sh.k, a.tp) if a.qk_layernorm else []
    if a.rotary:
        ops.append(Op("rotary", nbytes=2 * tok * (sh.q + sh.k) * w / t))
    if a.unfused_attention:
        ops += unfused_core_ops(a)
    else:
        # FlashAttention, causal: QK^T and AV over the unmasked half of the s x s scores.
        core = a.seq_length * a.seq_length * a.micro_batch_size * (sh.q + sh.out) / t \
            * window_share(a.seq_length, window)
        ops.append(Op("attention", flops=core, attention=True))
    if sh.gate:
        # One fused kernel (Megatron's compiled _apply_output_gate): reads the output and
        # the gate, writes the product; its backward reads those and the product's
        # gradient, writes both inputs' gradients.
        ops.append(Op("output_gate", nbytes=tok * (2 * sh.out + sh.gate) * w / t,
                      backward_bytes=tok * (3 * sh.out + 2 * sh.gate) * w / t))
    ops.append(_mm("out_proj", tok, h, sh.out / t))
    return ops


def scores_elements(a: Architecture) -> float:
    """Elements of one microbatch's s x s attention scores on a tp rank, every head."""
    return a.micro_batch_size * a.num_heads / a.tp * a.seq_length ** 2


def unfused_core_ops(a: Architecture) -> list[Op]:
    """Megatron's DotProductAttention (megatron/core/transformer/dot_product_attention.py),
    as Transformer Engine's unfused path computes it too: K and V repeated to every query
    head (grouped-query attention), the whole s x s scores by one batched matmul (a
    causal mask or a window removes no work), FusedScaleMaskSoftmax (read the scores,
    write the probabilities; its backward reads them and their gradient, writes one),
    dropout on the probabilities (a mask byte each), the probabilities times V. Each
    batched matmul's backward computes both its operands' gradients."""
    sh, s, w = held_attention_shape(a), a.seq_length, DTYPE_BYTES[a.dtype]
    tok, heads = _tokens(a), a.micro_batch_size * a.num_heads / a.tp
    qk, v = sh.q // a.num_heads, sh.out // a.num_heads
    scores = scores_elements(a)
    ops = []
    if sh.k < sh.q:  # repeat_interleave: read K and V, write them at every query head
        moved = tok * (sh.k + sh.v + (qk + v) * a.num_heads) * w / a.tp
        ops.append(Op("attention.repeat_kv", nbytes=moved, backward_bytes=moved))
    ops.append(Op("attention.scores", flops=2.0 * s * s * qk * heads, shape=(s, s, qk),
                  both_grads=True))
    ops.append(Op("attention.softmax", nbytes=2 * scores * w, backward_bytes=3 * scores * w))
    if a.dropout:  # read, write and a mask byte; the backward alike
        ops.append(Op("attention.dropout", nbytes=scores * (2 * w + 1),
                      backward_bytes=scores * (2 * w + 1)))
    ops.append(Op("attention.context", flops=2.0 * s * v * s * heads, shape=(s, v, s),
                  both_grads=True))
    return ops


def _mlp_ops(a: Architecture, name: str, tokens: int, ffn: int, count: float = 1,
             width: int = 0, split: int = 0) -> list[Op]:
    """fc1 (fc1 and fc3 when gated), the activation function, fc2, from and to `width`
    (default: the hidden size), the `ffn` units split over `split` ranks (default tp)."""
    t, h, w = split or a.tp, width or a.hidden_size, DTYPE_BYTES[a.dtype]
    up = 2 * ffn if a.gated_mlp else ffn
    elems = tokens * ffn * count / t
    # Eager SwiGLU: silu (read, write), then the product (read two, write one). Megatron's
    # fused one makes three of those five passes; priced as eager either way (a few tenths
    # of a percent of a layer), so the memory rule alone tells the two apart.
    act = Op(f"{name}.act", nbytes=elems * w * (5 if a.gated_mlp else 2))
    return [_mm(f"{name}.fc1", tokens, up / t, h, count), act,
            _mm(f"{name}.fc2", tokens, h, ffn / t, count)]


def mlp_ops(a: Architecture, kind: str) -> list[Op]:
    if kind == "dense":
        return _mlp_ops(a, "mlp", _tokens(a), a.ffn_hidden_size)
    t, h, tok, w = a.tp, a.hidden_size, _tokens(a), DTYPE_BYTES[a.dtype]
    lat = a.moe_latent_size
    # token-expert pairs a tp group routes, on average (dropped or padded to capacity)
    pairs = tok * a.top_k * a.expert_load
    # A rank's experts take the copies its ep group sends them, gathered over the expert
    # tp group, at 1 / etp of the width.
    per_expert = max(1, int(a.expert_copies * a.ep // max(1, a.num_experts)))
    local = max(1, a.num_experts // a.ep)
    # the ranks the routing splits over: the tensor ranks, none where each routes the
    # gathered tokens (torchtitan's, without expert parallelism)
    r = 1 if a.routes_gathered_tokens else t
    ops = [_mm("router", tok, a.num_experts / r, h),
           Op("router.softmax_topk", nbytes=3 * tok * a.num_experts * 4 / r)]
    ops += [_mm("latent.fc1", tok, lat / t, h)] if lat else []
    ops.append(Op("dispatch", nbytes=(tok + pairs) * (lat or h) * w / r))
    ops += _mlp_ops(a, "experts", per_expert, a.moe_ffn_hidden_size, local, lat,
                    split=a.expert_tp)
    ops.append(Op("combine", nbytes=(tok + pairs) * (lat or h) * w / r))
    if not a.moe_permute_fusion:
        # Megatron's torch unpermute (the probabilities already weighed the experts'
        # activation): a zeroed output, then scatter_add, whose backward is the gather
        # the fused one runs.
        ops.append(Op("combine.unfused", nbytes=tok * (lat or h) * w / t, backward_bytes=0.0))
    ops += [_mm("latent.fc2", tok, h / t, lat)] if lat else []
    if a.shared_width:
        ops += _mlp_ops(a, "shared", tok, a.shared_width)
    if a.shared_width and a.shared_expert_gate:
        # The gate's h -> 1 product reads the input; the output times its sigmoid reads
        # and writes the output; the backward reads the gradient, output and input, writes
        # both their gradients.
        ops.append(Op("shared.gate", nbytes=3 * tok * h * w / t,
                      backward_bytes=5 * tok * h * w / t))
    return ops


def layer_ops(a: Architecture, kind: str, window: int = 0) -> list[Op]:
    """The forward ops of one decoder layer of `kind` (attending over `window`), per tp
    rank; its TE linears marked FP8 under --fp8-format."""
    return fp8_ops(a, _stream_norm_ops(a, "norm1", a.hidden_size) + attention_ops(a, window)
                   + [_residual(a, "residual1")] + _stream_norm_ops(a, "norm2", a.hidden_size)
                   + mlp_ops(a, kind) + [_residual(a, "residual2")])


def head_ops(a: Architecture) -> list[Op]:
    """Final norm, the vocabulary projection, and the cross-entropy in fp32. Forward:
    the cast (read w, write 4), log-softmax (max, sum and output passes read the logits
    three times, write once). Backward: the loss gradient's fill, log-softmax's backward
    (reads the gradient twice and the output once, writes once), the cast back."""
    tok, w, v = _tokens(a), DTYPE_BYTES[a.dtype], padded_vocab(a) / a.tp
    logits = tok * v
    return landed(a, _stream_norm_ops(a, "final_norm", a.hidden_size)
                  + [_mm("output", tok, v, a.hidden_size),
                     Op("loss", nbytes=logits * (w + 4 + 4 * 4),
                        backward_bytes=logits * (6 * 4 + w))])


def mtp_ops(a: Architecture) -> list[Op]:
    """An MTP module's own ops: two norms and the 2h -> h projection (eh_proj, a TE
    linear: FP8 as mtp_precision says)."""
    h = a.hidden_size
    return landed(a, fp8_ops(mtp_precision(a), _stream_norm_ops(a, "mtp.norms", 2 * h)
                             + [_mm("mtp.proj", _tokens(a), h / a.tp, 2 * h)]))


# ------------------------------------------------------------------ activation memory


def _norm_bytes(a: Architecture, width: int) -> float:
    """A residual-stream norm's input and its fp32 statistics."""
    stats = 4 if a.rmsnorm else 8
    return _tokens(a) * (width * a.residual_bytes + stats)


CHUNK_LOGIT_BYTES = 14
"""Bytes a logit of one chunk takes at the height of torchtitan's chunked loss (its
ChunkedLossWrapper over CrossEntropyLoss, eager): the bf16 logits the loop holds (2), the
fp32 log-softmax output cross_entropy saves (4), and in the chunk's backward the fp32
gradient of that output (4) and of its input (4); the fp32 copy of the logits is freed
once the log-softmax has run."""


def head_activation_bytes(a: Architecture) -> int:
    """Final norm (input, stats), the projection's input and the fp32 log-probabilities
    the cross-entropy keeps. The logits in the training dtype are not kept: the fp32
    cast is what autograd saves (Megatron's vocab-parallel loss keeps its fp32 softmax
    the same way); they exist only for the moment of the cast. Under torchtitan's chunked
    loss (Architecture.loss_chunks) the backward through the head has run by then: the
    decoder's output and the gradient accumulated for it, both whole on every tensor rank
    (the chunks take the replicated output), wait for the decoder's backward."""
    tok, w = _tokens(a), DTYPE_BYTES[a.dtype]
    if a.loss_chunks:
        return int(rank_bytes(a, _norm_bytes(a, a.hidden_size), 0)
                   + 2 * tok * a.hidden_size * w)
    projected = tok * a.hidden_size * w  # the norm's output, the projection's input
    whole = projected if a.saves_gathered_inputs else 0  # gathered: whole on every rank
    hidden = _norm_bytes(a, a.hidden_size) + projected - whole
    return int(rank_bytes(a, hidden, tok * padded_vocab(a) * 4) + whole)


def head_transient_bytes(a: Architecture) -> int:
    """The logits' gradient in the training dtype, made inside the head's backward:
    Megatron's vocab-parallel loss writes its gradient into the fp32 softmax it kept, in
    place, and the backward of the cast to fp32 returns one new tensor of the logits'.
    Under torchtitan's chunked loss: one chunk's logits at their height
    (CHUNK_LOGIT_BYTES) beside the fp32 buffer the chunks' gradients accumulate in."""
    logits = _tokens(a) * padded_vocab(a) / a.tp
    if a.loss_chunks:
        return int(logits / a.loss_chunks * CHUNK_LOGIT_BYTES
                   + _tokens(a) * a.hidden_size * 4)
    return int(logits * DTYPE_BYTES[a.dtype])


def loss_chunks_problem(seq_length: int, cp: int, chunks: int) -> str | None:
    """ChunkedLossWrapper's check: a rank's tokens of a sequence split into equal chunks
    (a micro batch's then do too)."""
    if not chunks or (seq_length // cp) % chunks == 0:
        return None
    return (f"seq_length / cp = {seq_length // cp:,} tokens do not split into {chunks} "
            "equal loss chunks (ChunkedLossWrapper's check)")


def embedding_activation_bytes(a: Architecture) -> int:
    """Token ids (int64) and, with dropout, the embedding dropout's mask."""
    tok = _tokens(a)
    return int(8 * tok + (tok * a.hidden_size / a.token_ranks if a.dropout else 0))
