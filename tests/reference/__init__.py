"""Tests of the Python reference (reference/activekv_reference): the same
behaviour the native engine's C++ tests (engine/tests) check in the core."""
