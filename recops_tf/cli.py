"""The `recops-tf` command line (also `python -m recops_tf`):

    recops-tf train [--data PATH] [--out DIR] [--config best.json]   the main job
    recops-tf tune --data PATH --out DIR [--trials N] [--budget-minutes M]
    recops-tf export --model DIR --out DIR2       re-export a trained model's SavedModel
    recops-tf recommend --model DIR --history 1,5,9 [--k 10]
    recops-tf serve --model DIR [--rest-port 8501] [--grpc-port 8500]   TF Serving's APIs
    recops-tf bench [STEM ...] [--out report.md] [--chart speedups.png]
    recops-tf info

This module imports no TensorFlow at module level: the commands import what they need, so
``--help`` and a bad argument answer at once. (The ``recops-tf`` console script runs this
file without importing the ``recops_tf`` package first, whose import loads TensorFlow: see
``_recops_tf_cli.py``.) The defaults ``train --help`` shows are read from the source of
``recops_tf/recommender/training.py`` (``Config`` and ``PRESETS``), not imported and not
copied. TensorFlow's C++ log lines are off unless ``--verbose``.
"""
import argparse
import ast
import dataclasses
import functools
import json
import os
import re
import sys
import textwrap


_COLUMNS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "hr@200", "ndcg@200", "mrr")
_RECOMMENDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recommender")


class UsageError(Exception):
    """A bad command-line input: `main` reports it as one line and returns exit status 2."""


# --- defaults, read from the recommender's source without importing it -----------------------

def _evaluate(node, names):
    """The value of a literal expression: constants, tuples, lists, dicts, ``dict(k=...)``,
    negative numbers and names of earlier module constants."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        values = [_evaluate(e, names) for e in node.elts]
        return tuple(values) if isinstance(node, ast.Tuple) else values
    if isinstance(node, ast.Dict):
        return {_evaluate(k, names): _evaluate(v, names) for k, v in zip(node.keys, node.values)}
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict"
            and not node.args):
        return {kw.arg: _evaluate(kw.value, names) for kw in node.keywords}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, names)
    raise ValueError(f"not a literal: {ast.unparse(node)}")


@functools.lru_cache(maxsize=None)
def _module(name):
    """Module-level literal constants, class field defaults and function defaults of
    ``recops_tf/recommender/<name>.py``: ``{"NAME": value, "Class": {field: default},
    "function": {argument: default}}``."""
    with open(os.path.join(_RECOMMENDER, name + ".py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = {}

    def literals(pairs):  # the pairs whose value is a literal
        found = {}
        for key, node in pairs:
            try:
                found[key] = _evaluate(node, names)
            except ValueError:
                pass
        return found

    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name):
                names.update(literals([(target.id, value)]))
            elif (isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                  and all(isinstance(t, ast.Name) for t in target.elts)):  # A, B = 1, 2
                names.update(literals((t.id, v) for t, v in zip(target.elts, value.elts)))
        elif isinstance(node, ast.ClassDef):
            names[node.name] = literals(
                (item.target.id, item.value) for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                and item.value is not None)
        elif isinstance(node, ast.FunctionDef):
            arguments = node.args.args[len(node.args.args) - len(node.args.defaults):]
            names[node.name] = literals(
                [(a.arg, d) for a, d in zip(arguments, node.args.defaults)] +
                [(a.arg, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d])
    return names


def preset_defaults():
    """``{preset: {Config field: value}}``: what ``Config.from_preset(preset)`` fills in, read
    from training.py's source (``Config``'s field defaults updated by ``PRESETS``)."""
    training = _module("training")
    base = training["Config"]
    return {name: {**base, **values, "preset": name}
            for name, values in training["PRESETS"].items()}


# Options of `train` that override a Config field: dest -> (field, kind). Kinds: "value" (None
# when not given), "off" (a --no-X store_true switching the field off) and "on" (a store_true
# switching it on).
CONFIG_OPTIONS = {
    "preset": ("preset", "value"), "encoder": ("encoder", "value"),
    "d_model": ("d_model", "value"),
    "blocks": ("num_blocks", "value"), "heads": ("num_heads", "value"),
    "head_dim": ("head_dim", "value"), "max_seq_len": ("max_seq_len", "value"),
    "dropout": ("dropout_rate", "value"), "temperature": ("temperature", "value"),
    "no_l2_norm": ("l2_norm", "off"), "no_relative_bias": ("relative_bias", "off"),
    "seen_bias": ("seen_bias", "value"),
    "no_share_embeddings": ("share_embeddings", "off"),
    "loss": ("loss", "value"), "negatives": ("num_negatives", "value"),
    "negatives_per": ("negatives_per", "value"),
    "label_smoothing": ("label_smoothing", "value"), "gbce_t": ("gbce_t", "value"),
    "no_fused": ("use_fused", "off"), "precision": ("precision", "value"),
    "epochs": ("epochs", "value"), "batch_size": ("batch_size", "value"),
    "learning_rate": ("learning_rate", "value"), "patience": ("patience", "value"),
    "weight_decay": ("weight_decay", "value"), "weight_average": ("weight_average", "value"),
    "refit_epochs": ("refit_epochs", "value"),
    "transition_prior": ("transition_prior", "value"),
    "lr_schedule": ("lr_schedule", "value"), "warmup_steps": ("warmup_steps", "value"),
    "validation_metric": ("validation_metric", "value"), "exclude_seen": ("exclude_seen", "on"),
    "bucket_by_length": ("bucket_by_length", "on"), "seed": ("seed", "value"),
    "max_steps": ("max_steps", "value"), "checkpoint_every": ("checkpoint_every", "value"),
    "eval_every": ("eval_every", "value"), "min_steps": ("min_steps", "value"),
}


def _shown(value):
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


def config_default_text(field, kind="value"):
    """The default of a Config field as --help shows it: the default preset's value, then the
    presets that differ, e.g. ``default: 2; --preset hstu-large: 8``. An on/off field that a
    --no-X flag switches off is named: ``default: relative_bias on; --preset sasrec: off``."""
    presets = preset_defaults()
    default = _module("training")["Config"]["preset"]
    if field == "preset":
        return f"default: {default}"
    value = presets[default][field]
    fitted = default == "auto" and field in _module("profile")["FITTED"]
    others = [f"--preset {name}: {_shown(v[field])}" for name, v in presets.items()
              if (fitted and name != default) or (not fitted and v[field] != value)]
    named = f"{field} " if kind == "off" else ""
    shown = "fitted to the data" if fitted else f"{named}{_shown(value)}"
    return "; ".join([f"default: {shown}"] + others)


def _add_defaults(parser):
    """Appends its default to each option's help that does not show one yet: an option's own
    default, or (options left unset fall back to the preset) the preset's value."""
    for action in parser._actions:
        if (action.help in (None, argparse.SUPPRESS) or "default" in action.help
                or isinstance(action, argparse._HelpAction)):
            continue
        if action.default is not None and action.default is not False:
            action.help += " (default: %(default)s)"
        elif action.dest in CONFIG_OPTIONS:
            action.help += f" ({config_default_text(*CONFIG_OPTIONS[action.dest])})"


