#!/usr/bin/env python3
"""MovieLens-1M as the HSTU paper ranks it, from BERT4Rec-VAE's preprocessed pickle, as a
``user item`` file (``--format sasrec``) whose leave-one-out split is the pickle's.

The public copy used: the GitHub repository ``TianyuanYang/KAN4Rec``, file
``Data/preprocessed/ml-1m_min_rating0-min_uc5-min_sc0-splitleave_one_out/dataset.pkl``
(BERT4Rec-VAE's preprocessing of MovieLens-1M: every rating kept, users with 5 or more,
each user's items sorted by time, the last one the test item, the one before the validation
item). It holds plain dicts and lists: ``train`` / ``val`` / ``test`` map a user to a list of
items (``val`` and ``test`` one item each), and ``umap`` / ``smap`` map the original
MovieLens user and movie ids to the pickle's.

    python tools/ml1m_from_pickle.py dataset.pkl ml-1m.pairs
    recops-tf train --data ml-1m.pairs --format sasrec

Each user's lines are written in time order: the training items, then the validation item,
then the test item, so `evaluation.Split.leave_one_out` (the last item the test target, the
one before it the validation target) reproduces the pickle's split; the tool reads the
written file back with the project's loader and checks that it does. Ids are written as the
original MovieLens ids where ``umap`` / ``smap`` give them (``--pickle-ids`` keeps the
pickle's). The pickle is read with every class refused (only the pickle protocol's own
containers, numbers and strings load), so a crafted pickle cannot run code. The data file is
the user's (fetched for local evaluation, never committed).
"""
import argparse
import importlib.util
import os
import pickle
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class DataError(Exception):
    """A pickle or output that cannot be used; the message is the tool's one-line error."""


class _NoClasses(pickle.Unpickler):
    """Refuses every global: no class, function or module is ever looked up."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused to load the global {module}.{name} "
                                     "(only plain dicts, lists, numbers and strings are read)")


def read_pickle(path):
    """The pickle's object, loaded with every class refused."""
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    if os.path.isdir(path):
        raise DataError(f"{path}: is a directory; pass the dataset.pkl in it")
    with open(path, "rb") as f:
        head = f.read(200)
        if head.startswith(b"version https://git-lfs"):
            raise DataError(f"{path}: a Git LFS pointer, not the pickle; fetch the LFS object")
        f.seek(0)
        try:
            return _NoClasses(f).load()
        except pickle.UnpicklingError as e:
            raise DataError(f"{path}: not a plain pickle: {e}") from None
        except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
                OverflowError, MemoryError) as e:
            raise DataError(f"{path}: not a readable pickle ({type(e).__name__}: {e})") from None


def _scalar(value):
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def histories(obj, path, original_ids=True):
    """[(user, [items in time order])] from the pickle's dicts, users in the pickle's order
    of `train`; ids are the original ones when `original_ids` and the maps give them."""
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a dict with 'train', 'val' and 'test', got "
                        f"{type(obj).__name__}")
    missing = [k for k in ("train", "val", "test") if k not in obj]
    if missing:
        raise DataError(f"{path}: no {', '.join(repr(k) for k in missing)} in the pickle "
                        f"(keys: {', '.join(map(repr, list(obj)[:10]))})")
    parts = {k: obj[k] for k in ("train", "val", "test")}
    for name, part in parts.items():
        if not isinstance(part, dict):
            raise DataError(f"{path}: {name!r} must map users to lists of items, got "
                            f"{type(part).__name__}")
    users = list(parts["train"])
    for name in ("val", "test"):
        if set(parts[name]) != set(users):
            extra = set(parts[name]) ^ set(users)
            raise DataError(f"{path}: {name!r} and 'train' have different users (e.g. "
                            f"{sorted(map(str, extra))[0]})")
    user_names, item_names = {}, {}
    if original_ids:  # umap / smap: original id -> pickle id; inverted when one to one
        for key, names in (("umap", user_names), ("smap", item_names)):
            mapping = obj.get(key)
            if isinstance(mapping, dict) and len(set(mapping.values())) == len(mapping):
                names.update((v, k) for k, v in mapping.items())
    out = []
    for user in users:
        if not _scalar(user):
            raise DataError(f"{path}: user {user!r} is not an int or a string")
        train = parts["train"][user]
        val, test = parts["val"][user], parts["test"][user]
        for name, items in (("train", train), ("val", val), ("test", test)):
            if not isinstance(items, list) or not all(_scalar(i) for i in items):
                raise DataError(f"{path}: {name}[{user!r}] must be a list of int or str item "
                                f"ids, got {str(items)[:60]}")
        if len(val) != 1 or len(test) != 1:
            raise DataError(f"{path}: val[{user!r}] and test[{user!r}] must hold one item "
                            f"each, got {len(val)} and {len(test)}")
        items = [item_names.get(i, i) for i in train + val + test]
        out.append((user_names.get(user, user), items))
    for name, ids in (("user", [u for u, _ in out]),
                      ("item", [i for _, items in out for i in items])):
        if any(any(c.isspace() for c in str(x)) or str(x) == "" for x in ids):
            raise DataError(f"{path}: an {name} id is empty or holds whitespace; it cannot be "
                            "written as a 'user item' line")
    if len({str(u) for u, _ in out}) != len(out):
        raise DataError(f"{path}: two users have the same id once written")
    return out


