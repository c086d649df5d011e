"""Data: the dataset contract between the ETL and training, and the input pipeline.

The dataset itself:

* :mod:`~hvdtrain.data.manifest`: the published manifest (shards, splits, schema, digests);
* :mod:`~hvdtrain.data.tfrecord`: TFRecord framing and Example encoding without TensorFlow;
* :mod:`~hvdtrain.data.features`: feature values as the ETL encodes them and scoring reproduces them;
* :mod:`~hvdtrain.data.wordpiece`: the WordPiece vocabulary and tokenizer for text columns;
* :mod:`~hvdtrain.data.drift`: the drift reference and comparison;
* :mod:`~hvdtrain.data.synthetic`: generated sample datasets with a known ceiling.

Input, from a manifest to the batches each rank trains on:

* :mod:`~hvdtrain.data.contract`: the manifest-to-model contract (features a
  model kind reads, :class:`InputShape`); pure, no TensorFlow;
* :mod:`~hvdtrain.data.plan`: which records each rank reads, in which order
  (pure);
* :mod:`~hvdtrain.data.staging`: where the reader finds each shard (remote ones
  staged to local disk ahead of use);
* :mod:`~hvdtrain.data.pipeline`: the tf.data graphs (TensorFlow imported lazily);
* :mod:`~hvdtrain.data.trace`: the record-order audit trail.

This package re-exports what the library's callers use.

Training reads an endless stream per rank. Rules:

* Every rank runs the same number of steps per epoch,
  ``floor(train_records / (batch_size * grad_accum_steps * size))``, computed
  from the manifest, so no rank waits in an all-reduce another rank never joins.
* Each rank reads a contiguous, equal share of the split's records
  (:func:`hvdtrain.data.plan.share`): counts differ by at most one record
  between ranks, a shard split between two ranks is read at record
  granularity, and a rank opens and stages only the shards its share touches.
  Fewer shards than ranks is fine (ranks share shards); training warns, since
  it reads less in parallel (``etl.min_shards_per_split``).
* Epoch ``e`` is one pass over the rank's share: its ranges in an order drawn
  from ``(seed, rank, e)``, its records in shuffle windows seeded the same way
  (:func:`~hvdtrain.data.pipeline.shuffled_windows`), cut to the epoch's
  ``steps_per_epoch * batch_size * grad_accum_steps`` records. A record is read
  at most once per epoch; fewer than ``size * batch_size * grad_accum_steps``
  records are left out, and which ones changes with every epoch's shuffle.
* Because a pass depends only on ``(seed, rank, e)``, the stream can be
  resumed exactly: after ``n`` records a rank is in epoch ``n // per_epoch``
  at offset ``n % per_epoch`` (:func:`~hvdtrain.data.plan.resume_point`);
  ``train_dataset(start_record=n)`` starts that pass and skips the offset,
  giving the same records an uninterrupted run reads.

The tf.data graphs (chunked reads, vectorized parsing, shuffle windows of
parsed rows) are described in :mod:`hvdtrain.data.pipeline`. Evaluation reads
each rank's share in manifest order without repeat, keeping the final partial
batch: across ranks, every record exactly once.

Remote shards (``hdfs://``, ``webhdfs://``) are staged to local disk by a
background thread a few shards ahead of the reader and deleted behind it
(:mod:`hvdtrain.data.staging`): tf.data has no HDFS reader with TF 2.21
(tensorflow-io does not load). Local shards are read in place.
"""
from hvdtrain.data.contract import KEY_FEATURE, InputShape, check_manifest
from hvdtrain.data.pipeline import INPUT_ORDER, TrainStream, eval_dataset, train_dataset, with_threads, without_autotune
from hvdtrain.data.plan import auto_epochs, shard_warning, steps_per_epoch
from hvdtrain.data.trace import trace_batches

__all__ = ["INPUT_ORDER", "KEY_FEATURE", "InputShape", "TrainStream", "auto_epochs", "check_manifest",
           "eval_dataset", "shard_warning", "steps_per_epoch", "trace_batches", "train_dataset", "with_threads",
           "without_autotune"]
