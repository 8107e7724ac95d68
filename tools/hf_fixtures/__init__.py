"""Hugging Face parity fixtures (tests/fixtures/hf): ``spec`` says what each is,
``build`` writes it with transformers, ``verify`` reloads and re-checks it.
The command is tools/make_hf_fixtures.py (``make hf-fixtures``)."""
