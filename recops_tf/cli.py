"""The `recops-tf` command line (also `python -m recops_tf`):

    recops-tf train [--data PATH] [--epochs N] [--out DIR] [--no-fused]   the main job
    recops-tf export --model DIR --out DIR2       re-export a trained model's SavedModel
    recops-tf recommend --model DIR --history 1,5,9 [--k 10]
    recops-tf bench [STEM ...] [--out report.md] [--chart speedups.png]
    recops-tf info
"""
import argparse
import dataclasses
import json
import os
import sys
import time


_COLUMNS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "hr@200", "ndcg@200", "mrr")


def _table(rows):
    """Rows of (name, metrics) as an aligned text table."""
    head = f"  {'method':<12}" + "".join(f"{c:>10}" for c in _COLUMNS)
    lines = [head] + [f"  {name:<12}" + "".join(f"{m[c]:>10.4f}" for c in _COLUMNS)
                      for name, m in rows]
    return "\n".join(lines)


def _load_data(args):
    from recops_tf import recommender as rec

    if args.data:
        return rec.load(args.data, format=args.format, user_col=args.user_col,
                        item_col=args.item_col, time_col=args.time_col,
                        min_interactions=args.min_interactions or 0)
    return rec.synthetic(num_users=args.users, num_items=args.items, seed=args.data_seed)


def _config(args):
    from recops_tf import recommender as rec

    return rec.Config.from_preset(
        args.preset, epochs=args.epochs, batch_size=args.batch_size,
        learning_rate=args.learning_rate, d_model=args.d_model, num_blocks=args.blocks,
        num_heads=args.heads, head_dim=args.head_dim, max_seq_len=args.max_seq_len,
        dropout_rate=args.dropout, temperature=args.temperature,
        l2_norm=False if args.no_l2_norm else None, loss=args.loss,
        num_negatives=args.negatives, negatives_per=args.negatives_per,
        relative_bias=False if args.no_relative_bias else None,
        use_fused=False if args.no_fused else None, seed=args.seed, patience=args.patience,
        validation_metric=args.validation_metric,
        exclude_seen=True if args.exclude_seen else None,
        bucket_by_length=True if args.bucket_by_length else None,
        checkpoint_every=args.checkpoint_every, max_steps=args.max_steps).check()


