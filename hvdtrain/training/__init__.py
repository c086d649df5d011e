"""Training on every rank, built bottom-up (each module imports only those above it):

* :mod:`~hvdtrain.training.context`: the run's fixed facts (:class:`TrainContext`);
* :mod:`~hvdtrain.training.evaluation`: exact distributed evaluation counts and metrics (pure);
* :mod:`~hvdtrain.training.events`: the loop's data types, the contract between the loop and its hooks;
* :mod:`~hvdtrain.training.hooks`: the hook protocol and the loop's own hooks;
* :mod:`~hvdtrain.training.loop`: :func:`fit`, the epoch loop, calling ``Sequence[Hook]``;
* :mod:`~hvdtrain.training.steps`: the compiled training and evaluation steps;
* :mod:`~hvdtrain.training.state`: the model and its optimizer;
* :mod:`~hvdtrain.training.evaluate`: evaluating a split over the ranks;
* :mod:`~hvdtrain.training.assemble`: the run's hook list, the one place its order is written;
* :mod:`~hvdtrain.training.reports`: the run's documents (``eval_report.json``, ``result.json``);
* :mod:`~hvdtrain.training.publish`: rank 0's outputs and their MLflow logging;
* :mod:`~hvdtrain.training.runtime`: a rank's process set-up (logging, TensorFlow, Horovod's environment).

:mod:`hvdtrain.train` is the run itself, built from these. Importing this package imports nothing.
"""
