"""The main job end to end on a tiny size: data, training, evaluation, export, a new process
that recommends, and the command line."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from recops_tf import cli
from recops_tf import recommender as rec
from recops_tf.recommender import training as train_module

TINY = ["--users", "60", "--items", "40", "--epochs", "1", "--batch-size", "16",
        "--d-model", "16", "--blocks", "1", "--max-seq-len", "16", "--no-progress"]


def test_synthetic_data_is_deterministic_and_structured():
    a, b = rec.synthetic(num_users=50, num_items=30, seed=3), rec.synthetic(50, 30, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a.items, b.items))
    assert all(np.array_equal(x, y) for x, y in zip(a.timestamps, b.timestamps))
    assert min(h.min() for h in a.items) >= 1 and max(h.max() for h in a.items) <= 30
    assert all(np.all(np.diff(t) >= 0) for t in a.timestamps)
    # Sequential habits: the most frequent successor of an item follows it often.
    pairs = np.concatenate([np.stack([h[:-1], h[1:]], 1) for h in a.items])
    top = max(np.bincount(pairs[pairs[:, 0] == i, 1]).max() / (pairs[:, 0] == i).sum()
              for i in range(1, 31) if (pairs[:, 0] == i).sum() > 20)
    assert top > 0.4


def test_movielens_and_csv_files(tmp_path):
    ml = tmp_path / "ratings.dat"
    ml.write_text("1::10::5::300\n1::20::3::100\n1::30::4::200\n2::10::1::50\n"
                  "3::20::2::5\n3::40::2::6\n3::10::2::7\n")
    data = rec.load(str(ml))
    assert data.num_users == 2  # user 2 has fewer than 3 interactions
    names = list(data.item_names)
    assert [names[i - 1] for i in data.items[0]] == ["20", "30", "10"]  # time order
    assert data.timestamps[0].tolist() == [100, 200, 300]
    csv = tmp_path / "events.csv"
    csv.write_text("timestamp,user,item,extra\n3,u,a,x\n1,u,b,x\n2,u,c,x\n")
    data = rec.load(str(csv))
    assert [list(data.item_names)[i - 1] for i in data.items[0]] == ["b", "c", "a"]


@pytest.mark.parametrize("name,text,message", [
    ("ratings.dat", "1::10::5::300\n1::20::3\n", r"ratings.dat:2: expected UserID::MovieID"),
    ("ratings.dat", "1::10::5::later\n", r"ratings.dat:1: timestamp 'later' is not a number"),
    ("e.csv", "user,item\n1,2\n", r"e.csv:1: the header must name the columns"),
    ("e.csv", "user,item,timestamp\n1,2\n", r"e.csv:2: expected 3 columns"),
    ("e.csv", "user,item,timestamp\n1,2,3\n", r"no user has 3 or more"),
])
def test_bad_files_name_the_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(rec.DataError, match=message):
        rec.load(str(path))


def test_metrics():
    ranked = np.array([[3, 1, 2], [1, 2, 3], [2, 3, 1]])
    hr, ndcg = train_module._metrics(ranked, np.array([3, 3, 9]), k=3)
    assert hr == pytest.approx(2 / 3)
    assert ndcg == pytest.approx((1.0 + 1 / np.log2(4)) / 3)


def test_train_export_and_recommend_in_a_new_process(tmp_path, capsys):
    out = tmp_path / "model"
    metrics = tmp_path / "metrics.json"
    assert cli.main(["train", *TINY, "--out", str(out), "--json", str(metrics)]) == 0
    printed = capsys.readouterr().out
    assert "HR@10" in printed and "popularity" in printed
    result = json.loads(metrics.read_text())
    assert 0 <= result["hr@10"] <= 1 and result["steps"] == 4
    assert sorted(os.listdir(out)) == ["info.json", "items.txt", "model.keras", "saved_model"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-m", "recops_tf", "recommend", "--model", str(out),
                           "--history", "1,5,9", "--k", "4"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.strip().splitlines()]
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]
    scores = [float(r[2]) for r in rows]
    assert scores == sorted(scores, reverse=True)
    assert all(1 <= int(r[1]) <= 40 for r in rows)
    # The same answer in this process, from the API.
    items, _ = rec.recommend(str(out), [1, 5, 9], k=4)
    assert items == [r[1] for r in rows]
    # Re-export from the .keras file: the same recommendations.
    again = tmp_path / "again"
    assert cli.main(["export", "--model", str(out), "--out", str(again)]) == 0
    assert rec.recommend(str(again), [1, 5, 9], k=4)[0] == items


def test_recommend_rejects_unknown_items(tmp_path, capsys):
    out = tmp_path / "m"
    assert cli.main(["train", *TINY, "--max-steps", "1", "--out", str(out)]) == 0
    assert cli.main(["recommend", "--model", str(out), "--history", "1,999"]) == 2
    assert "not in the model's catalogue: ['999']" in capsys.readouterr().err


def test_train_reports_a_bad_data_file(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("user,item,timestamp\n1,2\n")
    assert cli.main(["train", "--data", str(path), "--no-progress"]) == 2
    assert "bad.csv:2: expected 3 columns" in capsys.readouterr().err


def test_fused_and_stock_models_train_alike():
    data = rec.synthetic(num_users=64, num_items=40, seed=1)
    results = {}
    for fused in (True, False):
        config = rec.Config(epochs=2, batch_size=16, d_model=16, num_blocks=1, max_seq_len=16,
                            use_fused=fused, dropout_rate=0.0)
        model, losses, _ = rec.train(data, config, progress=False)
        results[fused] = losses
    # Different embedding tables (initialised differently), the same model otherwise: the
    # losses start at log(40) and fall alike.
    for losses in results.values():
        assert losses[0] == pytest.approx(np.log(40), rel=0.05)
        assert losses[-1] < losses[0]


def test_info(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "tensorflow 2.21" in out and "recops_rma_swap_multi_tables" in out
    assert "eager_fallback" not in out
