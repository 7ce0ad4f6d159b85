"""Plain-torch reference mixers: Mamba-2 (the chunked SSD scan) and GatedDeltaNet
(the chunked gated delta rule), shaped as ppsim.costs.mixers describes them.

Written for clarity, not speed: they run on a CPU at small sizes so `ppsim profile`
and `ppsim run` work on hybrid stacks without mamba_ssm or FLA kernels. Each scan is
computed chunk by chunk as the fused kernels do (within a chunk as matrices, the
state passed between chunks); `ssd_recurrent` and `delta_recurrent` are the
token-by-token definitions the tests hold the chunked forms to.

At tp > 1 (`shard`) each splits by heads as Megatron's mixers do: in_proj column-parallel
over each of its packed outputs, the conv's channels, the per-head parameters and the
gated norm's groups (Mamba-2), out_proj row-parallel; GatedDeltaNet's norm weight, one
head's width applied to every head, sums its gradient over the ranks.

The conv, the scan and the gated norm run under checkpoints (their inputs kept, their
insides recomputed in the backward), as mamba_ssm's and FLA's fused kernels keep their
inputs and recompute the rest: a layer keeps what ppsim.costs.mixers counts, less the
few tensors those kernels also keep (docs/model.md names them per kind).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from ppsim.costs.arch import Architecture
from ppsim.costs.mixers import (
    GDN_CHUNK,
    MAMBA_CHUNK,
    MAMBA_CONV,
    delta_shape,
    mamba_shape,
)
from ppsim.executor.builders.stage import checkpointed
from ppsim.executor.builders.tensor import (
    ParallelLinears,
    TensorGroup,
    mark_partial,
    shard_channels,
    shard_input,
    shard_segments,
    shard_vector,
)


class _Projections:
    """A mixer's in_proj and out_proj, whole or tensor-parallel."""

    in_proj: nn.Linear
    out_proj: nn.Linear
    columns: ParallelLinears | None = None
    rows: ParallelLinears | None = None

    def _split(self, g: TensorGroup) -> None:
        shard_input(self.out_proj, g)
        self.columns = ParallelLinears(g, (self.in_proj,))
        self.rows = ParallelLinears(g, (self.out_proj,), row=True)

    def _project_in(self, hidden: torch.Tensor) -> torch.Tensor:
        """in_proj of every token (sequence parallelism: gathered)."""
        return self.in_proj(hidden) if self.columns is None else self.columns(hidden)[0]

    def _project_out(self, y: torch.Tensor) -> torch.Tensor:
        return self.out_proj(y) if self.rows is None else self.rows(y)


def _pad(x: torch.Tensor, chunk: int, dim: int = 1) -> torch.Tensor:
    extra = -x.shape[dim] % chunk
    if not extra:
        return x
    pad = [0, 0] * (x.dim() - dim - 1) + [0, extra]
    return F.pad(x, pad)


def _segsum(a: torch.Tensor) -> torch.Tensor:
    """out[..., i, j] = a[..., j+1] + ... + a[..., i] for j <= i, -inf above."""
    c = torch.cumsum(a, dim=-1)
    out = c[..., :, None] - c[..., None, :]
    q = a.shape[-1]
    keep = torch.tril(torch.ones(q, q, dtype=torch.bool, device=a.device))
    return out.masked_fill(~keep, float("-inf"))


