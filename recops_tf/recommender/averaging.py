"""An exponential average of the model's weights, taken at each validation.

Training goes on from the raw weights; validation, the best-weights copy and the test read the
average instead (Polyak averaging at the validation points, as stochastic weight averaging
averages snapshots of a constant-rate run). ``Config.weight_average`` is the average's decay
per validation: 0 keeps the raw weights, 0.7 gives the newest snapshot 0.3 of the weight and
averages over about three validations. The first snapshot starts the average (no bias
toward the initial weights).

The average covers the model's float variables and its growing item tables' rows (keyed, so
rows are matched by item id whatever the tables' order); in a worker group each rank averages
its own shard. It is a ``tf.Module``: put it in the run's checkpoint to resume it.
"""
import contextlib

import numpy as np
import tensorflow as tf


class WeightAverage(tf.Module):
    """``decay`` in [0, 1): the average's weight on its past at each ``update()``."""

    def __init__(self, model, decay):
        super().__init__(name="weight_average")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"weight_average must lie in [0, 1), got {decay}")
        self.decay = float(decay)
        self._model = model
        self._variables = [v for v in model.variables if tf.as_dtype(v.dtype).is_floating]
        self._tables = model.tables()
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.dense = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False)
                      for v in self._variables]
        unknown = tf.TensorShape(None)
        self.keys = [tf.Variable(tf.zeros([0], tf.int64), shape=unknown, trainable=False)
                     for _ in self._tables]
        self.rows = [tf.Variable(tf.zeros([0, 0], tf.float32), shape=unknown, trainable=False)
                     for _ in self._tables]

    def update(self):
        """Folds the current weights into the average (the first call copies them)."""
        past = self.decay if int(self.updates) > 0 else 0.0
        for average, v in zip(self.dense, self._variables):
            average.assign(past * average + (1.0 - past) * tf.convert_to_tensor(v))
        for table, keys_var, rows_var in zip(self._tables, self.keys, self.rows):
            keys, rows = (t.numpy() for t in table.export())
            order = np.argsort(keys)
            keys, rows = keys[order], rows[order]
            old_keys, old_rows = keys_var.numpy(), rows_var.numpy()
            if past > 0.0 and len(old_keys):
                # Rows new since the last update (a table grows) start at their value.
                at = np.minimum(np.searchsorted(old_keys, keys), len(old_keys) - 1)
                known = old_keys[at] == keys
                rows[known] = past * old_rows[at[known]] + (1.0 - past) * rows[known]
            keys_var.assign(keys)
            rows_var.assign(rows)
        self.updates.assign_add(1)

    def load(self):
        """Writes the average into the model (its raw weights are lost: see ``swapped``)."""
        if int(self.updates) == 0:
            raise RuntimeError("no weights averaged yet: call update() first")
        for average, v in zip(self.dense, self._variables):
            v.assign(average)
        for table, keys_var, rows_var in zip(self._tables, self.keys, self.rows):
            table.assign(keys_var, rows_var)

    @contextlib.contextmanager
    def swapped(self):
        """The averaged weights in the model inside the block, the raw ones restored after."""
        raw = [v.numpy() for v in self._variables]
        raw_tables = [table.export() for table in self._tables]
        self.load()
        try:
            yield
        finally:
            for v, value in zip(self._variables, raw):
                v.assign(value)
            for table, (keys, rows) in zip(self._tables, raw_tables):
                table.assign(keys, rows)
