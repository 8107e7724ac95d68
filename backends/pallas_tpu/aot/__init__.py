"""Ahead-of-time compile for a real TPU topology with libtpu, and what it measures:
the compiled VMEM, libtpu's static schedule (profiles), the calibration micro-kernels."""
