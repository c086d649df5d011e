"""The Python daemon of a cluster job's executors (``spark.python.daemon.module``), run by Spark as
``python -m yarn.spark_daemon pyspark.worker``.

It puts back the secret environment variables that :func:`yarn.submit.conf_args` kept out of the containers'
environment (``HVDTRAIN_SEALED_ENV`` names the 0600 file shipped with ``--files``, in the container's working
folder) and then is PySpark's own daemon: every Python worker it forks (an ETL or scoring task, the task that
runs a Horovod rank) inherits them, and so does every rank process such a task starts.
"""
from __future__ import annotations

import os
import sys

from hvdtrain.core import secrets
from hvdtrain.core.errors import EnvironmentProblem


def main() -> None:
    try:
        secrets.unseal_env(os.environ)
    except EnvironmentProblem as exc:  # Spark shows the daemon's stderr in the task's failure
        print(f"hvdtrain: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    from pyspark import daemon  # after the environment is whole: it reads the worker module from argv

    daemon.manager()


if __name__ == "__main__":
    main()
