"""Keras 3 ports of Horovod v0.28.1 tests whose bodies cannot run on Keras 3.

Not collected by a plain `pytest` run (no `test_` prefix): tests/multiprocess/test_horovod_upstream.py runs
this file under `horovodrun -np 2 --gloo`, next to Horovod's own test files.

Each test here is the upstream test of the same name (test/parallel/test_tensorflow2_keras.py
or test_tensorflow.py at v0.28.1, Apache-2.0), changed only where the test's *own* code uses
Keras 2 API that Keras 3 removed; every change is listed in the test's docstring. What the test
checks of Horovod is unchanged, and where upstream asserted nothing ("just verify it doesn't
hang") an assertion that the ranks agree is added.
"""
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from parameterized import parameterized

keras = tf.keras


def _assert_same_on_all_ranks(test, values):
    """Every rank holds what rank 0 holds (rank 0's values broadcast and compared)."""
    for value in values:
        value = tf.convert_to_tensor(value)
        test.assertAllClose(hvd_tf.broadcast(value, root_rank=0), value)


class _TestingOptimizer(keras.optimizers.Optimizer):
    """Upstream's TestingOptimizer (var += grad), on the Keras 3 optimizer API.

    Changes: Keras 3 optimizers require `learning_rate`, and call
    `update_step(gradient, variable, learning_rate)` (Keras 2.11: `(gradient, variable)`).
    """

    def __init__(self, name, learning_rate=0.1, **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        variable.assign_add(gradient)


class Keras3PortTests(tf.test.TestCase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        hvd.init()

    def test_train_model_lr_schedule(self):
        """Port. Changes: `keras.losses.mean_squared_error` -> `"mse"`; `ThresholdedReLU(0.5)`
        (removed in Keras 3) -> `ReLU(threshold=0.5)`; no `experimental_run_tf_function`
        compile argument; `optimizer.lr` -> `optimizer.learning_rate`. Added: the weights
        agree across ranks after training.
        """
        initial_lr = 0.1 * hvd.size()
        opt = keras.optimizers.Adam()
        opt = hvd.DistributedOptimizer(opt)

        def linear_multiplier(epoch):
            return epoch

        model = keras.models.Sequential()
        model.add(keras.Input(shape=(3,)))
        model.add(keras.layers.Dense(2))
        model.add(keras.layers.RepeatVector(3))
        model.add(keras.layers.ReLU(threshold=0.5))
        model.compile(loss="mse", optimizer=opt, metrics=[keras.metrics.categorical_accuracy])
        x = np.random.random((10, 3))
        y = np.random.random((10, 3, 2))

        class StoreLearningRateCallback(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                lr = float(self.model.optimizer.learning_rate.numpy())
                if 0 <= epoch < 5:
                    assert lr <= initial_lr or np.isclose(lr, initial_lr)
                if 5 < epoch < 10:
                    assert lr <= initial_lr * 1e-1 or np.isclose(lr, initial_lr * 1e-1)
                if 10 < epoch < 15:
                    assert lr < initial_lr * 1e-2 or np.isclose(lr, initial_lr * 1e-2)
                if 15 <= epoch < 20:
                    assert np.isclose(lr, initial_lr * linear_multiplier(epoch))

        callbacks = [
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
            hvd.callbacks.LearningRateWarmupCallback(initial_lr=initial_lr, warmup_epochs=5),
            hvd.callbacks.LearningRateScheduleCallback(
                initial_lr=initial_lr, multiplier=1e-1, start_epoch=5, end_epoch=10),
            hvd.callbacks.LearningRateScheduleCallback(
                initial_lr=initial_lr, multiplier=1e-2, start_epoch=10, end_epoch=15),
            hvd.callbacks.LearningRateScheduleCallback(
                initial_lr=initial_lr, multiplier=linear_multiplier, start_epoch=15, end_epoch=20),
            StoreLearningRateCallback()]
        train_history = model.fit(x, y, steps_per_epoch=5, callbacks=callbacks, epochs=20, verbose=0)

        # test that the metrics average is being respected
        loss_metrics = tf.convert_to_tensor(train_history.history["loss"], dtype=tf.float32)
        self.assertAllClose(hvd.broadcast(loss_metrics, root_rank=0), loss_metrics)
        _assert_same_on_all_ranks(self, model.get_weights())

    def _embedding_model(self, opt):
        model = keras.models.Sequential()
        model.add(keras.Input(shape=(10,), dtype="int32"))
        model.add(keras.layers.Embedding(1000, 64))
        model.compile(loss="mse", optimizer=opt)
        return model

    def test_sparse_as_dense(self):
        """Port. Changes: `RMSprop(lr=)` -> `learning_rate=`; `Embedding(input_length=)` and
        `experimental_run_tf_function` dropped (not Keras 3 arguments). Added: with rank 0's
        weights broadcast first and different data per rank, one step leaves the ranks equal
        (so the sparse embedding gradient was all-reduced, as a dense tensor).
        """
        opt = keras.optimizers.RMSprop(learning_rate=0.0001)
        opt = hvd.DistributedOptimizer(opt, sparse_as_dense=True)
        model = self._embedding_model(opt)
        hvd_tf.broadcast_variables(model.variables, root_rank=0)

        rng = np.random.default_rng(hvd.rank())
        x = rng.integers(1000, size=(32, 10))
        y = rng.random((32, 10, 64))
        model.train_on_batch(x, y)
        _assert_same_on_all_ranks(self, model.get_weights())

    def test_sparse_as_dense_with_grad_aggregation(self):
        """Port. Changes as test_sparse_as_dense; the assertion is upstream's."""
        backward_passes_per_step = 2
        opt = keras.optimizers.RMSprop(learning_rate=0.0001)
        opt = hvd.DistributedOptimizer(
            opt, sparse_as_dense=True, backward_passes_per_step=backward_passes_per_step)
        model = self._embedding_model(opt)

        x = np.random.randint(1000, size=(32, 10))
        y = np.random.random((32, 10, 64))
        training_steps = 3
        for _ in range(training_steps):
            model.train_on_batch(x, y)

        aggregation_counter = opt._agg_helper.counter.numpy()
        assert aggregation_counter == training_steps % backward_passes_per_step

    @parameterized.expand([[True], [False]])
    def test_gradient_aggregation(self, average_aggregated_gradients):
        """Port. Changes: the test's optimizer on the Keras 3 API (see _TestingOptimizer)."""
        backward_passes_per_step = 4
        hvd_optimizer = hvd.DistributedOptimizer(
            optimizer=_TestingOptimizer("test"),
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients,
            sparse_as_dense=True,
        )
        _ = hvd_optimizer.iterations

        x_0 = 0.0
        y_0, y_1 = 1.0, 2.0
        x = tf.Variable([x_0])
        y = tf.Variable([y_0, y_1])
        variables = [x, y]

        def loss():
            # tf.gather gives an IndexedSlices gradient for y.
            return x - tf.gather(y, [0])

        def compute_expected_value(batch_id):
            num_of_steps = (batch_id + 1) // backward_passes_per_step
            gradient_of_x = num_of_steps * 1.0
            gradient_of_y_0 = num_of_steps * -1.0
            if not average_aggregated_gradients:
                gradient_of_x *= backward_passes_per_step
                gradient_of_y_0 *= backward_passes_per_step
            return np.array(x_0 + gradient_of_x), np.array([y_0 + gradient_of_y_0, y_1])

        @tf.function
        def compute_and_apply_gradients_in_tf_function(var_list, **kwargs):
            grads_and_vars = hvd_optimizer._compute_gradients(loss, var_list=var_list)
            hvd_optimizer.apply_gradients(grads_and_vars, **kwargs)

        total_num_of_steps = 10
        for idx in range(total_num_of_steps):
            compute_and_apply_gradients_in_tf_function(
                var_list=variables, experimental_aggregate_gradients=False)
            expected_x, expected_y = compute_expected_value(idx)
            assert np.isclose(variables[0].numpy(), expected_x)
            assert np.isclose(variables[1].numpy(), expected_y).all()
            assert idx + 1 == hvd_optimizer.iterations.numpy()

        aggregation_counter = hvd_optimizer._agg_helper.counter.numpy()
        assert aggregation_counter == total_num_of_steps % backward_passes_per_step

    @parameterized.expand([[True], [False]])
    def test_gradient_aggregation_with_local_vars(self, average_aggregated_gradients):
        """Port. Changes: the test's optimizer on the Keras 3 API (see _TestingOptimizer)."""
        backward_passes_per_step = 4
        hvd_optimizer = hvd.DistributedOptimizer(
            optimizer=_TestingOptimizer("test"),
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients,
            sparse_as_dense=True,
        )
        _ = hvd_optimizer.iterations

        total_num_variables = 8
        num_local_vars = 4
        X_0 = [0.0] * total_num_variables
        Y_0, Y_1 = [1.0] * total_num_variables, [2.0] * total_num_variables
        X = [tf.Variable([x_0]) for x_0 in X_0]
        Y = [tf.Variable([y_0, y_1]) for y_0, y_1 in zip(Y_0, Y_1)]
        variables = [X, Y]
        flatten_variables = [item for sublist in variables for item in sublist]
        for i in range(num_local_vars):
            hvd_optimizer.register_local_var(X[i])
            hvd_optimizer.register_local_var(Y[i])

        def loss():
            gathered_y_1 = tf.gather(Y, [0], axis=1)
            return X - (float(hvd.rank() + 1) * gathered_y_1)

        def compute_expected_value(batch_id):
            num_of_steps = (batch_id + 1) // backward_passes_per_step
            gradient_of_x = num_of_steps * 1.0
            gradient_of_y_multiplier = float(hvd.size() + 1) / 2
            gradient_of_y_0 = num_of_steps * gradient_of_y_multiplier * -1.0
            if not average_aggregated_gradients:
                gradient_of_x *= backward_passes_per_step
                gradient_of_y_0 *= backward_passes_per_step
            expected_x = np.array(X_0)
            for i in range(len(X_0)):
                if i < num_local_vars:
                    expected_x[i] += gradient_of_x / hvd.size()
                else:
                    expected_x[i] += gradient_of_x
            expected_y_0 = np.array(Y_0)
            for i in range(len(Y_0)):
                if i < num_local_vars:
                    expected_y_0[i] += ((gradient_of_y_0 / gradient_of_y_multiplier)
                                        * float(hvd.rank() + 1)) / hvd.size()
                else:
                    expected_y_0[i] += gradient_of_y_0
            expected_y = [[ey0, ey1] for ey0, ey1 in zip(expected_y_0, np.array(Y_1))]
            return np.reshape(expected_x, (-1, 1)), np.array(expected_y)

        @tf.function
        def compute_and_apply_gradients_in_tf_function(var_list, **kwargs):
            grads_and_vars = hvd_optimizer._compute_gradients(loss, var_list=var_list)
            hvd_optimizer.apply_gradients(grads_and_vars, **kwargs)

        total_num_of_steps = 10
        for idx in range(total_num_of_steps):
            compute_and_apply_gradients_in_tf_function(
                var_list=flatten_variables, experimental_aggregate_gradients=False)
            expected_x, expected_y = compute_expected_value(idx)
            assert np.isclose(np.array(variables[0]), expected_x).all()
            assert np.isclose(np.array(variables[1]), expected_y).all()
            assert idx + 1 == hvd_optimizer.iterations.numpy()

        aggregation_counter = hvd_optimizer._agg_helper.counter.numpy()
        assert aggregation_counter == total_num_of_steps % backward_passes_per_step

    def test_horovod_syncbn_cpu(self):
        """Port of test_tensorflow.py's test. Changes: the reference
        `keras.layers.BatchNormalization(axis=1, fused=False)` loses `fused=False` (Keras 3
        has no such argument and never fuses); eager only (Keras 3 layers do not build in
        TF1 graph mode).
        """
        with tf.device("/cpu:0"):
            x_list = [
                tf.convert_to_tensor(np.stack([
                    np.array([[r, r + 1], [r * 2, r * 2 + 1], [r * 3, r * 3 + 1], [r * 4, r * 4 + 1]],
                             dtype=np.float32)
                    for r in range(hvd.size())]), np.float32),
                tf.convert_to_tensor(np.stack([
                    np.array([[r + 1], [r * 2 + 1], [r * 3 + 1], [r * 4 + 1]], dtype=np.float32)
                    for r in range(hvd.size())]), np.float32),
            ]
            for x in x_list:
                bn = keras.layers.BatchNormalization(axis=1)
                sync_bn = hvd_tf.SyncBatchNormalization(axis=1)
                bn_out = bn(x, training=True)
                sync_bn_out = sync_bn(tf.expand_dims(x[hvd.rank()], 0), training=True)

                self.assertAllClose(sync_bn_out, np.expand_dims(bn_out[hvd.rank()], 0))
                self.assertAllClose(sync_bn.moving_mean, bn.moving_mean)
                self.assertAllClose(sync_bn.moving_variance, bn.moving_variance)
