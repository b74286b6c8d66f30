"""Benchmark drivers for real hardware (not tests). Run them from the repository root as modules,
`python -m benchmarks.<name> --help`; what they share is in benchmarks.common."""
