"""The `ppsim` commands: one module per command, shared flags in `main`."""