def _whole(text, least):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def _transition_prior(text):
    """``--transition-prior``: "auto" (chosen on the validation split) or a weight >= 0."""
    if text.strip().lower() == "auto":
        return _module("training")["AUTO"]
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number >= 0, got "
                                         f"{text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or >= 0, got {text!r}")
    return value


def _positive_int(text):
    return _whole(text, 1)


def _nonnegative_int(text):
    return _whole(text, 0)


class _Formatter(argparse.HelpFormatter):
    def _split_lines(self, text, width):  # keeps "hstu-large" on one line
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """Errors as one line (`recops-tf train: error: ... (see --help)`), exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# --- the commands -----------------------------------------------------------------------------

def _quiet_tensorflow(verbose):
    """Keeps TensorFlow's C++ log lines (oneDNN, CPU features, ...) off unless --verbose or
    TF_CPP_MIN_LOG_LEVEL says otherwise; effective before TensorFlow's first import.

    Some lines ignore TF_CPP_MIN_LOG_LEVEL: those logged while TensorFlow loads, before its
    logging is set up (on an AVX-512 CPU, the notice that oneDNN's custom operations are on,
    at every start). TensorFlow is therefore imported here with the process's stderr on
    /dev/null; a failing import still raises, and its traceback is printed as usual."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if os.environ["TF_CPP_MIN_LOG_LEVEL"] in ("0", "1") or "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


# The baselines' rows of train's report (evaluation.baselines' names): the chain and the
# popularity a user would deploy (fitted on every event before the test item), the strong
# item-to-item baseline, and the chain of the training parts only.
_BASELINE_ROWS = (("markov", "markov"), ("sequential_rules", "seq-rules"),
                  ("popularity", "popularity"), ("markov_train", "markov-train"))


def _table(rows):
    """Rows of (name, metrics) as an aligned text table."""
    width = max([12] + [len(name) for name, _ in rows])
    head = f"  {'method':<{width}}" + "".join(f"{c:>10}" for c in _COLUMNS)
    lines = [head] + [f"  {name:<{width}}" + "".join(f"{m[c]:>10.4f}" for c in _COLUMNS)
                      for name, m in rows]
    return "\n".join(lines)


def _load_data(args):
    from recops_tf import recommender as rec

    if args.data:
        return rec.load(args.data, format=args.format, user_col=args.user_col,
                        item_col=args.item_col, time_col=args.time_col,
                        min_interactions=args.min_interactions)
    return rec.synthetic(num_users=args.users, num_items=args.items, seed=args.data_seed)


def _config(args):
    """The Config the flags ask for, and the names of the fields they set (besides the
    preset)."""
    from recops_tf import recommender as rec
    from recops_tf.recommender import tuning

    overrides = {}
    if getattr(args, "config", None):  # a file's settings; a flag given beside it wins
        try:
            overrides.update(tuning.read_config(args.config))
        except tuning.TuneError as e:
            raise UsageError(e) from None
    for dest, (field, kind) in CONFIG_OPTIONS.items():
        value = getattr(args, dest, None)  # (tune has no --checkpoint-every)
        if kind == "off":
            value = False if value else None
        elif kind == "on":
            value = True if value else None
        if value is not None or field not in overrides:
            overrides[field] = value
    given = {field for field, value in overrides.items() if value is not None} - {"preset"}
    preset = overrides.pop("preset") or _module("training")["Config"]["preset"]
    return rec.Config.from_preset(preset, **overrides).check(), given


def _prior_text(weight):
    if weight == _module("training")["AUTO"]:
        return ", a transition prior (its weight chosen on validation after training)"
    return f", a transition prior of weight {weight:g}" if weight else ""


def _fitted_config(args, dataset):
    """`_config` with, under ``--preset auto``, the settings the flags leave open fitted to
    `dataset` (recommender/profile.py); prints the data profile and each choice with its reason.
    Returns (config, the run.json record of the profile and the choices)."""
    from recops_tf.recommender import profile as prof

    config, given = _config(args)
    if config.preset != "auto":
        return config, {}, given
    found = prof.profile(dataset)
    print("data profile:")
    for line in found.lines():
        print(f"  {line}")
    config, reasons = prof.fit(found, config, given)
    config = config.check()
    if reasons:
        print("settings fitted to the data (--preset auto; each flag overrides its own):")
    else:
        print("settings: every one given (flags, --config): nothing fitted")
    for field, reason in reasons.items():
        print(f"  {field} = {getattr(config, field)}: {reason}")
    return config, {"profile": found.to_json(),
                    "fitted": {f: {"value": getattr(config, f), "reason": r}
                               for f, r in reasons.items()}}, given


def _multiworker():
    """``recops_tf/recommender/multiworker.py``, loaded from its file unless the package is
    imported already: the launcher of ``--workers N`` imports no TensorFlow."""
    if "recops_tf" in sys.modules:
        from recops_tf.recommender import multiworker

        return multiworker
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_recops_tf_multiworker", os.path.join(_RECOMMENDER, "multiworker.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Flags of `train` that --task ranking reads (besides the data's and the output's).
_RANKING_FIELDS = {"d_model": "d_model", "blocks": "num_blocks", "heads": "num_heads",
                   "head_dim": "head_dim", "max_seq_len": "max_seq_len",
                   "dropout": "dropout_rate", "batch_size": "batch_size",
                   "learning_rate": "learning_rate", "patience": "patience",
                   "eval_every": "eval_every", "min_steps": "min_steps",
                   "max_steps": "max_steps", "seed": "seed"}


_RANKING_ONLY = ("rating_col", "user_features", "like_threshold", "holdout", "targets",
                 "negative_ratio", "task_weights", "baselines", "next_item_weight",
                 "validation_tasks")


