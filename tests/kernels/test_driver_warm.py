"""kernels/driver_warm.py: Triton's driver built on a thread; without a GPU the thread ends quietly."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys, torch
from multilora_cli.kernels import driver_warm
driver_warm.start(); first = driver_warm._thread
driver_warm.start()  # once per process
driver_warm.join()
assert driver_warm._thread is first and not first.is_alive()
from triton.runtime import driver
try:
    driver.active.utils
    built = True
except Exception:
    built = False
print(built == torch.cuda.is_available())
"""


def test_start_builds_the_driver_once_or_ends_quietly_without_a_gpu():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
