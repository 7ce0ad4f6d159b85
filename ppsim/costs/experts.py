"""What a model's MoE fields imply for its routed experts: the ranks each expert's
matmuls split over, the experts' data-parallel size, the token copies they compute,
the shared experts' width. Architecture takes these properties as a base class; they
read its fields."""

from __future__ import annotations


def expert_data_parallel(tp: int, cp: int, dp: int, etp: int, ep: int) -> int:
    """The experts' data-parallel size, tp x cp x dp / (etp x ep) (Megatron's
    expert_data_parallel_size), at least 1 (a preset's ep may exceed one replica's ranks:
    it then views the experts of a wider world)."""
    return max(1, tp * cp * dp // (etp * ep))


def torchtitan_expert_tp(tp: int, ep: int) -> int:
    """Ranks torchtitan splits each routed expert over (it has no etp field): without
    expert parallelism tp, the TP mesh's grouped-GEMM plan (moe_sharding.py's dense
    family: w1/w3 colwise, w2 rowwise, every tp rank computing the block's gathered
    tokens); with it none, each expert whole on one ep rank (the sparse family: Shard(0)
    over ep, ep borrowed from dp_shard x cp x tp)."""
    return tp if ep == 1 else 1


def expert_bias_refusal(linear_bias: bool, num_experts: int, etp: int) -> str | None:
    """Megatron's words where it refuses biased routed experts split over `etp` ranks
    (TransformerConfig.__post_init__), else None."""
    if linear_bias and num_experts and etp > 1:
        return "Bias in Moe is only supported when ETP==1"
    return None


class ExpertShape:
    """Architecture's derived MoE quantities (ppsim.costs.arch.Architecture's fields)."""

    @property
    def expert_load(self) -> float:
        """Token-expert pairs the routed experts compute and exchange over the even
        share: ppsim routes evenly, so a capacity drops nothing at or above 1, and
        padding fills every expert to it, at most every token (num_experts / top_k
        shares: Megatron's apply_router_token_dropping keeps all past that)."""
        f = self.moe_capacity_factor
        if f <= 0 or not self.moe_pad_to_capacity:
            return min(f, 1.0) if f > 0 else 1.0
        return min(f, self.num_experts / max(self.top_k, 1))

    @property
    def expert_tp(self) -> int:
        """Ranks each routed expert's matmuls are split over: etp, or when unset tp
        (Megatron's default), or under torchtitan's FSDP its own rule
        (torchtitan_expert_tp)."""
        if self.etp:
            return self.etp
        return torchtitan_expert_tp(self.tp, self.ep) if self.torchtitan_fsdp else self.tp

    @property
    def routes_gathered_tokens(self) -> bool:
        """torchtitan's MoE without expert parallelism at tp > 1: the block's input is
        gathered to every tensor rank (Shard(1) -> Replicate), which routes and permutes
        all of it, and the experts' partial sums are reduce-scattered back (Partial ->
        Shard(1)): a dense MLP's collectives, no dispatcher's (moe_sharding.py)."""
        return self.torchtitan_fsdp and self.expert_tp > 1

    @property
    def expert_copies(self) -> float:
        """Token copies one rank's routed experts take a microbatch: the s x b x top_k
        pairs its tp group routes (dropped or padded to capacity), etp / tp of them (the
        rank's own share gathered over the expert tp group)."""
        pairs = self.seq_length * self.micro_batch_size * self.top_k * self.expert_load
        return pairs * (self.expert_tp / self.tp)

    @property
    def expert_dp(self) -> int:
        """The experts' data-parallel size (expert_data_parallel)."""
        return expert_data_parallel(self.tp, self.cp, self.dp, self.expert_tp, self.ep)

    @property
    def probs_in_activation(self) -> bool:
        """Megatron weighs each routed expert's activation by the pair's routing
        probability (TEGroupedMLP's bias_act_func; the combine then only sums), so no
        expert output is kept for it; torchtitan's MoE scales the experts' input or output
        by the scores, which keeps a hidden-wide tensor a pair."""
        return not self.torchtitan_fsdp

    @property
    def shared_width(self) -> int:
        """The shared experts' MLP width, as either field gives it (0: none)."""
        return (self.shared_expert_ffn_hidden_size
                or self.shared_experts * self.moe_ffn_hidden_size)
