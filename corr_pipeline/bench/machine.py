"""The machine line and the git commit that head every benchmark table."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import numpy as np


def machine_line() -> str:
    """CPU model, cores, memory, numpy version, and load average, for benchmark tables."""
    model = platform.processor() or "unknown cpu"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        load = f", load {os.getloadavg()[0]:.1f}"
    except OSError:
        load = ""
    return f"{model}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, numpy {np.__version__}{load}"


def git_commit() -> str:
    """Short hash of the checkout this package is imported from, or ``unknown``."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent,
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"
