"""Memory policies: per-stage recompute and activation offload, in Megatron's knobs."""
