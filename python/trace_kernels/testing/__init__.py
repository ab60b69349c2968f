"""Helpers for tests and benchmarks: timing (bench) and the kernel sets the GPU tests use."""
