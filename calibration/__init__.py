"""Micro-benchmarks and fits that turn measurements (or run traces) into a HardwareProfile."""
