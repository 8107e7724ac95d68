"""Code generation: a plan -> one readable Pallas module (emit.py renders
the jinja2 template with one emitter per op kind; load.py writes, checks and
imports it)."""
