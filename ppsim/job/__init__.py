"""The whole job around one pipeline replica: topology, rank groups, collectives, the
job's shape (GPUs, global batch), Megatron's FLOP count and throughput."""
