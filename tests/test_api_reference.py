"""docs/api.md lists every public Tensor name with a one-line description, and is current."""
import subprocess
import sys

from tests.helpers import REPO, subprocess_env


def test_api_reference_is_complete_and_current():
  p = subprocess.run([sys.executable, str(REPO / "docs" / "api_reference.py"), "--check"], capture_output=True,
                     text=True, env=subprocess_env(), timeout=120)
  assert p.returncode == 0, p.stdout + p.stderr