def _train_ranking(args, argv):
    """``train --task ranking``: the HSTU ranker and its baselines (recommender/ranking.py)."""
    if not args.data:
        raise UsageError("--task ranking needs --data: an interaction file with ratings "
                         "(MovieLens, or a CSV with a rating column)")
    ignored = [f"--{dest.replace('_', '-')}" for dest in CONFIG_OPTIONS
               if dest not in _RANKING_FIELDS and getattr(args, dest, None)]
    ignored += [flag for flag, bad in (("--workers", args.workers != 1),
                                       ("--resume", args.resume),
                                       ("--config", getattr(args, "config", None)),
                                       ("--logdir", args.logdir)) if bad]
    if ignored:
        raise UsageError(f"{', '.join(ignored)}: not an option of --task ranking")
    from recops_tf import recommender as rec
    from recops_tf.recommender import ranking, ranking_data

    try:
        fields = {field: getattr(args, dest) for dest, field in _RANKING_FIELDS.items()
                  if getattr(args, dest, None) is not None}
        fields.update({name: getattr(args, name) for name in ("like_threshold", "holdout",
                                                              "targets", "negative_ratio",
                                                              "next_item_weight")
                       if getattr(args, name) is not None})
        if args.validation_tasks is not None:
            fields["validation_tasks"] = tuple(t.strip() for t in
                                               args.validation_tasks.split(",") if t.strip())
        if args.task_weights is not None:
            fields["task_weights"] = ranking.parse_task_weights(args.task_weights)
        config = ranking.RankingConfig(**fields).check()
        weights = config.task_weights
        baselines = [b.strip() for b in (args.baselines or "dlrm,two-tower").split(",")
                     if b.strip() and b.strip() != "none"]
        unknown = set(baselines) - {"dlrm", "two-tower"}
        if unknown:
            raise ValueError(f"--baselines: unknown {sorted(unknown)}; the baselines are dlrm "
                             f"and two-tower (or none)")
        dataset = rec.load(args.data, format=args.format, user_col=args.user_col,
                           item_col=args.item_col, time_col=args.time_col,
                           min_interactions=args.min_interactions, ratings=True,
                           rating_col=args.rating_col)
        features = args.user_features or ranking_data.user_features_file(args.data)
        data = ranking_data.from_dataset(dataset, config.like_threshold, config.holdout,
                                         features, args.user_col)
    except (rec.DataError, ValueError) as e:
        raise UsageError(e) from None
    print(f"data: {data.source}: {data.num_users} users, {data.num_items} items, "
          f"{sum(len(h) for h in data.items)} events; actions: ratings "
          f"{', '.join(f'{v:g}' for v in data.action_values)} (liked: >= "
          f"{data.like_threshold:g}); context: {', '.join(data.context_names)}"
          f"{f' ({features})' if features else ''}")
    print(f"split: the last {config.holdout} events of each user (fewer for short histories) "
          f"are the test candidates, the {config.holdout} before them the validation ones; "
          f"{config.negative_ratio} sampled item(s) per real candidate")
    print(f"model: HSTU ranker, {config.num_blocks} blocks x {config.num_heads} heads x "
          f"{config.head_dim}, d_model {config.d_model}, {config.max_seq_len} events of "
          f"history; tasks {', '.join(f'{t} x{w:g}' for t, w in weights.items())}")
    # --max-steps bounds every model of the run, the two-tower's retrieval HSTU too.
    retrieval = {"max_steps": args.max_steps} if args.max_steps is not None else None
    model, report = ranking.run(data, config, baselines=baselines,
                                progress=not args.no_progress, retrieval_overrides=retrieval)
    print(f"test: {report['data']['test_events']} held-out events of {data.num_users} users "
          f"(+ {config.negative_ratio} sampled per event for watch):")
    print(ranking.table(report))
    report["argv"] = list(argv)
    if args.out:
        path = ranking.export(model, data, args.out, report)
        print(f"exported: {path} (SavedModel: serving_default and rank)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


# --- `train --resume DIR`: the run's own flags, and those given beside --resume -----------------

# The flags of `train` that change nothing the run trains (weights, steps, metrics), only what
# it writes or shows or how its processes wait: given beside --resume they apply to the
# resumed run; not given, the run's own apply (its run.json "argv"; --no-progress and --verbose
# are never saved). Every other flag given beside --resume is a training flag and must equal
# the checkpoint's value, or the resume is refused: the model and training flags (compared
# with run.json's "config", the settings the run trained with, fitted ones included), the
# data's (--data, --format, --user-col, --item-col, --time-col, --min-interactions, --users,
# --items, --data-seed: the checkpoint is of its data), --config and --task (compared with
# the run's argv), --workers (compared with the checkpoints' worker count) and --out (the
# run's directory).
RESUME_OUTPUT_FLAGS = ("json", "logdir", "no_progress", "verbose", "checkpoint_every",
                       "worker_timeout")
_RESUME_PATHS = ("data", "config")  # compared as the files they name


def _given(argv):
    """``{dest: value}`` of the options of `train` that ARGV (its arguments after ``train``)
    gives, whatever their value (argparse's defaults suppressed, abbreviations resolved)."""
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices["train"]._actions:
        action.default = argparse.SUPPRESS
    given = vars(parser.parse_args(["train", *argv]))
    given.pop("command", None)
    return given


def _value_text(field, value):
    if field == "transition_prior" and value == _module("training")["AUTO"]:
        return "auto"
    return "(not given)" if value is None else str(_shown(value))


def _refuse_differing(dest, value, run_dir, saved, config):
    """UsageError if the training flag `dest`, given as `value` beside ``--resume run_dir``,
    differs from the checkpoint's: `config` (run.json's "config"), else `saved` (the run's
    parsed argv)."""
    flag = f"--{dest.replace('_', '-')}"
    field, kind = CONFIG_OPTIONS.get(dest, (dest, "value"))
    if dest == "out":
        if os.path.realpath(value) == os.path.realpath(run_dir):
            return
        raise UsageError(f"--out {value}: a resumed run writes to its own directory, "
                         f"{run_dir} (--resume)")
    if dest == "workers":  # the checkpoints' count: workers.json, or 1 when there is none
        path = os.path.join(run_dir, "checkpoints", "workers.json")
        try:
            with open(path) as f:
                theirs = json.load(f)["workers"]
        except FileNotFoundError:
            theirs = 1
        except (OSError, ValueError, KeyError, TypeError):
            return  # the training names what is wrong with it
        if value == theirs:
            return
        raise UsageError(f"--workers {value} differs from the checkpoint's {theirs} (its "
                         f"checkpoints are of {theirs} worker(s)); resume with as many")
    switch = kind in ("off", "on")  # a store_true flag: named alone
    if dest in CONFIG_OPTIONS and field in config:
        same = {"off": False, "on": True}.get(kind, value) == config[field]
        theirs = f"{field} {_value_text(field, config[field])}" if switch else _value_text(
            field, config[field])
    else:  # not a setting of the model or its training (or a run.json of before "config")
        theirs = getattr(saved, dest, None)
        if dest in _RESUME_PATHS and theirs is not None:
            same = os.path.realpath(value) == os.path.realpath(theirs)
        else:
            same = value == theirs
        theirs = ("(given)" if theirs else "(not given)") if switch else _value_text(field,
                                                                                      theirs)
    if not same:
        given = flag if switch else f"{flag} {_value_text(field, value)}"
        raise UsageError(f"{given} differs from the checkpoint's {theirs}; resume with the "
                         f"checkpoint's flags or start a new run")


def _resumed(args, argv):
    """The arguments of the run ``--resume DIR`` continues: its run.json's argv, with the
    output flags given beside --resume (`RESUME_OUTPUT_FLAGS`) replacing its own; UsageError
    on a training flag given with another value than the checkpoint's."""
    run_dir = args.resume
    path = os.path.join(run_dir, "run.json")
    if not os.path.exists(path):
        raise UsageError(f"{run_dir}: not a run directory of `recops-tf train --out` (no "
                         f"run.json)")
    try:
        with open(path) as f:
            record = json.load(f)
        saved_argv = [str(a) for a in record["argv"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    saved = _parser().parse_args(["train", *saved_argv])
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    for dest, value in _given(argv).items():
        if dest in RESUME_OUTPUT_FLAGS:
            setattr(saved, dest, value)
        elif dest != "resume":
            _refuse_differing(dest, value, run_dir, saved, config)
    saved.out = saved.resume = run_dir
    return saved


def _update_record(out, **fields):
    """Sets `fields` in OUT/run.json, replaced whole (a kill mid-write leaves the old file: the
    run stays resumable)."""
    path = os.path.join(out, "run.json")
    record = {}
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
    record.update(fields)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)
    return record


def _train(args, argv):
    if args.task == "ranking":
        return _train_ranking(args, argv)
    given = [f"--{n.replace('_', '-')}" for n in _RANKING_ONLY if getattr(args, n) is not None]
    if given:
        raise UsageError(f"{', '.join(given)}: an option of --task ranking")
    if args.resume:  # before any worker starts: a refused flag is one line, of this process
        args = _resumed(args, argv)
    multiworker = _multiworker()

    if args.workers < 1:
        raise UsageError(f"--workers {args.workers}: at least 1")
    if not args.worker_timeout > 0:
        raise UsageError(f"--worker-timeout {args.worker_timeout}: seconds, more than 0")
    group = None
    if os.environ.get("TF_CONFIG"):  # one worker of a cluster (ours, or a user's TF_CONFIG)
        from recops_tf.recommender import multiworker  # the module training.py beats

        try:
            group = multiworker.cluster_group(args.worker_timeout)
        except (ValueError, KeyError) as e:
            raise UsageError(f"TF_CONFIG: {e}") from None
        if group is not None and args.workers > 1 and args.workers != group.world_size:
            raise UsageError(f"--workers {args.workers}, but TF_CONFIG names "
                             f"{group.world_size} workers")
    elif args.workers > 1:
        return multiworker.launch(argv, args.workers)
    chief = group is None or group.rank == 0
    from recops_tf import recommender as rec

    resume = bool(args.resume)
    try:
        dataset = _load_data(args)
        _config(args)  # flags checked before the data is profiled
        lengths = [len(h) for h in dataset.items]
        print(f"data: {dataset.source}: {dataset.num_users} users, {dataset.num_items} items, "
              f"{sum(lengths)} interactions (history length {min(lengths)}-{max(lengths)})")
        config, fitted, _ = _fitted_config(args, dataset)
    except (rec.DataError, ValueError) as e:
        raise UsageError(e) from None
    kind = "fused ops" if config.use_fused else "stock TF (--no-fused)"
    if config.precision != "f32":
        kind += f", {config.precision} (mixed precision)"
    negatives = ("full softmax" if config.loss == "full" else
                 f"{'gBCE' if config.loss == 'gbce' else config.loss + ' softmax'}, "
                 f"{config.num_negatives} negatives per {config.negatives_per}")
    if config.label_smoothing and config.loss != "gbce":
        negatives += f", label smoothing {config.label_smoothing:g}"
    print(f"model: --preset {config.preset}: {config.encoder}, {config.num_blocks} blocks x "
          f"{config.num_heads} heads x {config.head_dim}, d_model {config.d_model}, "
          f"{config.max_seq_len} items of history, {negatives}, temperature "
          f"{config.temperature}{'' if config.l2_norm else ' (no l2 norm)'}"
          f"{', seen-item bias' if config.seen_bias else ''}"
          f"{_prior_text(config.transition_prior)}, {kind}")
    schedule = (f", {config.warmup_steps} warm-up steps" if config.warmup_steps else "") + (
        ", cosine decay" if config.lr_schedule == "cosine" else "")
    averaged = (f"; validated on an average of the weights (decay {config.weight_average:g})"
                if config.weight_average else "")
    print(f"optimizer: {'LazyAdam' if config.use_fused else 'Adam'} at learning rate "
          f"{config.learning_rate:g}{schedule}"
          f"{f', weight decay {config.weight_decay:g}' if config.weight_decay else ''}, "
          f"batch {config.batch_size}{averaged}")
    checkpoint_dir = None
    logdir = args.logdir or (os.path.join(args.out, "logs") if args.out else None)
    logdir = None if logdir == "none" else logdir
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        checkpoint_dir = os.path.join(args.out, "checkpoints")
        saved_argv = [a for a in argv if a not in ("--no-progress", "--verbose")]
        if resume and chief:  # the resumes' own argv: the output flags they gave
            with open(os.path.join(args.out, "run.json")) as f:
                resumes = json.load(f).get("resumes", [])
            _update_record(args.out, resumes=resumes + [saved_argv])
        elif chief:
            with open(os.path.join(args.out, "run.json"), "w") as f:
                json.dump({"argv": saved_argv, "config": dataclasses.asdict(config), **fitted},
                          f, indent=1)
    import tensorflow as tf

    try:
        result = rec.train(dataset, config, checkpoint_dir=checkpoint_dir, resume=resume,
                           logdir=logdir if chief else None,
                           progress=not args.no_progress and group is None,
                           log=print if chief else (lambda *a, **k: None), group=group)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(e) from None
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
            tf.errors.AbortedError, tf.errors.CancelledError) as e:
        if group is None:
            raise
        # A peer died or hung: one line (the launcher names the worker that failed first).
        reason = e.message.strip().splitlines()[0] if e.message else type(e).__name__
        print(f"recops-tf train: error: worker {group.rank}: the group failed "
              f"({type(e).__name__}: {reason[:200]})", file=sys.stderr)
        return 1
    model = result.model
    if group is not None:  # the whole item table, gathered from the shards (every worker)
        model = multiworker.unsharded(result.model, config, dataset.num_items, group)
        multiworker.stop_watchdog()
        if not chief:
            return 0
    seconds = result.train_seconds
    print(f"trained {result.steps} steps ({result.epochs} epochs) in {seconds:.1f} s "
          f"({result.steps / max(seconds, 1e-9):.2f} steps/s), loss {result.first_loss:.3f} -> "
          f"{result.last_loss:.3f}; best validation {config.validation_metric} at step "
          f"{result.best_step} (epoch {result.best_epoch})")
    prior = result.transition_prior
    if prior.get("validation"):
        tried = ", ".join(f"{float(w):g}: {v:.4f}" for w, v in prior["validation"].items())
        print(f"transition prior: weight {prior['value']:g}, the best validation "
              f"{config.validation_metric} of {tried}")
    elif prior:
        print(f"transition prior: weight {prior['value']:g} (--transition-prior)")
    if prior.get("rules"):
        rules = prior["rules"]
        print(f"  its rules (the sequential-rules baseline's choice on validation): window "
              f"{rules['window']}, the last {rules['depth']} items, decay {rules['decay']:g}; "
              f"counting every event before the test item (the export: every event)")
    if "test_without" in prior:
        alone = prior["test_without"]
        print(f"  the encoder alone (weight 0) on the test split: HR@10 {alone['hr@10']:.4f}, "
              f"NDCG@10 {alone['ndcg@10']:.4f} "
              f"({'seen items excluded' if config.exclude_seen else 'seen items kept'})")
    if result.test_train_only is not None:
        before, after = result.test_train_only, result.test
        print(f"refit ({config.refit_epochs} epochs on every event before the test item, "
              f"{result.refit_seconds:.1f} s): test HR@10 {before['hr@10']:.4f} -> "
              f"{after['hr@10']:.4f}, NDCG@10 {before['ndcg@10']:.4f} -> "
              f"{after['ndcg@10']:.4f} (the kept weights -> refitted; "
              f"{'seen items excluded' if config.exclude_seen else 'seen items kept'}); "
              f"the figures below and the export are the refitted model's")
    seen = {True: "seen items excluded (--exclude-seen)", False: "seen items kept"}
    for exclude, model_m, base in ((config.exclude_seen, result.test, result.baselines),
                                   (not config.exclude_seen, result.test_other,
                                    result.baselines_other)):
        print(f"test: last item of {dataset.num_users} users, ranking all "
              f"{dataset.num_items} items, {seen[exclude]}:")
        print(_table([(config.preset, model_m)] + [
            (label, base[name]) for name, label in _BASELINE_ROWS if name in base]))
    for name, label in _BASELINE_ROWS[:2]:
        if name in result.baselines:
            ratio = [result.test[m] / max(result.baselines[name][m], 1e-12)
                     for m in ("hr@10", "ndcg@10")]
            print(f"{config.preset} / {label}: {ratio[0]:.2f}x HR@10, {ratio[1]:.2f}x NDCG@10 "
                  f"({seen[config.exclude_seen]})")
    metrics = {"exclude_seen": config.exclude_seen, "test": result.test,
               "test_other_protocol": result.test_other, "baselines": result.baselines,
               "baselines_other_protocol": result.baselines_other,
               "train_seconds": seconds, "steps": result.steps, "epochs": result.epochs,
               "first_step_seconds": result.first_step_seconds,
               "steps_per_epoch": result.steps_per_epoch,
               "best_epoch": result.best_epoch, "best_step": result.best_step,
               "first_loss": result.first_loss,
               "last_loss": result.last_loss, "validation": result.validation,
               "transition_prior": result.transition_prior,
               "test_train_only": result.test_train_only,
               "refit_seconds": result.refit_seconds,
               "config": dataclasses.asdict(config), "data": dataset.source, **fitted}
    if args.json:  # first: an export that fails loses no figures of a long run
        with open(args.json, "w") as f:
            json.dump(metrics, f, indent=1)
    if args.out:
        _update_record(args.out, metrics=metrics)  # a fresh or resumed run's alike
        path = rec.export(model, dataset, args.out, metrics)
        print(f"exported: {path} (SavedModel), {os.path.join(args.out, 'model.keras')}")
        from recops_tf.recommender import curves

        if curves.write(args.out, metrics, logdir):
            print(f"curves: {os.path.join(args.out, curves.NAME)}"
                  + (f"; TensorBoard logs: {logdir}" if logdir else ""))
    return 0


def _tune(args):
    from recops_tf import recommender as rec
    from recops_tf.recommender import tuning

    if not args.data:
        raise UsageError("--data is required: the interaction file to tune on")
    if args.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {args.trials}")
    if args.budget_minutes < 0:
        raise UsageError(f"--budget-minutes must be positive, got {args.budget_minutes:g}")
    try:
        dataset = _load_data(args)
        _config(args)
        print(f"data: {dataset.source}: {dataset.num_users} users, {dataset.num_items} items")
        config, _, given = _fitted_config(args, dataset)
        fields = tuning.searched(given)
        print(f"searching {', '.join(fields) or 'nothing (every setting given)'} for the best "
              f"validation {config.validation_metric}, {args.trials} trials"
              f"{f' within {args.budget_minutes:g} minutes' if args.budget_minutes else ''}; "
              f"the first is the defaults")
        tuning.tune(dataset, config, args.out, trials=args.trials,
                    budget_minutes=args.budget_minutes, given=given)
    except (rec.DataError, ValueError) as e:  # TuneError is a ValueError
        raise UsageError(e) from None
    return 0


def _catalogue(model_dir, needs=("items.txt", "saved_model")):
    """The item names of a model directory written by `train --out`; UsageError if it is not
    one."""
    missing = [n for n in needs if not os.path.exists(os.path.join(model_dir, n))]
    if missing:
        raise UsageError(f"--model {model_dir}: not a model directory written by "
                         f"`recops-tf train --out` (missing: {', '.join(missing)})")
    with open(os.path.join(model_dir, "items.txt")) as f:
        return [line.rstrip("\n") for line in f]


def _export(args):
    names = _catalogue(args.model, ("model.keras", "items.txt", "info.json"))
    import keras

    from recops_tf import recommender as rec

    model = keras.models.load_model(os.path.join(args.model, "model.keras"))
    with open(os.path.join(args.model, "info.json")) as f:
        info = json.load(f)
    dataset = rec.Dataset([], [], len(names), info.get("source", "?"), item_names=names)
    print(f"exported: {rec.export(model, dataset, args.out, info.get('metrics'))}")
    return 0


def _recommend_inputs(args):
    """(history, timestamps, k, catalogue size) from the arguments; UsageError if bad."""
    names = _catalogue(args.model)
    history = [h.strip() for h in args.history.split(",") if h.strip()]
    if not history:
        raise UsageError(f"--history {args.history!r}: no item ids (give them comma-separated, "
                         f"e.g. --history 1,5,9)")
    timestamps = None
    if args.timestamps:
        parts = [t.strip() for t in args.timestamps.split(",") if t.strip()]
        try:
            timestamps = [int(t) for t in parts]
        except ValueError:
            raise UsageError(f"--timestamps {args.timestamps!r}: expected whole seconds, "
                             f"comma-separated") from None
        if len(timestamps) != len(history):
            raise UsageError(f"--timestamps has {len(timestamps)} values and --history "
                             f"{len(history)} items: give one timestamp per item")
    return history, timestamps, min(args.k, len(names)), len(names)


def _recommend(args):
    history, timestamps, k, num_items = _recommend_inputs(args)
    if k < args.k:
        print(f"recops-tf: note: --k {args.k} is more than the catalogue's {num_items} items: "
              f"showing all {num_items}", file=sys.stderr)
    from recops_tf import recommender as rec

    try:
        items, scores = rec.recommend(args.model, history, timestamps, k)
    except ValueError as e:  # items not in the catalogue
        raise UsageError(e) from None
    rank_width = len(str(len(items)))
    item_width = max([len("item")] + [len(str(i)) for i in items])
    print(f"{'rank':>{max(rank_width, 4)}}  {'item':<{item_width}}  {'score':>8}")
    for rank, (item, score) in enumerate(zip(items, scores), 1):
        print(f"{rank:>{max(rank_width, 4)}}  {item:<{item_width}}  {score:8.4f}")
    return 0


def _serve(args):
    if not os.path.isdir(args.model):
        raise UsageError(f"--model {args.model}: no such directory")
    for flag in ("rest_port", "grpc_port"):
        if not -1 <= getattr(args, flag) <= 65535:
            raise UsageError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: a port is "
                             "0..65535 (0: any free port, -1: off)")
    for flag, value, bound in (("--cache-mb", args.cache_mb, ">= 0"),
                               ("--batch-timeout-micros", args.batch_timeout_micros, ">= 0"),
                               ("--poll-seconds", args.poll_seconds, "> 0"),
                               ("--read-timeout", args.read_timeout, "> 0")):
        if not (value >= 0 if bound == ">= 0" else value > 0):
            raise UsageError(f"{flag} {value}: must be {bound}")
    try:
        from recops_tf import serving
    except ImportError as e:
        raise UsageError(f"{e}: install the serving extra (pip install "
                         "'recops_tf[serve]')") from None
    options = serving.Options(
        model=args.model, model_name=args.model_name, host=args.host,
        rest_port=args.rest_port, grpc_port=args.grpc_port,
        enable_batching=not args.no_batching, max_batch_size=args.max_batch_size,
        batch_timeout_micros=args.batch_timeout_micros,
        num_batch_threads=args.num_batch_threads, cache_bytes=args.cache_mb << 20,
        poll_seconds=args.poll_seconds, max_request_bytes=args.max_request_mb << 20,
        max_request_elements=args.max_request_elements, read_timeout=args.read_timeout,
        intra_op_threads=args.tensorflow_intra_op_parallelism,
        inter_op_threads=args.tensorflow_inter_op_parallelism)
    try:
        running = serving.Running(options)
    except (FileNotFoundError, OSError) as e:
        raise UsageError(e) from None
    running.serve_forever()
    return 0


