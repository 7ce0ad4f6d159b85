"""The executor: run a planned split for real and record what happened.

`ppsim run` (executor.cli) validates the config, then launches torchrun with
`-m executor.worker`; each rank builds its chunks of the model a builder
describes (executor.builders: the GPT by default, or `--model module:function`),
runs its action list from ppsim.schedules (executor.runtime), reduces gradients
across data-parallel replicas, records ops, transfers and memory
(executor.recorder), and rank 0 merges the parts into one Chrome trace and a
summary (executor.summary). `--engine torch` runs the same split with
torch.distributed.pipelining instead (executor.peer).
torch is imported only by the worker-side modules, never by executor.cli.
"""
