"""The main job: a generative (next-item) recommender built from the library's layers, its
data, training, evaluation, export and serving (``recops-tf train / export / recommend``)."""
from recops_tf.recommender.data import Dataset, DataError, load, synthetic
from recops_tf.recommender.model import GenerativeRecommender
from recops_tf.recommender.training import (Config, evaluate, export, popularity_baseline,
                                         recommend, train)

__all__ = ["Dataset", "DataError", "load", "synthetic", "GenerativeRecommender", "Config",
           "train", "evaluate", "popularity_baseline", "export", "recommend"]
