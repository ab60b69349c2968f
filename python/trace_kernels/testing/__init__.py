"""Helpers for tests and benchmarks: timing (bench), provenance (commit, date) and the kernel sets the GPU tests use."""
