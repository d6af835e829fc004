"""Composite reference of stem ln_mul in stock TF (also the benchmark baseline)."""
import tensorflow as tf


def layer_norm(x, gamma, beta, epsilon):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + tf.cast(epsilon, x.dtype)) * gamma + beta


def ln_mul(x, u, gamma, beta, epsilon=1e-5):
    if isinstance(x, tf.RaggedTensor):
        return x.with_flat_values(ln_mul(x.flat_values, u.flat_values, gamma, beta, epsilon))
    return layer_norm(x, gamma, beta, epsilon) * u
