"""``recops-tf tune``: a hyperparameter search on the validation split, on Optuna.

Optuna, not KerasTuner: the trainer is a custom loop driven by a ``Config``, not
``model.fit``; Optuna's define-by-run trials take a ``Config`` as they are, its TPE sampler
handles the mixed (log-scaled, integer, categorical) space, ``enqueue_trial`` makes the
defaults the first trial, and its SQLite storage keeps every finished trial, so that a search
killed at any point resumes by running the same command again.

Every trial trains on the training part of the leave-one-out split and is scored by its best
validation metric (``config.validation_metric``); the test targets choose nothing. A trial
whose validation curve falls below the median of the finished trials' at the same step (after
``min_steps / 4`` steps) is pruned there (Optuna's MedianPruner), so that a budget tries more
settings; a pruned trial counts as run. The first
trial is the defaults (the settings ``profile.fit`` chose, or the flags given), so the best
validation metric found is never below theirs. ``DIR/best.json`` holds the best trial's
``Config`` fields, which ``recops-tf train --config DIR/best.json`` reads.
"""
import dataclasses
import json
import math
import os
import time

STUDY = "recops-tf-tune"
# The searched fields and their ranges. A field the user set with a flag is not searched.
SPACE = {
    "learning_rate": ("float_log", 2e-4, 5e-3),
    "dropout_rate": ("float", 0.0, 0.5),
    "num_blocks": ("int", 1, 4),
    "d_model": ("categorical", (32, 50, 64, 96)),
    "temperature": ("float_log", 0.025, 0.1),  # of cosine logits: wider is wasted trials
    "batch_size": ("categorical", (32, 64, 128, 256)),
    "seen_bias": ("categorical", (True, False)),
    "weight_average": ("categorical", (0.0, 0.8)),  # the raw weights or the fitted rule's decay
}


class TuneError(ValueError):
    """A bad input of the search (the CLI prints it as one line, exit 2)."""


def _optuna():
    try:
        import optuna
    except ImportError:
        raise TuneError("recops-tf tune needs Optuna: pip install 'recops_tf[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def searched(given=()):
    """The fields of `SPACE` that the search varies (those the user did not set)."""
    return [name for name in SPACE if name not in given]


def suggest(trial, base, fields):
    """The trial's ``Config``: `base` with the `fields` of `SPACE` drawn by `trial` (the HSTU
    head width follows ``d_model``, one head)."""
    values = {}
    for name in fields:
        kind, *args = SPACE[name]
        if kind == "float_log":
            values[name] = trial.suggest_float(name, args[0], args[1], log=True)
        elif kind == "float":
            values[name] = trial.suggest_float(name, args[0], args[1])
        elif kind == "int":
            values[name] = trial.suggest_int(name, args[0], args[1])
        else:
            values[name] = trial.suggest_categorical(name, list(args[0]))
    if "d_model" in values:
        values["head_dim"] = values["d_model"] // base.num_heads
    return dataclasses.replace(base, **values)


def defaults_of(base, fields):
    """The trial parameters that give `base` itself (the first trial)."""
    params = {}
    for name in fields:
        value = getattr(base, name)
        kind, *args = SPACE[name]
        if kind == "categorical" and value not in args[0]:
            raise TuneError(f"the default {name} {value!r} is outside the search space "
                            f"{args[0]}: set it with its flag")
        params[name] = value
    return params


def estimate_seconds(dataset, base, probe_steps=30, train=None):
    """The seconds a trial of `base` takes at least: a probe of `probe_steps` steps gives the
    time of a step and of a validation; a trial runs at least ``min_steps`` steps and then
    ``patience`` validations of ``eval_every`` steps."""
    from recops_tf import recommender as rec

    train = train or rec.train
    probe = dataclasses.replace(base, max_steps=probe_steps, epochs=0, eval_every=probe_steps,
                                patience=0, min_steps=0, refit_epochs=0)
    result = train(dataset, probe, progress=False, log=lambda *a: None)
    per_step = (result.train_seconds - result.first_step_seconds) / max(result.steps - 1, 1)
    steps_per_epoch = math.ceil(dataset.num_users / base.batch_size)
    every = base.eval_every or steps_per_epoch
    steps = max(base.min_steps, every) + base.patience * every
    if base.max_steps:
        steps = min(steps, base.max_steps)
    if base.epochs:
        steps = min(steps, base.epochs * steps_per_epoch)
    validations = math.ceil(steps / every)
    return result.first_step_seconds + per_step * steps + validations * result.validation_seconds


def _open(out_dir, warmup_steps=0):
    optuna = _optuna()
    os.makedirs(out_dir, exist_ok=True)
    storage = f"sqlite:///{os.path.abspath(os.path.join(out_dir, 'study.db'))}"
    sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=5)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=warmup_steps)
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize",
                                sampler=sampler, pruner=pruner, load_if_exists=True)
    return optuna, study


