"""The executor: run a planned split for real and record what happened.

`ppsim run` (ppsim.cli.run) validates the config, writes the run spec
(ppsim.executor.runspec) and launches torchrun (forked, ppsim.executor.forked), which
forks each rank to run the worker script (ppsim.executor.worker) on the spec; a
printed launch starts `python -P -m ppsim.executor.worker --spec PATH` instead.
Each rank builds its chunks of the
model a builder describes (ppsim.executor.builders: the GPT by default, or
`--model module:function`),
runs its action list from ppsim.schedules (ppsim.executor.runtime), reduces gradients
across data-parallel replicas, records ops, transfers and memory
(ppsim.executor.recorder), and rank 0 merges the parts into one Chrome trace and a
summary (ppsim.executor.summary). `--engine torch` runs the same split with
torch.distributed.pipelining instead (ppsim.executor.peer).
torch is imported only by the worker-side modules, never by ppsim.cli.run; nothing
here imports the command layer (ppsim.cli).
"""
