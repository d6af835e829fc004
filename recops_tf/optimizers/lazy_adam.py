"""LazyAdam for Keras 3 on the fused LazyAdam kernels."""
import keras
import tensorflow as tf

from recops_tf.ops.embedding_by_address import optimizer_variable, table_of_anchor
from recops_tf.ops.fused_lazy_adam import lazy_adam_update
from recops_tf.optimizers._tables import TableAwareOptimizer, slices_of_table


@keras.saving.register_keras_serializable(package="recops_tf")
class LazyAdam(TableAwareOptimizer):
    """Adam that, for sparse gradients, updates only the rows the batch touched.

    TF-Addons LazyAdam semantics: for a ``tf.IndexedSlices`` gradient (an embedding lookup's,
    ``tf.gather``'s or a ``DynamicEmbedding`` layer's) only the touched rows of the variable
    and of its moments m and v change; duplicate rows' gradients are summed first. The step
    count bias-corrects the learning rate, ``lr_t = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)``,
    and epsilon is added outside the square root::

        m = beta_1 m + (1 - beta_1) g;  v = beta_2 v + (1 - beta_2) g**2
        var -= lr_t m / (sqrt(v) + epsilon)

    Sparse updates of float32 variables run the fused ``lazy_adam_update`` kernel (one pass,
    deterministic, multi-threaded); other dtypes use the same math from stock ops. Dense
    gradients get the ordinary (dense) Adam update with the same formula. A
    ``recops_tf.layers.DynamicEmbedding`` table is updated by address, with m and v in its
    co-located slots; so is a raw ``DynamicEmbeddingTable`` (``num_slots >= 2``) passed
    where a variable goes, with its gradient ``tape.gradient(loss, table.resource_handle)``:
    ``apply_gradients([(grad, table), ...])``, bias correction and clipping included.

    Args:
      learning_rate: float, schedule or callable.
      beta_1: first-moment decay.
      beta_2: second-moment decay.
      epsilon: added to ``sqrt(v)``.
      name, **kwargs: as ``keras.optimizers.Optimizer`` (``clipnorm``, ``clipvalue``,
        ``global_clipnorm``, ``ema``...). Keras' own decoupled ``weight_decay`` is not
        supported here.

    Example:

    >>> table = recops_tf.DynamicEmbeddingTable(2, num_slots=2)
    >>> with tf.GradientTape() as tape:
    ...     loss = tf.reduce_sum(recops_tf.embedding_lookup(table, [7, 8]))
    >>> optimizer = LazyAdam(0.1)
    >>> _ = optimizer.apply_gradients([(tape.gradient(loss, table.resource_handle), table)])
    >>> int(optimizer.iterations)
    1
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 name="lazy_adam", **kwargs):
        if kwargs.get("weight_decay") is not None:
            raise ValueError("LazyAdam does not support Keras' weight_decay")
        kwargs.pop("weight_decay", None)
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon

    def build(self, var_list):
        if self.built:
            return
        var_list = [optimizer_variable(v) for v in var_list]  # a table: its anchor
        super().build(var_list)
        self._m, self._v = [], []
        for var in var_list:
            # A table's moments live in its rows; its scalar anchor gets (unused) scalars.
            self._m.append(self.add_variable_from_reference(var, "m"))
            self._v.append(self.add_variable_from_reference(var, "v"))

    def _bias_corrected(self, learning_rate, dtype):
        """lr * sqrt(1 - beta_2**t) / (1 - beta_1**t) with t = iterations + 1, in `dtype`."""
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = _constant(self.beta_1, dtype), _constant(self.beta_2, dtype)
        return (tf.cast(learning_rate, dtype) * tf.sqrt(1 - tf.pow(beta_2, step)) /
                (1 - tf.pow(beta_1, step)))

    def update_step(self, gradient, variable, learning_rate):
        attrs = dict(beta1=self.beta_1, beta2=self.beta_2, epsilon=self.epsilon)
        table = table_of_anchor(variable)
        if table is not None:
            return lazy_adam_update(table, None, None, slices_of_table(gradient), None,
                                    self._bias_corrected(learning_rate, tf.float32), **attrs)
        index = self._get_variable_index(variable)
        m, v = self._m[index], self._v[index]
        lr_t = self._bias_corrected(learning_rate, variable.dtype)
        if isinstance(gradient, tf.IndexedSlices):
            # The fused kernel steps the rows of a float32 matrix; other dtypes and ranks (a
            # gathered bias vector, a [V, a, b] table) take the same step from stock ops.
            if variable.dtype == tf.float32 and len(variable.shape) == 2:
                return lazy_adam_update(variable, m, v, gradient, None, lr_t, **attrs)
            return self._sparse_composite(gradient, variable, m, v, lr_t)
        g = tf.cast(gradient, variable.dtype)
        b1, b2 = _constant(self.beta_1, variable.dtype), _constant(self.beta_2, variable.dtype)
        self.assign(m, b1 * m + (1 - b1) * g)
        self.assign(v, b2 * v + (1 - b2) * tf.square(g))
        self.assign_sub(variable, lr_t * m / (tf.sqrt(v) + _constant(self.epsilon, v.dtype)))

    def _sparse_composite(self, gradient, variable, m, v, lr_t):
        """The TF-Addons LazyAdam step from stock ops (variables the kernel does not take)."""
        dtype = variable.dtype
        unique, position = tf.unique(gradient.indices)
        g = tf.math.unsorted_segment_sum(tf.cast(gradient.values, dtype), position,
                                         tf.shape(unique)[0])
        b1, b2 = _constant(self.beta_1, dtype), _constant(self.beta_2, dtype)
        m_rows = b1 * tf.gather(m, unique) + (1 - b1) * g
        v_rows = b2 * tf.gather(v, unique) + (1 - b2) * tf.square(g)
        self.assign(m, tf.IndexedSlices(m_rows, unique))
        self.assign(v, tf.IndexedSlices(v_rows, unique))
        step = lr_t * m_rows / (tf.sqrt(v_rows) + _constant(self.epsilon, dtype))
        self.assign_sub(variable, tf.IndexedSlices(step, unique))

    def get_config(self):
        config = super().get_config()
        config.pop("weight_decay", None)
        config.update(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)
        return config


def _constant(x, dtype):
    """x in dtype without a detour through float32 (tf.cast of a Python float would round it
    to float32 first)."""
    return tf.cast(x, dtype) if tf.is_tensor(x) else tf.constant(x, dtype)
