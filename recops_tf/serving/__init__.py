"""Serving what ``recops-tf train`` exports (``recops-tf serve``): TF Serving's REST and gRPC
APIs with the recops_tf ops loaded, dynamic batching, versions picked up without a restart,
Prometheus metrics, and a ``:recommend`` endpoint that keeps each user's key/value cache
between requests. See docs/serving.md.

Needs the ``serve`` extra (``pip install 'recops_tf[serve]'``: aiohttp, prometheus-client)."""
from recops_tf.serving.models import RequestError
from recops_tf.serving.server import ModelServer, Options, Running

__all__ = ["Options", "Running", "ModelServer", "RequestError"]
