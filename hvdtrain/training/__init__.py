"""Training: the run on every rank, its loop, checkpoints and outputs.

* :mod:`~hvdtrain.training.context`: the run's fixed facts (:class:`TrainContext`);
* :mod:`~hvdtrain.training.hooks`: the loop's own hooks (the protocol and the loop's data types are
  :mod:`hvdtrain.observe.events`);
* :mod:`~hvdtrain.training.loop`: :func:`fit`, the epoch loop, calling ``Sequence[Hook]``;
* :mod:`~hvdtrain.training.steps`: the compiled training and evaluation steps;
* :mod:`~hvdtrain.training.state`: the model and its optimizer;
* :mod:`~hvdtrain.training.evaluate`: evaluating a split over the ranks;
* :mod:`~hvdtrain.training.assemble`: the run's hook list, the one place its order is written;
* :mod:`~hvdtrain.training.reports`: the run's documents (``eval_report.json``, ``result.json``);
* :mod:`~hvdtrain.training.publish`: rank 0's outputs and their MLflow logging;
* :mod:`~hvdtrain.training.runtime`: a rank's process set-up (logging, TensorFlow, Horovod's environment);
* :mod:`~hvdtrain.training.checkpoint`: checkpoints on any file system, their commit and retention;
* :mod:`~hvdtrain.training.resume`: saving and restoring the run's state (:class:`Checkpointer`);
* :mod:`~hvdtrain.training.demo`: what ``hvdtrain demo`` may delete between its runs.

:mod:`hvdtrain.training.train` is the run itself (``python -m hvdtrain.training.train``), built from these;
:mod:`hvdtrain.training.elastic` is its elastic form. Importing this package imports nothing.
"""
