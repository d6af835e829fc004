"""The `recops-tf` command line (also `python -m recops_tf`):

    recops-tf train [--data PATH] [--epochs N] [--out DIR] [--no-fused]   the main job
    recops-tf export --model DIR --out DIR2       re-export a trained model's SavedModel
    recops-tf recommend --model DIR --history 1,5,9 [--k 10]
    recops-tf bench [STEM ...] [--out report.md] [--chart speedups.png]
    recops-tf info
"""
import argparse
import json
import os
import sys
import time


def _train(args):
    from recops_tf import recommender as rec

    if args.data:
        try:
            dataset = rec.load(args.data)
        except rec.DataError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        dataset = rec.synthetic(num_users=args.users, num_items=args.items, seed=args.seed)
    lengths = [len(h) for h in dataset.items]
    print(f"data: {dataset.source}: {dataset.num_users} users, {dataset.num_items} items, "
          f"{sum(lengths)} interactions (history length {min(lengths)}-{max(lengths)})")
    config = rec.Config(epochs=args.epochs, batch_size=args.batch_size,
                        learning_rate=args.learning_rate, d_model=args.d_model,
                        num_blocks=args.blocks, max_seq_len=args.max_seq_len,
                        use_fused=not args.no_fused, seed=args.seed, max_steps=args.max_steps)
    kind = "fused ops" if config.use_fused else "stock TF (--no-fused)"
    print(f"model: {config.num_blocks} HSTU blocks, d_model {config.d_model}, "
          f"{config.max_seq_len} items of history, {kind}")
    model, losses, seconds = rec.train(dataset, config, progress=not args.no_progress)
    start = time.perf_counter()
    hr, ndcg = rec.evaluate(model, dataset)
    eval_seconds = time.perf_counter() - start
    pop_hr, pop_ndcg = rec.popularity_baseline(dataset)
    print(f"trained {len(losses)} steps in {seconds:.1f} s ({len(losses) / seconds:.2f} steps/s), "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    print(f"held-out last item of {dataset.num_users} users (evaluated in {eval_seconds:.1f} s):")
    print(f"  model       HR@10 {hr:.4f}  NDCG@10 {ndcg:.4f}")
    print(f"  popularity  HR@10 {pop_hr:.4f}  NDCG@10 {pop_ndcg:.4f}  "
          f"(model / popularity: {hr / max(pop_hr, 1e-12):.2f}x HR@10)")
    metrics = {"hr@10": hr, "ndcg@10": ndcg, "popularity_hr@10": pop_hr,
               "popularity_ndcg@10": pop_ndcg, "train_seconds": seconds,
               "steps": len(losses), "final_loss": losses[-1]}
    if args.out:
        path = rec.export(model, dataset, args.out, metrics)
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="recops-tf", description="recops_tf: fused "
                                     "recommendation-model ops for TensorFlow")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train and evaluate a generative recommender")
    train.add_argument("--data", help="MovieLens-1M ratings.dat or a user,item,timestamp CSV "
                                      "(default: the built-in synthetic set)")
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--batch-size", type=int, default=128)
    train.add_argument("--learning-rate", type=float, default=2e-3)
    train.add_argument("--d-model", type=int, default=64)
    train.add_argument("--blocks", type=int, default=2)
    train.add_argument("--max-seq-len", type=int, default=64)
    train.add_argument("--users", type=int, default=3000, help="synthetic set: users")
    train.add_argument("--items", type=int, default=1000, help="synthetic set: items")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: all)")
    train.add_argument("--no-fused", action="store_true",
                       help="the same model from stock TF ops (parity and speed baseline)")
    train.add_argument("--out", help="export the trained model (SavedModel + .keras) here")
    train.add_argument("--json", help="write the metrics here")
    train.add_argument("--no-progress", action="store_true")
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
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from recops_tf import bench

        return bench.main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return {"train": _train, "export": _export, "recommend": _recommend,
            "info": _info}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
