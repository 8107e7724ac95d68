"""The check harness: generated kernels run in TPU interpret mode on CPU
against the plain-JAX reference (models/reference.py)."""
