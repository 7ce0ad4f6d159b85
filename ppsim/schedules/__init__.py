"""Schedules as per-rank action lists: the spine every other part reads."""
