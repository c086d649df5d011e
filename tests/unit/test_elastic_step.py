"""The elastic loop's per-rank gradient sum (hvdtrain.elastic): a rank running several virtual ranks adds their
gradients, and an embedding's gradient is a tf.IndexedSlices, which has no ``+``."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvdtrain.elastic import _add


def test_two_sparse_embedding_gradients_sum_to_the_dense_sum() -> None:
    a = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([0]), tf.constant([3, 2]))
    b = tf.IndexedSlices(tf.constant([[10.0, 20.0], [5.0, 5.0]]), tf.constant([0, 2]), tf.constant([3, 2]))
    np.testing.assert_array_equal(_add(a, b).numpy(), [[11.0, 22.0], [0.0, 0.0], [5.0, 5.0]])
    dense = tf.ones([3, 2])
    np.testing.assert_array_equal(_add(dense, a).numpy(), [[2.0, 3.0], [1.0, 1.0], [1.0, 1.0]])
    np.testing.assert_array_equal(_add(dense, dense).numpy(), 2 * np.ones([3, 2]))
