"""The main job: sequential (next-item) recommenders in one harness (HSTU from the library's
layers, SASRec from stock Keras), their data, the paper's evaluation protocol and baselines,
training with checkpoints and resume, export and serving (``recops-tf train / export /
recommend``)."""
from recops_tf.recommender.data import Dataset, DataError, load
from recops_tf.recommender.synthetic import synthetic
from recops_tf.recommender.evaluation import MarkovChain, Split, baselines, metrics, ranks
from recops_tf.recommender.model import GenerativeRecommender
from recops_tf.recommender.training import PRESETS, Config, Result, evaluate, train
from recops_tf.recommender.exporting import export, recommend

__all__ = ["Dataset", "DataError", "load", "synthetic", "Split", "ranks", "metrics",
           "baselines", "MarkovChain", "GenerativeRecommender", "PRESETS", "Config", "Result",
           "train", "evaluate", "export", "recommend"]
