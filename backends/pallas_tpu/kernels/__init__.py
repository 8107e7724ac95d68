"""The kernel libraries the generated module imports: everything that runs
inside the pallas_call, and the write-back / commit that follow it in the
same jit."""