def ssd_chunked(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                c: torch.Tensor, chunk: int = MAMBA_CHUNK) -> torch.Tensor:
    """Mamba-2's scan y_t = C_t h_t, h_t = exp(dt_t a) h_{t-1} + dt_t x_t B_t^T, by chunks.

    x (batch, seq, heads, head_dim), dt (batch, seq, heads) after softplus, a (heads,)
    negative, b and c (batch, seq, groups, state), heads a multiple of groups."""
    bsz, seq, heads, _ = x.shape
    rep = heads // b.shape[2]
    b, c = b.repeat_interleave(rep, dim=2), c.repeat_interleave(rep, dim=2)
    x, dt, b, c = (_pad(t, chunk) for t in (x * dt[..., None], dt, b, c))
    n = x.shape[1] // chunk
    x, b, c = (t.reshape(bsz, n, chunk, heads, -1) for t in (x, b, c))
    da = (dt * a).reshape(bsz, n, chunk, heads).permute(0, 3, 1, 2)  # (b, h, n, q)
    cum = torch.cumsum(da, dim=-1)
    # Within each chunk: the decayed C_i . B_j for j <= i applied to x_j.
    decay = torch.exp(_segsum(da))
    y = torch.einsum("bnihs,bnjhs,bhnij,bnjhp->bnihp", c, b, decay, x)
    # Each chunk's end state, then passed along the chunks (the only sequential part).
    to_end = torch.exp(cum[..., -1:] - cum)
    states = torch.einsum("bnjhs,bhnj,bnjhp->bnhps", b, to_end, x)
    state = torch.zeros_like(states[:, 0])
    before = []
    for k in range(n):
        before.append(state)
        state = state * torch.exp(cum[:, :, k, -1])[..., None, None] + states[:, k]
    prev = torch.stack(before, dim=1)  # (b, n, h, p, s): the state entering each chunk
    y = y + torch.einsum("bnihs,bnhps,bhni->bnihp", c, prev, torch.exp(cum))
    return y.reshape(bsz, n * chunk, heads, -1)[:, :seq]


def ssd_recurrent(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                  c: torch.Tensor) -> torch.Tensor:
    """The same scan token by token (the definition)."""
    rep = x.shape[2] // b.shape[2]
    b, c = b.repeat_interleave(rep, dim=2), c.repeat_interleave(rep, dim=2)
    h = x.new_zeros(x.shape[0], x.shape[2], x.shape[3], b.shape[3])
    out = []
    for t in range(x.shape[1]):
        h = h * torch.exp(dt[:, t] * a)[..., None, None] + torch.einsum(
            "bh,bhp,bhs->bhps", dt[:, t], x[:, t], b[:, t])
        out.append(torch.einsum("bhps,bhs->bhp", h, c[:, t]))
    return torch.stack(out, dim=1)


def delta_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, chunk: int = GDN_CHUNK) -> torch.Tensor:
    """The gated delta rule S_t = e^{g_t} S_{t-1} + beta_t k_t (v_t - e^{g_t} S_{t-1}^T k_t)^T,
    o_t = S_t^T q_t, by chunks: within a chunk the updates solve one unit lower-triangular
    system (the WY form), the state passes between chunks.

    q, k (batch, seq, heads, dk) l2-normalised, v (batch, seq, heads, dv), g (log
    decay) and beta (batch, seq, heads)."""
    bsz, seq, heads, dk = q.shape
    q, k, v, g, beta = (_pad(t, chunk) for t in (q * dk ** -0.5, k, v, g, beta))
    n = q.shape[1] // chunk
    q, k, v = (t.reshape(bsz, n, chunk, heads, -1).transpose(2, 3) for t in (q, k, v))
    g, beta = (t.reshape(bsz, n, chunk, heads).transpose(2, 3) for t in (g, beta))
    cum = torch.cumsum(g, dim=-1)  # (b, n, h, c)
    rel = torch.exp(_segsum(g))  # e^{G_i - G_j}, j <= i
    strict = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device), -1)
    a = (beta[..., None] * rel * (k @ k.transpose(-1, -2))).masked_fill(~strict, 0.0)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    # In fp32, as FLA solves it (torch has no bf16 triangular solve on CPU either).
    t_inv = torch.linalg.solve_triangular((eye + a).float(), eye.expand_as(a).float(),
                                          upper=False, unitriangular=True).to(q.dtype)
    w = t_inv @ (beta[..., None] * torch.exp(cum)[..., None] * k)  # U = U0 - W S0
    u0 = t_inv @ (beta[..., None] * v)
    attn = (q @ k.transpose(-1, -2)) * rel  # j <= i, decayed
    state = q.new_zeros(bsz, heads, dk, v.shape[-1])
    out = []
    for i in range(n):
        u = u0[:, i] - w[:, i] @ state
        out.append(torch.exp(cum[:, i])[..., None] * (q[:, i] @ state) + attn[:, i] @ u)
        to_end = torch.exp(cum[:, i, :, -1:] - cum[:, i])[..., None]
        state = (torch.exp(cum[:, i, :, -1])[..., None, None] * state
                 + (to_end * k[:, i]).transpose(-1, -2) @ u)
    o = torch.stack(out, dim=1).transpose(2, 3).reshape(bsz, n * chunk, heads, -1)
    return o[:, :seq]