def tune(dataset, base, out_dir, trials=20, budget_minutes=0.0, given=(), log=print,
         train=None):
    """Runs (or resumes) the search in `out_dir` until `trials` trials are complete or the
    budget would be exceeded by one more, and writes ``best.json`` and ``trials.json``.
    Returns the records of the complete trials, best first."""
    from recops_tf import recommender as rec

    train = train or rec.train
    if trials < 1:
        raise TuneError(f"--trials must be at least 1, got {trials}")
    if budget_minutes < 0:
        raise TuneError(f"--budget-minutes must be positive, got {budget_minutes}")
    fields = searched(given)
    first = defaults_of(base, fields)
    optuna, study = _open(out_dir, warmup_steps=base.min_steps // 4)
    state = optuna.trial.TrialState
    ran = (state.COMPLETE, state.PRUNED)
    meta = {"data": dataset.source, "base": dataclasses.asdict(base), "fields": fields}
    saved = study.user_attrs.get("meta")
    if saved is not None and saved != meta:
        raise TuneError(f"{out_dir} holds a search of other data or settings; give a new --out")
    study.set_user_attr("meta", meta)
    for stale in study.get_trials(deepcopy=False, states=(state.RUNNING,)):
        study.tell(stale.number, state=state.FAIL)  # a killed run's trial: run again below
        log(f"trial {stale.number} was cut short (killed): it does not count")
    done = study.get_trials(deepcopy=False, states=ran)
    if not any(t.user_attrs.get("defaults") for t in done) and not study.get_trials(
            deepcopy=False, states=(state.WAITING,)):
        study.enqueue_trial(first, user_attrs={"defaults": True})
    metric = base.validation_metric
    budget = budget_minutes * 60.0
    started = time.perf_counter()
    if budget and not done:
        need = estimate_seconds(dataset, base, train=train)
        if need > budget:
            raise TuneError(f"--budget-minutes {budget_minutes:g} is below one trial: the "
                            f"defaults take about {need / 60:.1f} minutes on this data")
    if done:
        log(f"resuming {out_dir}: {len(done)} of {trials} trials complete")
    durations = [t.user_attrs["seconds"] for t in done]
    while len(done) < trials:
        elapsed = time.perf_counter() - started
        if budget and durations and elapsed + max(durations) > budget:
            log(f"budget: {budget_minutes:g} minutes would be exceeded by another trial")
            break
        trial = study.ask()
        config = suggest(trial, base, fields)
        began = time.perf_counter()
        pruned = []

        def report(step, value, trial=trial):
            trial.report(value, step)
            if not trial.user_attrs.get("defaults") and trial.should_prune():
                pruned.append(step)
                return True
            return False

        # A trial is judged on validation: no refit (it would only add time).
        result = train(dataset, dataclasses.replace(config, refit_epochs=0), progress=False,
                       log=lambda *a: None, on_validation=report)
        seconds = time.perf_counter() - began
        value = max(h[metric] for h in result.validation)
        trial.set_user_attr("seconds", seconds)
        trial.set_user_attr("steps", result.steps)
        trial.set_user_attr("best_step", result.best_step)
        if pruned:
            study.tell(trial, state=state.PRUNED)
        else:
            study.tell(trial, value)
        durations.append(seconds)
        done = study.get_trials(deepcopy=False, states=ran)
        best = study.best_trial
        params = ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
        tag = " (the defaults)" if trial.user_attrs.get("defaults") else ""
        outcome = (f"pruned at step {pruned[0]} (valid {metric} {value:.4f})" if pruned else
                   f"valid {metric} {value:.4f}")
        log(f"trial {trial.number}{tag} [{len(done)}/{trials}]: {outcome} in {seconds:.0f} s, "
            f"{result.steps} steps; best {best.value:.4f} (trial {best.number}) | {params}")
    return _report(study, base, fields, metric, out_dir, dataset, log, optuna)


def _short(value):
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _report(study, base, fields, metric, out_dir, dataset, log, optuna):
    state = optuna.trial.TrialState
    if not study.get_trials(deepcopy=False, states=(state.COMPLETE,)):
        raise TuneError("no trial completed")
    ran = study.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED))
    records = sorted(({"trial": t.number, "defaults": bool(t.user_attrs.get("defaults")),
                       "pruned": t.state == state.PRUNED,
                       f"valid {metric}": (t.value if t.state == state.COMPLETE else
                                           max(t.intermediate_values.values())),
                       "steps": t.user_attrs["steps"],
                       "seconds": round(t.user_attrs["seconds"], 1), **t.params}
                      for t in ran), key=lambda r: -r[f"valid {metric}"])
    columns = ["trial", f"valid {metric}", "steps", "seconds"] + fields
    shown = lambda r, c: f"{r[c]:.4f}" if c == f"valid {metric}" else _short(r[c])
    width = {c: max(len(c), *(len(shown(r, c)) for r in records)) for c in columns}
    log("results (best first):")
    log("  " + "  ".join(c.rjust(width[c]) for c in columns))
    for r in records:
        mark = " <- the defaults" if r["defaults"] else " (pruned)" if r["pruned"] else ""
        log("  " + "  ".join(shown(r, c).rjust(width[c]) for c in columns) + mark)
    best = study.best_trial
    config = dataclasses.asdict(suggest(optuna.trial.FixedTrial(best.params), base, fields))
    with open(os.path.join(out_dir, "best.json"), "w") as f:
        json.dump({"config": config, "trial": best.number, f"valid {metric}": best.value,
                   "data": dataset.source}, f, indent=1)
    with open(os.path.join(out_dir, "trials.json"), "w") as f:
        json.dump(records, f, indent=1)
    log(f"best: trial {best.number}, valid {metric} {best.value:.4f}; "
        f"{os.path.join(out_dir, 'best.json')} (recops-tf train --config it)")
    return records


