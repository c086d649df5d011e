"""Launch a benchmark worker under horovodrun and read its JSON result."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def horovodrun(np: int, module: str, args: list[str], env: Optional[dict[str, str]] = None,
               timeout: int = 900) -> dict:
    """Run ``python -m module args`` on np local Gloo ranks; the line 'BENCH {json}' is the result."""
    hr = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [hr, "-np", str(np), "-H", f"localhost:{np}", "--gloo", sys.executable, "-m", module, *args]
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, **(env or {})}
    out = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    for line in out.stdout.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise RuntimeError(f"{module} {args} printed no result (exit {out.returncode}):\n{out.stdout[-2000:]}\n"
                       f"{out.stderr[-3000:]}")
