"""The planner: exact search for the fastest split that fits, bounds and baselines."""
