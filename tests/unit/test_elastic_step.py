"""The elastic loop's per-rank gradient sum (hvdtrain.training.elastic): a rank running several virtual ranks adds their
gradients, and an embedding's gradient is a tf.IndexedSlices, which has no ``+``; and its batch streams, which
every reset drops."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import tensorflow as tf

from hvdtrain.core import config
from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from hvdtrain.training.elastic import _add, _streams


def test_two_sparse_embedding_gradients_sum_to_the_dense_sum() -> None:
    a = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([0]), tf.constant([3, 2]))
    b = tf.IndexedSlices(tf.constant([[10.0, 20.0], [5.0, 5.0]]), tf.constant([0, 2]), tf.constant([3, 2]))
    np.testing.assert_array_equal(_add(a, b).numpy(), [[11.0, 22.0], [0.0, 0.0], [5.0, 5.0]])
    dense = tf.ones([3, 2])
    np.testing.assert_array_equal(_add(dense, a).numpy(), [[2.0, 3.0], [1.0, 1.0], [1.0, 1.0]])
    np.testing.assert_array_equal(_add(dense, dense).numpy(), 2 * np.ones([3, 2]))


def test_the_streams_a_reset_drops_run_without_tf_data_autotuning(tmp_path) -> None:
    """Dropping an iterator waits for its autotuning model's optimization pass in progress, which grows with the
    passes read: survivors of the elastic drill took 10-19 s to reach the reset's rendezvous while every other
    rank waited. The streams of the virtual ranks a rank runs are built without the model, and read the batches
    of their virtual rank all the same."""
    manifest = make_text_dataset(str(tmp_path), TextSpec(layout=Layout(n_per_split={"train": 64, "validation": 8,
                                                                                    "test": 8}, shards_per_split=2)))
    cfg = config.from_dict({"name": "streams", "workdir": str(tmp_path), "source": {"table": "demo.reviews"},
                            "etl": {"output": str(tmp_path)}, "train": {"batch_size": 4, "shuffle_buffer": 8}},
                           base_dir=str(tmp_path))
    shape = SimpleNamespace(inputs=["input_ids"], label_feature="label", read_features=("input_ids", "label"))
    job = SimpleNamespace(cfg=cfg, manifest=manifest, shape=shape, virtual=2, steps=8, stage_dir=str(tmp_path))
    streams = _streams(job, [0, 1], step=3)
    assert len(streams) == 2
    for stream in streams:
        assert stream._dataset.options().autotune.enabled is False
        batch = next(stream)
        assert batch["label"].shape == (4,) and set(batch) == {"input_ids", "label"}
    first = [next(s)["input_ids"].numpy() for s in _streams(job, [0, 1], step=3)]
    assert not np.array_equal(first[0], first[1])  # each virtual rank its own share
