"""Geometry records: per op kind with a kernel library, the jax-free record of
one node's shapes on one core, the VMEM buffers and semaphores the library
declares for it, and the bytes of values it holds at its peak. The planner
(plan_buffers and the kind modules) reads them; the kernel libraries under
backends/pallas_tpu/kernels/ import them (arrows point down: compiler never
imports a kernel library)."""
