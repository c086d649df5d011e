"""Horovod training on YARN: spark-submit of a driver that runs ``horovod.spark.run``.

- :mod:`yarn.submit` — the command (``python -m yarn.submit`` / ``hvdtrain yarn submit``):
  validation and the spark-submit plan (pure), then the submission as a context manager.
- :mod:`yarn.driver` — the Spark driver: ``horovod.spark.run`` of the rank function.
- :mod:`yarn.executor` — what each rank runs: GPU pinning, then ``hvdtrain.training.train.run``.
- :mod:`yarn.run` — ``hvdtrain yarn run``: a user's own Horovod script, submitted the same way, run by every rank
  (:func:`yarn.executor.run_script`) with per-rank logs.
- :mod:`yarn.score`, :mod:`yarn.etl_submit` — ``hvdtrain yarn score`` / ``hvdtrain yarn etl``: the scoring job
  and the ETL (``etl/job.py``) submitted with the same parts (archive, code zip, Kerberos, queue, ``yarn.env``).
- :mod:`yarn.packaging` — the code zip (``--py-files``) and the packed, cached environment (``--archives``).
- ``gpu_discovery.sh`` — Spark's GPU discovery script, shipped with GPU jobs.

This package imports :mod:`hvdtrain`; :mod:`hvdtrain` never imports it.
"""
