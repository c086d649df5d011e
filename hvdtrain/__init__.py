"""hvdtrain: Spark/Hive ETL to TFRecords, Horovod + TensorFlow training on YARN.

Subsystems, lowest first; each imports only the ones before it (``tests/unit/test_import_graph.py``):

* :mod:`hvdtrain.core`: the job config, task kinds, errors, secrets and their redaction;
* :mod:`hvdtrain.hadoop`: the Hadoop client (HDFS, WebHDFS, tokens, Kerberos), ledgers and leases, the minicluster;
* :mod:`hvdtrain.data`: the manifest, TFRecords, feature encodings and the tf.data input pipeline;
* :mod:`hvdtrain.runtime`: launching and supervising ranks, their environment and collectives;
* :mod:`hvdtrain.model`: model builders, heads, metrics and evaluation, schedules;
* :mod:`hvdtrain.observe`: the loop's events and hooks for what users watch (console, MLflow, Prometheus,
  TensorBoard, timelines);
* :mod:`hvdtrain.tune`: hyperparameter search over training runs (trials report through it);
* :mod:`hvdtrain.training`: the run on every rank, checkpoints, resume and outputs;
* :mod:`hvdtrain.score`: scoring Hive tables with an exported model;
* :mod:`hvdtrain.cli`: the ``hvdtrain`` command.

``etl/`` and ``yarn/`` build on these; nothing here imports them.
"""
import os as _os

__version__ = "0.1.0"


def code_root() -> str:
    """The folder that holds the hvdtrain package (and etl/, yarn/ in a checkout), or the code zip when this runs
    from YARN's --py-files: what a child Python needs on its PYTHONPATH to import them as this process does."""
    return _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