def write_pairs(rows, out):
    """One ``user item`` line per interaction, each user's in time order."""
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        for user, items in rows:
            f.writelines(f"{user} {item}\n" for item in items)
    os.replace(tmp, out)


def _project_module(name):
    # The loader and the split, read from this checkout's files: both are NumPy only, and
    # importing the package would import TensorFlow and load the op library.
    spec = importlib.util.spec_from_file_location(
        f"_ml1m_{name}", os.path.join(ROOT, "recops_tf", "recommender", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks the module up
    spec.loader.exec_module(module)
    return module


def check(rows, out):
    """Reads `out` back with the project's loader (``sasrec``) and checks that its
    leave-one-out split's validation and test targets are the pickle's. Returns
    (users, items, interactions)."""
    data, evaluation = _project_module("data"), _project_module("evaluation")
    try:
        dataset = data.load(out, format="sasrec")
        split = evaluation.Split.leave_one_out(dataset)
    except ValueError as e:  # data.DataError too
        raise DataError(f"{out}: the project's loader: {e}") from None
    expected = {str(u): (str(items[-2]), str(items[-1])) for u, items in rows}
    if dataset.num_users != len(expected):
        raise DataError(f"{out}: read back {dataset.num_users} users, wrote {len(expected)} "
                        "(users with fewer than 3 items are dropped by the loader)")
    names = dataset.item_names
    for which, at in (("valid", 0), ("test", 1)):
        targets, _ = split.targets(which)
        for user, target in zip(dataset.user_names, targets):
            if names[target - 1] != expected[user][at]:
                raise DataError(f"{out}: user {user}'s {which} target is {names[target - 1]}, "
                                f"the pickle's is {expected[user][at]}")
    return dataset.num_users, dataset.num_items, sum(len(h) for h in dataset.items)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pickle", help="BERT4Rec-VAE's dataset.pkl")
    parser.add_argument("out", help="the user item file to write (--format sasrec)")
    parser.add_argument("--pickle-ids", action="store_true",
                        help="write the pickle's user and item ids, not the original ones")
    parser.add_argument("--no-check", action="store_true",
                        help="skip reading the file back with the project's loader")
    args = parser.parse_args(argv)
    try:
        rows = histories(read_pickle(args.pickle), args.pickle, not args.pickle_ids)
        short = [(u, len(items)) for u, items in rows if len(items) < 3]
        if short:
            raise DataError(f"{args.pickle}: user {short[0][0]} has {short[0][1]} items; "
                            "leave-one-out needs 3 or more")
        write_pairs(rows, args.out)
        if args.no_check:
            print(f"{args.out}: {len(rows)} users, "
                  f"{sum(len(items) for _, items in rows)} interactions")
        else:
            users, items, interactions = check(rows, args.out)
            print(f"{args.out}: {users} users, {items} items, {interactions} interactions; "
                  "the leave-one-out split's validation and test targets are the pickle's")
    except (DataError, OSError) as e:
        print(f"ml1m_from_pickle: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
