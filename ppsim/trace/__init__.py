"""Traces: the Chrome JSON schema, diff of two traces, and calibration from one."""
