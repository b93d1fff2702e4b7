"""Measurement: timing views, the environment record, the one results writer and reader, external tools."""