def _info(args):
    import keras
    import tensorflow as tf

    import recops_tf
    from recops_tf import _loader

    print(f"recops_tf {recops_tf.__version__} ({os.path.dirname(recops_tf.__file__)})")
    print(f"tensorflow {tf.__version__}, keras {keras.__version__}, python "
          f"{sys.version.split()[0]}")
    build = os.path.join(os.path.dirname(recops_tf.__file__), "_build_info.json")
    if os.path.exists(build):
        with open(build) as f:
            for key, value in json.load(f).items():
                print(f"build {key}: {value}")
    print(f"threads: intra-op {tf.config.threading.get_intra_op_parallelism_threads() or 'auto'}"
          f", inter-op {tf.config.threading.get_inter_op_parallelism_threads() or 'auto'}, "
          f"cpus {os.cpu_count()}")
    # The names the ops are registered under: what graphs and SavedModels record.
    ops = _loader.op_names()
    print(f"registered ops ({len(ops)}): {', '.join(ops)}")
    return 0


# --- the parser -------------------------------------------------------------------------------

def _add_run_options(parser, synthetic=True):
    """The data, model and training options of `train` and `tune` (`synthetic`: the
    synthetic set's options); returns the training group."""
    training, data_module = _module("training"), _module("data")
    data = parser.add_argument_group("data")
    data.add_argument("--data", help="an interaction file (MovieLens u.data / ratings.dat / "
                      "ratings.csv, SASRec's 'user item' files, or a CSV with named columns; "
                      "default: the built-in synthetic set)")
    data.add_argument("--format", choices=data_module["FORMATS"],
                      help="the file's format (default: detected from its first line)")
    data.add_argument("--user-col", help="CSV: the user column (default: user)")
    data.add_argument("--item-col", help="CSV: the item column (default: item)")
    data.add_argument("--time-col", help="CSV: the time column (default: timestamp; "
                      "without one, file order is the time)")
    data.add_argument("--min-interactions", type=int,
                      default=data_module["load"]["min_interactions"],
                      help="k-core: drop users and items with fewer than K interactions")
    if synthetic:
        synthetic = _module("synthetic")["synthetic"]
        data.add_argument("--users", type=int, default=synthetic["num_users"],
                          help="synthetic set: users")
        data.add_argument("--items", type=int, default=synthetic["num_items"],
                          help="synthetic set: items")
        data.add_argument("--data-seed", type=int, default=synthetic["seed"],
                          help="synthetic set: its seed")
    model = parser.add_argument_group("model (defaults from --preset)")
    model.add_argument("--preset", choices=tuple(training["PRESETS"]),
                       help="the recipe: auto (the HSTU paper's 2-block model with its loss, "
                       "history, batch and schedule fitted to the data, each choice printed "
                       "with its reason), or exactly the paper's recipe: its 2-block model, "
                       "its 8-block model, or SASRec from stock Keras layers")
    model.add_argument("--encoder", choices=_module("model")["ENCODERS"],
                       help="the sequence encoder (e.g. sasrec under the fitted settings)")
    model.add_argument("--d-model", type=int, help="item embedding width")
    model.add_argument("--blocks", type=int, help="encoder blocks")
    model.add_argument("--heads", type=int, help="attention heads per block")
    model.add_argument("--head-dim", type=int, help="per-head q/k/v width")
    model.add_argument("--max-seq-len", type=int, help="items of history")
    model.add_argument("--dropout", type=float, help="dropout rate")
    model.add_argument("--temperature", type=float, help="of the l2-normalised logits")
    model.add_argument("--no-l2-norm", action="store_true",
                       help="raw dot products instead of l2-normalised ones")
    model.add_argument("--no-relative-bias", action="store_true",
                       help="HSTU without its learned time + position bias")
    model.add_argument("--seen-bias", action=argparse.BooleanOptionalAction, default=None,
                       help="a learned logit bias for items already in the history (a "
                       "repeat-aware head: negative where users rarely repeat, as on "
                       "MovieLens; not in the HSTU paper: --no-seen-bias gives its exact "
                       "recipe)")
    model.add_argument("--no-share-embeddings", action="store_true",
                       help="the retrieval head scores items with a table of its own, not "
                       "the input item table")
    model.add_argument("--loss", choices=_module("model")["LOSSES"],
                       help="sampled softmax over uniform negatives, over the "
                       "batch's own targets, a full softmax over the catalogue, or gSASRec's "
                       "calibrated binary cross-entropy (gBCE) on uniform negatives")
    model.add_argument("--label-smoothing", type=float, help="softmax losses: the label is "
                       "(1 - this) one-hot + this spread evenly over the candidates")
    model.add_argument("--gbce-t", type=float, help="gBCE's calibration t in [0, 1] (0: plain "
                       "binary cross-entropy)")
    model.add_argument("--negatives", type=int, help="negatives per sequence, or per position")
    model.add_argument("--negatives-per", choices=("sequence", "position"),
                       help="one set of negatives per sequence (B x N embeddings a "
                       "step) or per position as generative-recommenders samples (P x N)")
    model.add_argument("--no-fused", action="store_true",
                       help="the same model from stock TF ops (parity and speed baseline)")
    model.add_argument("--precision", choices=tuple(_module("training")["PRECISIONS"]),
                       help="bf16: Keras' mixed_bfloat16 policy (the encoder and its kernels "
                       "in bfloat16, variables and the retrieval head in float32)")
    fit = parser.add_argument_group("training")
    fit.add_argument("--epochs", type=int, help="at most this many epochs, 0: no bound "
                     "(--max-steps bounds)")
    fit.add_argument("--batch-size", type=int, help="histories per step")
    fit.add_argument("--learning-rate", type=float, help="of the Adam / LazyAdam optimizer")
    fit.add_argument("--weight-decay", type=float, help="decoupled weight decay (AdamW's) of "
                     "the encoder's and head's matrices: w -= learning rate x this x w a step; "
                     "not of biases, norms or the item tables")
    fit.add_argument("--weight-average", type=float, metavar="DECAY",
                     help="validate, keep and test an exponential average of the weights "
                     "taken at each validation, this its decay in [0, 1) (0: the raw "
                     "weights); training goes on from the raw weights")
    fit.add_argument("--refit-epochs", type=int, metavar="N",
                     help="once the best step and the prior's weight are chosen on "
                     "validation, train the kept weights N more epochs on every event before "
                     "the test item (the validation items included), then test and export "
                     "them; the report shows the test figures before and after (0: no refit)")
    fit.add_argument("--transition-prior", type=_transition_prior, metavar="auto|W",
                     help="at inference, add W x sum_k decay^k log(1 + n(h[-1-k], j)) to item "
                     "j's score over the history's last items h[-1], h[-2], ..., n counting "
                     "how often j came within a window of steps after them (sequential rules' "
                     "evidence beside the encoder's; window, depth and decay the "
                     "sequential-rules baseline's choice on validation; n counts the events "
                     "known before the target; the encoder is trained without it); auto: W "
                     "among 0, 0.25, 0.5, 1, 2, 4, 8, 16, 32 with the best validation metric, "
                     "chosen after training; 0: none (default: auto; --preset hstu, "
                     "hstu-large, sasrec: 0)")
    fit.add_argument("--lr-schedule", choices=tuple(_module("training")["LR_SCHEDULES"]),
                     help="after the warm-up: constant, or a cosine down to 0.1x by "
                     "--min-steps (held there after)")
    fit.add_argument("--warmup-steps", type=int, help="linear learning-rate warm-up from 0 "
                     "over N steps")
    fit.add_argument("--patience", type=int, help="stop after N validations without a better "
                     "validation metric, 0: never")
    fit.add_argument("--eval-every", type=int, help="validate every N steps, 0: at the end of "
                     "every epoch")
    fit.add_argument("--min-steps", type=int, help="no early stop before N steps")
    fit.add_argument("--validation-metric", help="early-stopping metric: hr@K or ndcg@K (K in "
                     f"{', '.join(str(k) for k in _module('evaluation')['KS'])}) or mrr")
    fit.add_argument("--exclude-seen", action="store_true", help="rank only items the user "
                     "has not interacted with (both protocols are reported)")
    fit.add_argument("--bucket-by-length", action="store_true",
                     help="batch histories of similar length together")
    fit.add_argument("--seed", type=int, help="of the weights, the batch order and the "
                     "negatives")
    fit.add_argument("--max-steps", type=int, help="stop after N steps, 0: all of them")
    return fit


