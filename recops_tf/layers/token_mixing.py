"""Keras layer: token mixing (LayerNorm of x + xᵀ) with learned affine parameters."""
import keras
import tensorflow as tf

from recops_tf.ops.token_mixing import token_mixing


@keras.saving.register_keras_serializable(package="recops_tf")
class TokenMixing(keras.layers.Layer):
    """``LayerNorm(x + xᵀ) * gamma + beta`` over ``[B, S, S]`` blocks (``recops_tf.token_mixing``).

    Args:
      epsilon: added to the variance (default 1e-7, the seed's; use ~1e-5 with float16).
      gamma_initializer, beta_initializer: of the ``[S]`` affine parameters.

    Input ``[B, S, S]`` (S known); output of the same shape. The layer has no XLA kernel: it
    sets ``supports_jit = False``, so Keras never compiles a model using it with XLA.
    """

    def __init__(self, epsilon=1e-7, gamma_initializer="ones", beta_initializer="zeros",
                 **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False  # no XLA kernel: keeps Keras from compiling with XLA
        self.epsilon = float(epsilon)
        if not self.epsilon > 0.0:
            raise ValueError(f"epsilon must be positive, got {epsilon}")
        self.gamma_initializer = keras.initializers.get(gamma_initializer)
        self.beta_initializer = keras.initializers.get(beta_initializer)

    def build(self, input_shape):
        s = input_shape[-1]
        if s is None or input_shape[-2] not in (None, s):
            raise ValueError(f"TokenMixing needs a known square [B, S, S] input, got "
                             f"{input_shape}")
        self.gamma = self.add_weight(name="gamma", shape=(s,),
                                     initializer=self.gamma_initializer)
        self.beta = self.add_weight(name="beta", shape=(s,), initializer=self.beta_initializer)

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        return token_mixing(inputs, tf.cast(self.gamma, inputs.dtype),
                            tf.cast(self.beta, inputs.dtype), epsilon=self.epsilon)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({
            "epsilon": self.epsilon,
            "gamma_initializer": keras.initializers.serialize(self.gamma_initializer),
            "beta_initializer": keras.initializers.serialize(self.beta_initializer),
        })
        return config