def delta_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                    beta: torch.Tensor) -> torch.Tensor:
    """The same rule token by token (the definition)."""
    q = q * q.shape[-1] ** -0.5
    s = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    out = []
    for t in range(q.shape[1]):
        s = s * torch.exp(g[:, t])[..., None, None]
        err = v[:, t] - torch.einsum("bhkv,bhk->bhv", s, k[:, t])
        s = s + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t, :, None] * err)
        out.append(torch.einsum("bhkv,bhk->bhv", s, q[:, t]))
    return torch.stack(out, dim=1)


def _conv(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """Causal depthwise conv over the sequence, then SiLU: (b, s, ch) -> (b, s, ch)."""
    return F.silu(conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2))


def _group_rmsnorm(y: torch.Tensor, weight: torch.Tensor, groups: int) -> torch.Tensor:
    """RMSNorm over `groups` equal slices of the last dim."""
    shape = y.shape
    yg = y.reshape(*shape[:-1], groups, -1)
    yg = yg * torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + 1e-5)
    return yg.reshape(shape) * weight


def _gate(y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return y * F.silu(z)


def _gated_rmsnorm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """GatedDeltaNet's norm: RMSNorm, then gated by SiLU(z)."""
    return _group_rmsnorm(y, weight, 1) * F.silu(z)


class Mamba2(_Projections, nn.Module):
    """Megatron's MambaMixer in plain torch: in_proj to z, x, B, C, dt; conv; SSD; gated
    norm; out_proj."""

    def __init__(self, a: Architecture) -> None:
        super().__init__()
        m = self.shape = mamba_shape(a)
        self.in_proj = nn.Linear(a.hidden_size, m.in_proj, bias=False)
        self.conv1d = nn.Conv1d(m.conv, m.conv, MAMBA_CONV, groups=m.conv,
                                padding=MAMBA_CONV - 1)
        self.dt_bias = nn.Parameter(torch.zeros(m.heads))
        self.A_log = nn.Parameter(torch.zeros(m.heads))
        self.D = nn.Parameter(torch.ones(m.heads))
        self.norm_weight = nn.Parameter(torch.ones(m.inner))
        self.out_proj = nn.Linear(m.inner, a.hidden_size, bias=False)

    def shard(self, g: TensorGroup) -> None:
        """Keep this tensor rank's heads and groups."""
        m, n = self.shape, g.size
        bc = m.groups * m.state
        shard_segments(self.in_proj, g, (m.inner, m.inner, bc, bc, m.heads))
        shard_channels(self.conv1d, g, (m.inner, bc, bc))
        self.dt_bias, self.A_log, self.D, self.norm_weight = (
            shard_vector(p, g) for p in (self.dt_bias, self.A_log, self.D, self.norm_weight))
        self.shape = replace(m, heads=m.heads // n, groups=m.groups // n, inner=m.inner // n,
                             conv=m.conv // n, in_proj=m.in_proj // n)
        self._split(g)

    def _scan(self, xbc: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        """Conv, dt's softplus, the SSD scan and the D skip: the output before the gate."""
        m = self.shape
        bsz, seq, _ = xbc.shape
        x, b, c = _conv(xbc, self.conv1d).split(
            [m.inner, m.groups * m.state, m.groups * m.state], dim=-1)
        x = x.reshape(bsz, seq, m.heads, m.head_dim)
        dt = F.softplus(dt + self.dt_bias)
        y = ssd_chunked(x, dt, -torch.exp(self.A_log.float()).to(x.dtype),
                        b.reshape(bsz, seq, m.groups, m.state),
                        c.reshape(bsz, seq, m.groups, m.state), min(MAMBA_CHUNK, seq))
        return (y + x * self.D[:, None]).reshape(bsz, seq, m.inner)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        m, proj = self.shape, self._project_in(hidden)
        z, xbc, dt = proj.split([m.inner, m.conv, m.heads], dim=-1)
        # As Megatron's training path: mamba_ssm's split-conv-scan kernel keeps in_proj's
        # output and the scan's output and gates it by SiLU(z); RMSNormGated keeps its
        # input; out_proj the norm's output.
        y = checkpointed(_gate, checkpointed(self._scan, xbc, dt), z)
        return self._project_out(checkpointed(_group_rmsnorm, y, self.norm_weight, m.groups))


class GatedDeltaNet(_Projections, nn.Module):
    """Megatron's GatedDeltaNet in plain torch: in_proj to q, k, v, z, beta, alpha; conv;
    the chunked delta rule; gated norm per head; out_proj."""

    def __init__(self, a: Architecture) -> None:
        super().__init__()
        d = self.shape = delta_shape(a)
        self.arch = a
        self.in_proj = nn.Linear(a.hidden_size, d.in_proj, bias=False)
        kernel = a.linear_conv_kernel_dim
        self.conv1d = nn.Conv1d(d.conv, d.conv, kernel, groups=d.conv, padding=kernel - 1,
                                bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(d.value_heads))
        self.A_log = nn.Parameter(torch.zeros(d.value_heads))
        self.norm_weight = nn.Parameter(torch.ones(a.linear_value_head_dim))
        self.out_proj = nn.Linear(d.value, a.hidden_size, bias=False)
        self.key_heads = a.linear_num_key_heads

    def shard(self, g: TensorGroup) -> None:
        """Keep this tensor rank's key and value heads."""
        d, n = self.shape, g.size
        hv = d.value_heads
        shard_segments(self.in_proj, g, (d.key, d.key, d.value, d.value, hv, hv))
        shard_channels(self.conv1d, g, (d.key, d.key, d.value))
        self.dt_bias, self.A_log = (shard_vector(p, g) for p in (self.dt_bias, self.A_log))
        mark_partial(self.norm_weight)  # one head's width, applied to this rank's heads
        self.key_heads //= n
        self.shape = replace(d, key=d.key // n, value=d.value // n, value_heads=hv // n,
                             conv=d.conv // n, in_proj=d.in_proj // n)
        self._split(g)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        d, proj = self.shape, self._project_in(hidden)
        bsz, seq, _ = proj.shape
        hk, hv = self.key_heads, d.value_heads
        qkv, z, beta, alpha = proj.split([d.conv, d.value, hv, hv], dim=-1)
        q, k, v = checkpointed(_conv, qkv, self.conv1d).split([d.key, d.key, d.value], dim=-1)
        q, k = (F.normalize(t.reshape(bsz, seq, hk, -1), dim=-1).repeat_interleave(
            hv // hk, dim=2) for t in (q, k))
        g = -torch.exp(self.A_log) * F.softplus(alpha + self.dt_bias)
        o = checkpointed(delta_chunked, q, k, v.reshape(bsz, seq, hv, -1), g,
                         torch.sigmoid(beta), min(GDN_CHUNK, seq))
        z = z.reshape(bsz, seq, hv, -1)
        return self._project_out(checkpointed(_gated_rmsnorm, o, z, self.norm_weight)
                                 .reshape(bsz, seq, d.value))
