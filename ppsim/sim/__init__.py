"""Timing engines over the action lists: the event simulator, its simpy twin, the fast evaluator."""
