# Makefile fragment: independent-parity fixtures from Hugging Face transformers.
# Included from the top-level Makefile (`include tools/hf-fixtures.mk`); run from
# the repository root.  Uses its own venv (.venv-hf, git-ignored) with torch CPU
# and transformers, so the project venv never needs torch.
#
#   make hf-fixtures         regenerate tests/fixtures/hf/* (deterministic)
#   make hf-fixtures-verify  reload the committed fixtures and re-check logits
#   make hf-fixtures-crosscheck  recompute the wave-2 and Muse Spark fixtures with an
#                            independent NumPy derivation of tests/fixtures/hf/README.md's facts
#
# torch MUST stay 2.13.0: pip takes that one from a local CPU wheel; any other
# version would pull a multi-GB CUDA build from the index.  accelerate: transformers
# refuses to read the pre-quantized fixtures (mxfp4, fp8) without it; compressed-tensors
# reads the NVFP4 ones (qwen3_nvfp4, muse_spark_nvfp4).  transformers >= 5.25 for
# muse_spark; kernels is a requirement of 5.25 (pinned to the version pip chose).

HF_VENV       ?= .venv-hf
HF_PYTHON311  ?= $(shell command -v python3.11 2>/dev/null || echo /root/.pyenv/versions/3.11.7/bin/python3.11)
HF_PIP_PINS   ?= torch==2.13.0 transformers==5.25.0 safetensors==0.8.0 numpy==2.4.6 accelerate==1.16.0 compressed-tensors==0.20.0 kernels==0.19.1
HF_FIXTURES   ?= tests/fixtures/hf

.PHONY: hf-fixtures hf-fixtures-verify hf-fixtures-crosscheck hf-venv

$(HF_VENV)/bin/python:
	$(HF_PYTHON311) -m venv $(HF_VENV)

# Re-installs when the pins in this file change.
$(HF_VENV)/.installed: tools/hf-fixtures.mk | $(HF_VENV)/bin/python
	$(HF_VENV)/bin/python -m pip install -qq $(HF_PIP_PINS)
	touch $@

hf-venv: $(HF_VENV)/.installed

hf-fixtures: $(HF_VENV)/.installed
	$(HF_VENV)/bin/python tools/make_hf_fixtures.py --out $(HF_FIXTURES)
	du -sh $(HF_FIXTURES)

hf-fixtures-verify: $(HF_VENV)/.installed
	$(HF_VENV)/bin/python tools/make_hf_fixtures.py --verify --out $(HF_FIXTURES)

hf-fixtures-crosscheck: $(HF_VENV)/.installed
	$(HF_VENV)/bin/python tools/hf_fixtures_crosscheck.py
