"""The fixture generator's specs (tools/hf_fixtures/spec.py) describe the
committed fixtures: one spec per folder of tests/fixtures/hf, with the saved
config's model_type and class, and every kwarg the saved config.json keeps at
the value the spec gives (a few kwargs transformers does not save are left
out). The spec module needs no torch, so the project venv reads it."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "hf"


def _spec_module():
    path = ROOT / "tools" / "hf_fixtures" / "spec.py"
    spec = importlib.util.spec_from_file_location("hf_fixture_spec", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module       # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SPECS = _spec_module().specs()


def test_one_spec_per_fixture_folder():
    folders = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
    assert sorted(s.name for s in SPECS) == folders


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_spec_matches_the_saved_config(spec):
    saved = json.loads((FIXTURES / spec.name / "config.json").read_text())
    assert saved["model_type"] == spec.model_type
    assert saved["architectures"] == [spec.model]
    differ = {k: (v, saved[k]) for k, v in spec.kwargs.items() if k in saved and saved[k] != v}
    assert not differ, f"{spec.name}: spec kwarg vs config.json: {differ}"
