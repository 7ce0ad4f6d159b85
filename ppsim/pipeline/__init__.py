"""The pipeline problem: the split, Megatron's layout, placement, exports and messages."""
