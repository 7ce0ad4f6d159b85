"""Timing engines over the action lists: the event simulator (private and shared
resources), the fast evaluator, and the one summary they report."""
