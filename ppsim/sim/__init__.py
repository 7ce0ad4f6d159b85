"""Timing engines over the action lists: the event simulator and the fast evaluator."""
