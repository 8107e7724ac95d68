"""The complete user test file shown in docs/property-testing.md runs and passes."""

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).parents[2] / "docs" / "property-testing.md"


def test_user_test_file_passes(tmp_path):
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    (tmp_path / "test_my_model.py").write_text(block)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "test_my_model.py")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout
