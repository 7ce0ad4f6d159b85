"""Timing engines over the action lists: the event simulator (private and shared
resources), its simpy twin, the fast evaluator, and the one summary they report."""