def _train(args, argv):
    from recops_tf import recommender as rec

    resume = bool(args.resume)
    if resume:
        run_file = os.path.join(args.resume, "run.json")
        if not os.path.exists(run_file):
            print(f"error: {args.resume}: not a run directory of `recops-tf train --out` "
                  f"(no run.json)", file=sys.stderr)
            return 2
        with open(run_file) as f:
            saved = json.load(f)["argv"]
        progress_flags = [a for a in argv if a in ("--no-progress",)]
        run_dir = args.resume
        args = _parser().parse_args(["train"] + saved + progress_flags)
        args.out = args.resume = run_dir
    try:
        dataset = _load_data(args)
        config = _config(args)
    except (rec.DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lengths = [len(h) for h in dataset.items]
    print(f"data: {dataset.source}: {dataset.num_users} users, {dataset.num_items} items, "
          f"{sum(lengths)} interactions (history length {min(lengths)}-{max(lengths)})")
    kind = "fused ops" if config.use_fused else "stock TF (--no-fused)"
    negatives = ("full softmax" if config.loss == "full" else
                 f"{config.loss} softmax, {config.num_negatives} negatives per "
                 f"{config.negatives_per}")
    print(f"model: --preset {config.preset}: {config.encoder}, {config.num_blocks} blocks x "
          f"{config.num_heads} heads x {config.head_dim}, d_model {config.d_model}, "
          f"{config.max_seq_len} items of history, {negatives}, temperature "
          f"{config.temperature}{'' if config.l2_norm else ' (no l2 norm)'}, {kind}")
    checkpoint_dir = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        checkpoint_dir = os.path.join(args.out, "checkpoints")
        if not resume:
            with open(os.path.join(args.out, "run.json"), "w") as f:
                json.dump({"argv": [a for a in argv if a != "--no-progress"]}, f, indent=1)
    try:
        result = rec.train(dataset, config, checkpoint_dir=checkpoint_dir, resume=resume,
                           logdir=args.logdir, progress=not args.no_progress)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    seconds = result.train_seconds
    print(f"trained {result.steps} steps ({result.epochs} epochs) in {seconds:.1f} s "
          f"({result.steps / max(seconds, 1e-9):.2f} steps/s), loss {result.first_loss:.3f} -> "
          f"{result.last_loss:.3f}; best validation {config.validation_metric} at epoch "
          f"{result.best_epoch}")
    seen = {True: "seen items excluded (--exclude-seen)", False: "seen items kept"}
    for exclude, model_m, base in ((config.exclude_seen, result.test, result.baselines),
                                   (not config.exclude_seen, result.test_other,
                                    result.baselines_other)):
        print(f"test: last item of {dataset.num_users} users, ranking all "
              f"{dataset.num_items} items, {seen[exclude]}:")
        print(_table([(config.preset, model_m), ("markov", base["markov"]),
                      ("popularity", base["popularity"])]))
    ratio = result.test["hr@10"] / max(result.baselines["markov"]["hr@10"], 1e-12)
    print(f"{config.preset} / markov: {ratio:.2f}x HR@10 ({seen[config.exclude_seen]})")
    metrics = {"exclude_seen": config.exclude_seen, "test": result.test,
               "test_other_protocol": result.test_other, "baselines": result.baselines,
               "baselines_other_protocol": result.baselines_other,
               "train_seconds": seconds, "steps": result.steps, "epochs": result.epochs,
               "best_epoch": result.best_epoch, "first_loss": result.first_loss,
               "last_loss": result.last_loss, "validation": result.validation,
               "config": dataclasses.asdict(config), "data": dataset.source}
    if args.out:
        path = rec.export(result.model, dataset, args.out, metrics)
        print(f"exported: {path} (SavedModel), {os.path.join(args.out, 'model.keras')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(metrics, f, indent=1)
    return 0


def _export(args):
    import keras

    from recops_tf import recommender as rec

    model = keras.models.load_model(os.path.join(args.model, "model.keras"))
    with open(os.path.join(args.model, "items.txt")) as f:
        names = [line.rstrip("\n") for line in f]
    with open(os.path.join(args.model, "info.json")) as f:
        info = json.load(f)
    dataset = rec.Dataset([], [], len(names), info.get("source", "?"), item_names=names)
    print(f"exported: {rec.export(model, dataset, args.out, info.get('metrics'))}")
    return 0


def _recommend(args):
    from recops_tf import recommender as rec

    history = [h for h in args.history.split(",") if h]
    timestamps = [int(t) for t in args.timestamps.split(",")] if args.timestamps else None
    try:
        items, scores = rec.recommend(args.model, history, timestamps, args.k)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for rank, (item, score) in enumerate(zip(items, scores), 1):
        print(f"{rank:>3}  {item:>10}  {score:8.4f}")
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
    ops = sorted(name for name in dir(_loader.load())
                 if name.startswith("recops_") and not name.endswith("_eager_fallback"))
    print(f"registered ops ({len(ops)}): {', '.join(ops)}")
    return 0


def _parser():
    parser = argparse.ArgumentParser(prog="recops-tf", description="recops_tf: fused "
                                     "recommendation-model ops for TensorFlow")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train", help="train and evaluate a generative recommender",
        description="Train a sequential recommender (the HSTU paper's recipe by default) on "
        "leave-one-out splits, validate every epoch, and report the test metrics next to "
        "the popularity and Markov-chain baselines. Preset values can be overridden by "
        "each flag.")
    data = train.add_argument_group("data")
    data.add_argument("--data", help="an interaction file (MovieLens u.data / ratings.dat / "
                      "ratings.csv, SASRec's 'user item' files, or a CSV with named columns; "
                      "default: the built-in synthetic set)")
    data.add_argument("--format", choices=_formats(), help="the file's format (default: "
                      "detected from its first line)")
    data.add_argument("--user-col", help="CSV: the user column (default: user)")
    data.add_argument("--item-col", help="CSV: the item column (default: item)")
    data.add_argument("--time-col", help="CSV: the time column (default: timestamp; "
                      "without one, file order is the time)")
    data.add_argument("--min-interactions", type=int, default=0,
                      help="k-core: drop users and items with fewer than K interactions")
    data.add_argument("--users", type=int, default=3000, help="synthetic set: users")
    data.add_argument("--items", type=int, default=1000, help="synthetic set: items")
    data.add_argument("--data-seed", type=int, default=0, help="synthetic set: its seed")
    model = train.add_argument_group("model (defaults from --preset)")
    model.add_argument("--preset", choices=("hstu", "hstu-large", "sasrec"), default="hstu")
    model.add_argument("--d-model", type=int, help="item embedding width (50)")
    model.add_argument("--blocks", type=int)
    model.add_argument("--heads", type=int)
    model.add_argument("--head-dim", type=int, help="per-head q/k/v width")
    model.add_argument("--max-seq-len", type=int, help="items of history (200)")
    model.add_argument("--dropout", type=float, help="dropout rate (0.2)")
    model.add_argument("--temperature", type=float, help="of the l2-normalised logits (0.05)")
    model.add_argument("--no-l2-norm", action="store_true",
                       help="raw dot products instead of l2-normalised ones")
    model.add_argument("--no-relative-bias", action="store_true",
                       help="HSTU without its learned time + position bias")
    model.add_argument("--loss", choices=("sampled", "in-batch", "full"),
                       help="sampled softmax over uniform negatives (default), over the "
                       "batch's own targets, or a full softmax over the catalogue")
    model.add_argument("--negatives", type=int, help="negatives per sequence (128)")
    model.add_argument("--negatives-per", choices=("sequence", "position"),
                       help="one set of negatives per sequence (default: B x N embeddings a "
                       "step) or per position as generative-recommenders samples (P x N)")
    model.add_argument("--no-fused", action="store_true",
                       help="the same model from stock TF ops (parity and speed baseline)")
    fit = train.add_argument_group("training")
    fit.add_argument("--epochs", type=int, help="at most this many epochs (100)")
    fit.add_argument("--batch-size", type=int)
    fit.add_argument("--learning-rate", type=float)
    fit.add_argument("--patience", type=int, help="stop after N epochs without a better "
                     "validation metric (10; 0: never)")
    fit.add_argument("--validation-metric", help="early-stopping metric (ndcg@10)")
    fit.add_argument("--exclude-seen", action="store_true", help="rank only items the user "
                     "has not interacted with (both protocols are reported)")
    fit.add_argument("--bucket-by-length", action="store_true",
                     help="batch histories of similar length together")
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: all)")
    fit.add_argument("--checkpoint-every", type=int, default=0,
                     help="also checkpoint every N steps (every epoch always, with --out)")
    fit.add_argument("--resume", metavar="DIR", help="continue the run whose --out was DIR "
                     "from its newest checkpoint (its own flags are reused)")
    fit.add_argument("--logdir", help="write TensorBoard summaries here")
    out = train.add_argument_group("output")
    out.add_argument("--out", help="checkpoints, then the trained model (SavedModel + "
                     ".keras) here")
    out.add_argument("--json", help="write the metrics here")
    out.add_argument("--no-progress", action="store_true")
    export = sub.add_parser("export", help="re-export a trained model directory")
    export.add_argument("--model", required=True, help="a directory written by train --out")
    export.add_argument("--out", required=True)
    recommend = sub.add_parser("recommend", help="top-k items for a history")
    recommend.add_argument("--model", required=True, help="a directory written by train --out")
    recommend.add_argument("--history", required=True, help="item ids, comma-separated")
    recommend.add_argument("--timestamps", help="seconds, comma-separated (default: daily)")
    recommend.add_argument("--k", type=int, default=10)
    sub.add_parser("bench", add_help=False,
                   help="benchmark every op against its plain-TensorFlow composite")
    sub.add_parser("info", help="versions, build flags, threads, registered ops")
    return parser


def _formats():
    from recops_tf.recommender.data import FORMATS

    return FORMATS


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from recops_tf import bench

        return bench.main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "train":
        return _train(args, argv[1:])
    return {"export": _export, "recommend": _recommend, "info": _info}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