def _version():
    """The package's ``__version__``, read from the source beside this file (no import)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__init__.py")) as f:
        found = re.search(r"^__version__ = ['\"]([^'\"]+)['\"]", f.read(), re.M)
    return found.group(1) if found else "unknown"


def _parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's log messages (default: off)")
    parser = _Parser(prog="recops-tf", description="recops_tf: fused recommendation-model ops "
                     "for TensorFlow")
    parser.add_argument("--version", action="version", version=f"recops_tf {_version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser(
        "train", parents=[common], help="train and evaluate a generative recommender",
        description="Train a sequential recommender (HSTU, its loss, history, batch and "
        "schedule fitted to the data by default) on leave-one-out splits, validate as it "
        "trains, and report the test metrics next to the popularity and Markov-chain "
        "baselines. Every setting can be overridden by its flag.")
    fit = _add_run_options(train)
    fit.add_argument("--config", metavar="FILE", help="settings from a JSON file (the "
                     "best.json of recops-tf tune); a flag given beside it overrides its "
                     "value (default: none)")
    fit.add_argument("--checkpoint-every", type=int,
                     help="with --out, also checkpoint every N steps, 0: only every epoch")
    fit.add_argument("--resume", metavar="DIR", help="continue the run whose --out was DIR "
                     "from its newest checkpoint, with its own flags; beside it, --json, "
                     "--logdir, --no-progress, --checkpoint-every and --worker-timeout apply, "
                     "and any other flag must equal the run's (else: refused) "
                     "(default: a new run)")
    fit.add_argument("--logdir", help="write TensorBoard summaries here; none: no summaries "
                     "(default: OUT/logs with --out, else none)")
    fit.add_argument("--workers", type=int, default=1, help="train with N local worker "
                     "processes (item table sharded, dense weights all-reduced, the same "
                     "global batch); with TF_CONFIG set, this process is one worker of that "
                     "cluster (default: 1)")
    fit.add_argument("--worker-timeout", type=float, default=60.0, help="seconds a worker "
                     "waits for the others in a collective before the job fails (default: 60)")
    rank = train.add_argument_group(
        "ranking (--task ranking: candidates scored per task; docs/ranking.md)")
    rank.add_argument("--task", choices=("retrieval", "ranking"), default="retrieval",
                      help="retrieval: next item over the catalogue; ranking: the HSTU ranker "
                      "of candidates with multi-task heads, beside a DLRM-style and a "
                      "two-tower baseline; the model and training flags then have the "
                      "ranker's defaults: d_model 64, 2 blocks x 2 heads x 32, batch 64 "
                      "(default: retrieval)")
    rank.add_argument("--rating-col", help="CSV: the rating (action) column (default: rating)")
    rank.add_argument("--user-features", metavar="FILE", help="users' contextual features: "
                      "MovieLens u.user / users.dat or a CSV with a user column (default: the "
                      "MovieLens users file beside --data, if any)")
    rank.add_argument("--like-threshold", type=float,
                      help="a rating at or above this is liked (default: 4)")
    rank.add_argument("--holdout", type=int, help="validation and test events "
                      "per user, the last ones (default: 5)")
    rank.add_argument("--targets", type=int, help="training: real candidates "
                      "per user, its next events (default: 10)")
    rank.add_argument("--negative-ratio", type=int, help="sampled candidates per "
                      "real one (default: 1)")
    rank.add_argument("--task-weights",
                      help="the tasks' loss weights (default: watch=1,like=1,rating=1)")
    rank.add_argument("--next-item-weight", type=float, help="the HSTU ranker's auxiliary "
                      "loss: each history event predicts the next item (default: 1)")
    rank.add_argument("--validation-tasks", help="the tasks whose weighted validation loss "
                      "picks the step kept (default: like,rating: the held-out events' own)")
    rank.add_argument("--baselines",
                      help="trained baselines beside the HSTU ranker, comma-separated, or "
                      "none (default: dlrm,two-tower)")
    out = train.add_argument_group("output")
    out.add_argument("--out", help="checkpoints, TensorBoard logs (logs/), then the trained "
                     "model (SavedModel + .keras) and curves.png (loss and validation metric "
                     "by step, the baselines as lines; needs matplotlib) here; --task "
                     "ranking: its SavedModel only (default: not saved)")
    out.add_argument("--json", help="write the metrics here (default: not written)")
    out.add_argument("--no-progress", action="store_true",
                     help="no progress bar (default: a bar with loss, steps/s, validation)")
    _add_defaults(train)
    tune = sub.add_parser(
        "tune", parents=[common], help="search the settings on the validation split",
        description="Search the model's settings (learning rate, dropout, blocks, width, "
        "temperature, batch, seen-item bias) with Optuna on the validation split only; the "
        "first trial is the defaults. Killed, the same command resumes the search. Writes "
        "OUT/best.json for recops-tf train --config. A flag given fixes its setting.")
    _add_run_options(tune, synthetic=False)
    search = tune.add_argument_group("search")
    search.add_argument("--out", required=True, help="the search's directory (its trials, "
                        "best.json)")
    search.add_argument("--trials", type=int, default=20, help="complete trials to run")
    search.add_argument("--budget-minutes", type=float, default=0.0,
                        help="start no trial that would end past this many minutes, 0: no "
                        "budget")
    _add_defaults(tune)
    export = sub.add_parser("export", parents=[common],
                            help="re-export a trained model directory")
    export.add_argument("--model", required=True, help="a directory written by train --out")
    export.add_argument("--out", required=True, help="the new model directory")
    recommend = sub.add_parser("recommend", parents=[common], help="top-k items for a history")
    recommend.add_argument("--model", required=True, help="a directory written by train --out")
    recommend.add_argument("--history", required=True, help="item ids, comma-separated")
    recommend.add_argument("--timestamps", help="seconds, comma-separated, one per history "
                           "item (default: one a day, ending now)")
    recommend.add_argument("--k", type=_positive_int, default=10,
                           help="how many items (at most the catalogue's size)")
    _add_defaults(recommend)
    serve = sub.add_parser(
        "serve", parents=[common], help="serve an exported model: TF Serving's REST and gRPC "
        "APIs", description="Serve DIR (TF Serving's layout DIR/1, DIR/2, ... of SavedModels "
        "or `train --out` directories; or one of them): TF Serving's REST API "
        "(/v1/models/NAME[:predict]) and gRPC PredictionService, dynamic batching, the newest "
        "version (picked up without a restart), Prometheus metrics at "
        "/monitoring/prometheus/metrics, /healthz, and POST /v1/models/NAME:recommend, which "
        "keeps each user's key/value cache between requests. SIGTERM drains and stops.")
    serve.add_argument("--model", required=True, help="the model's base directory")
    serve.add_argument("--model-name", default="default", help="the NAME in the API's paths "
                       "(default: default, as TF Serving's)")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on "
                       "(default: 127.0.0.1; 0.0.0.0 for every interface)")
    serve.add_argument("--rest-port", type=int, default=8501, help="REST port (default: "
                       "8501; 0: any free port; -1: no REST)")
    serve.add_argument("--grpc-port", type=int, default=8500, help="gRPC port (default: "
                       "8500; 0: any free port; -1: no gRPC)")
    serve.add_argument("--no-batching", action="store_true", help="one model call per "
                       "request (default: batch concurrent requests of batchable signatures)")
    serve.add_argument("--max-batch-size", type=_positive_int, default=32,
                       help="rows of a batched call (default: 32)")
    serve.add_argument("--batch-timeout-micros", type=int, default=1000,
                       help="longest wait for a batch to fill (default: 1000)")
    serve.add_argument("--num-batch-threads", type=_positive_int, default=1,
                       help="threads running batches (default: 1: a call already uses every core)")
    serve.add_argument("--tensorflow-intra-op-parallelism", type=_nonnegative_int, default=0,
                       help="threads of one op (TF Serving's flag; default: 0, TensorFlow's "
                       "choice: a thread a core)")
    serve.add_argument("--tensorflow-inter-op-parallelism", type=_nonnegative_int, default=0,
                       help="threads running a call's independent ops (TF Serving's flag; "
                       "default: 0, TensorFlow's choice)")
    serve.add_argument("--cache-mb", type=int, default=256, help="memory of the users' "
                       "key/value cache in MiB (default: 256; 0: re-encode every history)")
    serve.add_argument("--poll-seconds", type=float, default=1.0, help="how often to look "
                       "for a new version (default: 1)")
    serve.add_argument("--max-request-mb", type=_positive_int, default=4,
                       help="largest request body, MiB (default: 4; larger: HTTP 413)")
    serve.add_argument("--max-request-elements", type=_positive_int, default=4_000_000,
                       help="most values a request may hold or declare, all its inputs "
                       "together, checked before anything is built for them (default: "
                       "4,000,000; more: HTTP 413 / RESOURCE_EXHAUSTED)")
    serve.add_argument("--read-timeout", type=float, default=30.0,
                       help="seconds a REST request's headers may take from their first byte, "
                       "and its body from its headers (default: 30; later: HTTP 408 and the "
                       "connection closed); also how long SIGTERM waits for a request still "
                       "being read")
    sub.add_parser("bench", add_help=False, parents=[common],
                   help="benchmark every op against its plain-TensorFlow composite")
    sub.add_parser("info", parents=[common],
                   help="versions, build flags, threads, registered ops")
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    _quiet_tensorflow(args.verbose)
    if args.command == "bench":
        from recops_tf import bench

        return bench.main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    command = {"train": lambda a: _train(a, argv[1:]), "tune": _tune, "export": _export,
               "recommend": _recommend, "serve": _serve, "info": _info}[args.command]
    try:
        return command(args)
    except UsageError as e:
        print(f"recops-tf {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
