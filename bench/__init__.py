"""Benchmarks that print figures (never asserted by tests)."""
