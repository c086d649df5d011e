"""Test tiers, registered as markers.

- unit (no marker): fast, no Spark, no horovodrun.
- spark: a local SparkSession with an embedded Hive (Derby) metastore.
- multiprocess: runs under `horovodrun -np 2 -H localhost:2 --gloo` and checks ranks agree.
- e2e: the whole pipeline, ETL to MLflow.
- hadoop: needs a real cluster; runs only when HVDTRAIN_TEST_HDFS / HVDTRAIN_TEST_YARN are set.
- horovod_upstream: Horovod v0.28.1's own test_tensorflow.py / test_tensorflow2_keras.py (and their
  Keras 3 ports) under horovodrun against this project's Horovod build; the files come from
  ../shared/horovod-upstream-tests or HVDTRAIN_HOROVOD_TESTS, and a missing folder fails.

Markers are registered in pytest.ini (--strict-markers). `make test` runs every tier
that can run here. Select with -m, e.g. -m "not e2e".
"""
from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_java = shutil.which("java") is None
    for item in items:
        if "hadoop" in item.keywords and not os.environ.get("HVDTRAIN_TEST_HDFS"):
            item.add_marker(pytest.mark.skip(
                reason="needs a Hadoop cluster: set HVDTRAIN_TEST_HDFS=hdfs://namenode:8020/tmp/hvdtrain-test "
                       "(and HVDTRAIN_TEST_YARN=1 for the YARN job) on a host with the Hadoop client"))
        if no_java and ("spark" in item.keywords or "e2e" in item.keywords):
            item.add_marker(pytest.mark.skip(reason="Spark needs Java 17 on PATH"))
