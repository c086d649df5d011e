"""``python -m hvdtrain.runtime.rank_env PROGRAM [ARGS...]``: how horovodrun starts every rank of hvdtrain's training or a
user's script. It puts back the secret environment variables the launcher sealed into a 0600 file
(:func:`hvdtrain.core.secrets.seal_env`) and replaces itself with ``PROGRAM`` (exec: same process, same pid)."""
from __future__ import annotations

import os
import sys

from hvdtrain.core import secrets
from hvdtrain.core.errors import EnvironmentProblem


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m hvdtrain.runtime.rank_env PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    try:
        secrets.unseal_env(os.environ)
    except EnvironmentProblem as exc:
        print(f"hvdtrain: error: {exc}", file=sys.stderr)
        return exc.exit_code
    os.execvp(argv[0], argv)
    return 127  # not reached: execvp raises on failure


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
