"""tools/ml1m_from_pickle.py: BERT4Rec-VAE's dataset.pkl (train / val / test per user) as a
`user item` file whose leave-one-out split is the pickle's; a pickle naming any class is
refused without running it."""
import importlib.util
import os
import pickle

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    spec = importlib.util.spec_from_file_location(
        "ml1m_from_pickle", os.path.join(ROOT, "tools", "ml1m_from_pickle.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dataset():
    # Pickle ids 0.. as BERT4Rec-VAE numbers them; umap / smap: original id -> pickle id.
    return {"train": {0: [3, 1, 2], 1: [2, 0], 2: [1]},
            "val": {0: [0], 1: [3], 2: [2]},
            "test": {0: [4], 1: [1], 2: [0]},
            "umap": {10: 0, 20: 1, 30: 2},
            "smap": {100: 0, 101: 1, 102: 2, 103: 3, 104: 4}}


def _write(tmp_path, obj, name="dataset.pkl"):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj, protocol=4))
    return str(path)


def test_pairs_in_time_order_with_the_pickles_split(tmp_path, capsys):
    tool = _tool()
    out = tmp_path / "ml-1m.pairs"
    assert tool.main([_write(tmp_path, _dataset()), str(out)]) == 0
    assert out.read_text().splitlines() == [
        "10 103", "10 101", "10 102", "10 100", "10 104",  # train, then val, then test
        "20 102", "20 100", "20 103", "20 101",
        "30 101", "30 102", "30 100"]
    assert "3 users, 5 items, 12 interactions" in capsys.readouterr().out
    out_ids = tmp_path / "ids.pairs"
    assert tool.main([_write(tmp_path, _dataset()), str(out_ids), "--pickle-ids"]) == 0
    assert out_ids.read_text().splitlines()[:5] == ["0 3", "0 1", "0 2", "0 0", "0 4"]


def test_the_check_reads_the_split_back(tmp_path):
    tool = _tool()
    rows = tool.histories(_dataset(), "x")
    out = str(tmp_path / "a.pairs")
    tool.write_pairs(rows, out)
    assert tool.check(rows, out) == (3, 5, 12)
    rows[1] = (rows[1][0], rows[1][1][:-2] + rows[1][1][-2:][::-1])  # val and test swapped
    with pytest.raises(tool.DataError, match="user 20's valid target is 103, the pickle's is 101"):
        tool.check(rows, out)


class _Reduce:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):  # unpickling would call os.system("touch PATH")
        return os.system, (f"touch {self.path}",)


def test_a_pickle_naming_a_class_is_refused(tmp_path, capsys):
    tool = _tool()
    marker = tmp_path / "ran"
    bad = _dataset()
    bad["train"][0] = [_Reduce(marker)]
    out = tmp_path / "out.pairs"
    assert tool.main([_write(tmp_path, bad), str(out)]) == 2
    err = capsys.readouterr().err
    assert "refused to load the global" in err and "system" in err
    assert err.count("\n") == 1  # one line, no traceback
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize("obj, message", [
    ([1, 2], "expected a dict with 'train', 'val' and 'test', got list"),
    ({"train": {}, "test": {}}, "no 'val' in the pickle"),
    ({"train": {0: [1]}, "val": {0: [2, 3]}, "test": {0: [4]}},
     "val[0] and test[0] must hold one item each, got 2 and 1"),
    ({"train": {0: [1]}, "val": {1: [2]}, "test": {0: [4]}}, "'val' and 'train' have different"),
    ({"train": {0: (1,)}, "val": {0: [2]}, "test": {0: [4]}}, "train[0] must be a list"),
    ({"train": {0: [1.5]}, "val": {0: [2]}, "test": {0: [4]}}, "train[0] must be a list"),
])
def test_wrong_structure_is_a_one_line_error(tmp_path, capsys, obj, message):
    tool = _tool()
    assert tool.main([_write(tmp_path, obj), str(tmp_path / "out.pairs")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_or_unreadable_files(tmp_path, capsys):
    tool = _tool()
    assert tool.main([str(tmp_path / "none.pkl"), str(tmp_path / "o")]) == 2
    assert "none.pkl: no such file" in capsys.readouterr().err
    lfs = tmp_path / "lfs.pkl"
    lfs.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 3\n")
    assert tool.main([str(lfs), str(tmp_path / "o")]) == 2
    assert "a Git LFS pointer" in capsys.readouterr().err
    junk = tmp_path / "junk.pkl"
    junk.write_bytes(b"\x80\x04not a pickle")
    assert tool.main([str(junk), str(tmp_path / "o")]) == 2
    assert "junk.pkl: not a" in capsys.readouterr().err
