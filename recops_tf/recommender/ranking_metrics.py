"""Metrics of the ranking task (NumPy only): AUC, GAUC, log loss, normalized entropy and RMSE.

* ``auc``: the probability that a positive outranks a negative, ties counting one half
  (Mann-Whitney U from average ranks); NaN without both labels.
* ``gauc``: the per-user AUCs averaged with each user's number of candidates as weight, over
  the users with both labels (Alibaba's GAUC).
* ``log_loss``: the mean binary cross-entropy of the predicted probabilities (clipped to
  ``[1e-7, 1 - 1e-7]``).
* ``ne``: normalized entropy (He et al., 2014; DLRM's metric): the log loss divided by the
  entropy of the evaluated labels' mean rate, so 1.0 is the log loss of always predicting the
  base rate and lower is better.
* ``rmse``: of a regression.
"""
import numpy as np

_EPS = 1e-7


def _average_ranks(x):
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), np.float64)
    sorted_x = x[order]
    # Ties share the average of their positions (1-based).
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_x)) + 1]
    ends = np.r_[starts[1:], len(x)]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def auc(labels, scores):
    labels = np.asarray(labels, np.float64) > 0.5
    scores = np.asarray(scores, np.float64)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    ranks = _average_ranks(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def gauc(labels, scores, users):
    labels, scores, users = (np.asarray(labels), np.asarray(scores), np.asarray(users))
    total = weight = 0.0
    order = np.argsort(users, kind="stable")
    labels, scores, users = labels[order], scores[order], users[order]
    cuts = np.r_[0, np.flatnonzero(np.diff(users)) + 1, len(users)]
    for a, b in zip(cuts[:-1], cuts[1:]):
        value = auc(labels[a:b], scores[a:b])
        if not np.isnan(value):
            total += value * (b - a)
            weight += b - a
    return float(total / weight) if weight else float("nan")


def log_loss(labels, probabilities):
    y = np.asarray(labels, np.float64)
    p = np.clip(np.asarray(probabilities, np.float64), _EPS, 1 - _EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))) if len(y) else float("nan")


def ne(labels, probabilities):
    y = np.asarray(labels, np.float64)
    if not len(y):
        return float("nan")
    rate = float(np.clip(y.mean(), _EPS, 1 - _EPS))
    entropy = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    return float(log_loss(y, probabilities) / entropy)


def rmse(targets, predictions):
    t, p = np.asarray(targets, np.float64), np.asarray(predictions, np.float64)
    return float(np.sqrt(np.mean((t - p) ** 2))) if len(t) else float("nan")


def binary_metrics(labels, probabilities, users):
    """``{"auc", "gauc", "log_loss", "ne"}`` of one binary task."""
    return {"auc": auc(labels, probabilities), "gauc": gauc(labels, probabilities, users),
            "log_loss": log_loss(labels, probabilities), "ne": ne(labels, probabilities)}


def task_metrics(predictions, labels, masks, users):
    """Metrics of every task: ``predictions``/``labels``/``masks`` are dicts of task -> flat
    arrays over the candidates, ``users`` the user of each candidate. The binary tasks'
    predictions are probabilities, the regression's (``rating``) values."""
    out = {}
    for task, pred in predictions.items():
        keep = masks[task] > 0
        if task == "rating":
            out[task] = {"rmse": rmse(labels[task][keep], pred[keep])}
        else:
            out[task] = binary_metrics(labels[task][keep], pred[keep], users[keep])
    return out
