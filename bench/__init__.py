"""Benchmarks of the planner and the Pallas TPU backend (``make bench``)."""