def read_config(path):
    """The ``Config`` fields of a ``best.json`` (or any JSON object of Config fields, at its
    top level or under ``"config"``)."""
    from recops_tf.recommender.training import Config

    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise TuneError(f"--config {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise TuneError(f"--config {path}: not JSON ({e.msg}, line {e.lineno})") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]
    if not isinstance(data, dict):
        raise TuneError(f"--config {path}: expected a JSON object of settings")
    types = {f.name: f.type for f in dataclasses.fields(Config)}
    unknown = sorted(set(data) - set(types))
    if unknown:
        raise TuneError(f"--config {path}: unknown settings {unknown[:5]}")
    data = dict(data)
    if str(data.get("transition_prior")).lower() == "auto":  # as --transition-prior takes it
        from recops_tf.recommender.training import AUTO

        data["transition_prior"] = AUTO
    for name, value in data.items():
        kind = types[name]
        fits = (isinstance(value, bool) if kind is bool else
                isinstance(value, int) and not isinstance(value, bool) if kind is int else
                isinstance(value, (int, float)) and not isinstance(value, bool)
                if kind is float else isinstance(value, kind))
        if value is not None and not fits:
            what = {bool: "true or false", int: "a whole number", float: "a number"}.get(
                kind, "a string")
            raise TuneError(f"--config {path}: {name} must be {what}, got {value!r}")
    return data
