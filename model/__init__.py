"""Analytical step-time and memory model: closed forms and a unit-level pipeline recurrence."""

from slidedp.model.memory import MemoryEstimate, estimate_memory, memory_shortfalls
from slidedp.model.step_model import StepEstimate, estimate_step, lower_bound

__all__ = ["MemoryEstimate", "StepEstimate", "estimate_memory", "estimate_step", "lower_bound", "memory_shortfalls"]
