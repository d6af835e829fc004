"""Compatibility layers for code written against other recommendation libraries:
``recops_tf.compat.gr`` (Meta's generative-recommenders)."""
from recops_tf.compat import gr  # noqa: F401

__all__ = ["gr"]
