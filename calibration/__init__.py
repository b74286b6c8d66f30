"""Micro-benchmarks and fits that produce HardwareProfiles. Not built yet: see the calibration issue."""
