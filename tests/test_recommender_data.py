"""Reading interaction files (recops_tf.recommender.data.load): every format, its detection,
the preprocessing (stable time order, duplicates, k-core, min history, id numbering) and the
error of every kind of malformed file, with its line number. Tiny files written here only."""
import itertools
import random
import re

import numpy as np
import pytest

from recops_tf import recommender as rec
from recops_tf.recommender import data

# (user, item, rating, timestamp) in file order. User 2: ties at 200 keep file order (100
# before 9); user 10: a tie at 50 and the pair (10, 10) twice; user 9 has one interaction.
ROWS = [(2, 10, 5, 300), (2, 9, 3, 100), (10, 100, 4, 50), (2, 100, 4, 200), (2, 9, 1, 200),
        (10, 9, 2, 50), (10, 10, 2, 10), (10, 10, 2, 60), (9, 9, 5, 1)]


def write(tmp_path, format, rows=ROWS, name=None):
    """`rows` as a file of `format`."""
    if format == "ml-100k":
        text = "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows)
    elif format == "ml-1m":
        text = "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in rows)
    elif format == "ml-csv":
        text = "userId,movieId,rating,timestamp\n" + "".join(
            f"{u},{i},{r}.5,{t}\n" for u, i, r, t in rows)
    elif format == "sasrec":
        text = "".join(f"{u} {i}\n" for u, i, _, _ in rows)
    else:
        text = "Timestamp,extra,ITEM,User\n" + "".join(
            f"{t},x y,{i},{u}\n" for u, i, _, t in rows)
    path = tmp_path / (name or f"{format}.txt")
    path.write_text(text)
    return path


def named(dataset):
    """Each user's history as (original user id, [original item ids], [timestamps])."""
    return [(user, [dataset.item_names[i - 1] for i in items], stamps.tolist())
            for user, items, stamps in zip(dataset.user_names, dataset.items,
                                           dataset.timestamps)]


@pytest.mark.parametrize("format", data.FORMATS)
def test_every_format_is_read_in_time_order(tmp_path, format):
    path = write(tmp_path, format)
    dataset = rec.load(path, format=format)
    assert dataset.source == str(path)
    assert list(dataset.item_names) == ["9", "10", "100"]  # numeric order, not "10" < "9"
    assert list(dataset.user_names) == ["2", "10"]  # user 9 has 1 interaction (< 3)
    assert dataset.num_items == 3 and dataset.num_users == 2
    assert all(h.dtype == np.int64 and t.dtype == np.int64
               for h, t in zip(dataset.items, dataset.timestamps))
    if format == "sasrec":  # no time: file order, positions as timestamps
        assert not dataset.has_time
        assert named(dataset) == [("2", ["10", "9", "100", "9"], [0, 1, 2, 3]),
                                  ("10", ["100", "9", "10", "10"], [0, 1, 2, 3])]
    else:  # stable: equal times keep file order; the duplicate (10, 10) stays twice
        assert dataset.has_time
        assert named(dataset) == [("2", ["9", "100", "9", "10"], [100, 200, 200, 300]),
                                  ("10", ["10", "100", "9", "10"], [10, 50, 50, 60])]
    assert rec.load(path).items[0].tolist() == dataset.items[0].tolist()  # detected alike


def test_numbering_does_not_depend_on_file_order(tmp_path):
    a = rec.load(write(tmp_path, "ml-1m", name="a"))
    b = rec.load(write(tmp_path, "ml-1m", ROWS[::-1], name="b"))
    assert list(a.item_names) == list(b.item_names) and list(a.user_names) == list(b.user_names)
    # Reversed file order reverses the order of ties only.
    assert named(b)[0] == ("2", ["9", "9", "100", "10"], [100, 200, 200, 300])


@pytest.mark.parametrize("text,format", [
    ("1::10::5::300\n", "ml-1m"),
    ("\n\nuserId,movieId,rating,timestamp\n1,10,5.0,300\n", "ml-csv"),
    ("user,item\nu,a\n", "csv"),
    ("movieId,userId,timestamp\n10,1,300\n", "ml-csv"),
    ("1\t10\t5\t300\n", "ml-100k"),
    ("1 10 5 300\n", "ml-100k"),
    ("1\t10\n", "sasrec"),
    ("A1B2 X9\n", "sasrec"),
])
def test_detection(tmp_path, text, format):
    path = tmp_path / "f"
    path.write_text(text)
    assert data._detect(str(path), *data._first_line(str(path))) == format


def test_columns_imply_csv(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("who,what\na,x\na,y\na,z\n")
    dataset = rec.load(path, user_col="WHO", item_col="what")
    assert named(dataset) == [("a", ["x", "y", "z"], [0, 1, 2])] and not dataset.has_time


def test_format_overrides_detection(tmp_path):
    # SASRec-style ids with commas: detection sees a CSV header, --format sasrec reads it.
    path = tmp_path / "f.txt"
    path.write_text("u,1 i,1\nu,1 i,2\nu,1 i,1\n")
    with pytest.raises(rec.DataError, match="no column 'user'"):
        rec.load(path)
    dataset = rec.load(path, format="sasrec")
    assert named(dataset) == [("u,1", ["i,1", "i,2", "i,1"], [0, 1, 2])]


@pytest.mark.parametrize("written,format,message", [
    ("ml-1m", "ml-100k", r":1: expected 4 tab-separated fields \(user item rating timestamp\), "
                         r"got '2::10::5::300'"),
    ("ml-100k", "ml-1m", r":1: expected UserID::MovieID::Rating::Timestamp, got '2\\t10"),
    ("ml-100k", "sasrec", r":1: expected 2 fields separated by whitespace \(user item\)"),
    ("sasrec", "ml-100k", r":1: expected 4 tab-separated fields"),
    ("csv", "ml-csv", r":1: expected the header userId,movieId,rating,timestamp, got "
                      r"'Timestamp,extra,ITEM,User'"),
    ("ml-1m", "csv", r":1: the header has no column 'user' \(--user-col\); its columns are "
                     r"\['2::10::5::300'\]"),
])
def test_a_wrong_format_names_the_line(tmp_path, written, format, message):
    with pytest.raises(rec.DataError, match=message):
        rec.load(write(tmp_path, written), format=format)


def test_csv_columns_by_name(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text("Ts,Customer,Product,price\n3,c,b,1\n1.9,c,a,2\n-0.5,c,b,3\n5,d,a,4\n")
    dataset = rec.load(path, user_col="customer", item_col="PRODUCT", time_col="ts",
                       min_history=1)
    # Float times are floored; string ids are numbered in string order.
    assert named(dataset) == [("c", ["b", "a", "b"], [-1, 1, 3]), ("d", ["a"], [5])]
    # Without the time column: file order, positions.
    dataset = rec.load(path, user_col="customer", item_col="product", min_history=1)
    assert not dataset.has_time
    assert named(dataset) == [("c", ["b", "a", "b"], [0, 1, 2]), ("d", ["a"], [0])]


def test_csv_quoted_fields_and_extra_columns(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text('user,item,timestamp,review\n1,"a,b",2,"multi\nline"\n1,c,1,x\n'
                    '1,"a,b",3,""\n')
    dataset = rec.load(path)
    assert named(dataset) == [("1", ["c", "a,b", "a,b"], [1, 2, 3])]


def test_ids_that_are_not_plain_integers_are_strings(tmp_path):
    # "007" is not the integer 7 (it does not print as written): every id is then a string.
    path = tmp_path / "u.data"
    path.write_text("1\t7\t5\t1\n1\t007\t5\t2\n1\t10\t5\t3\n")
    assert list(rec.load(path).item_names) == ["007", "10", "7"]
    path.write_text("1\t7\t5\t1\n1\t8\t5\t2\n1\t10\t5\t3\n")
    assert list(rec.load(path).item_names) == ["7", "8", "10"]


def test_a_string_id_after_many_integer_blocks(tmp_path, monkeypatch):
    # numpy parses the first blocks; the line-by-line reader takes over at the block with
    # "x"; the ids of every block are then numbered as strings.
    monkeypatch.setattr(data, "_BLOCK_BYTES", 64)
    rows = [(u, i, 1, t) for t, (u, i) in enumerate(itertools.product(range(1, 4),
                                                                      (5, 30, 200)))]
    path = write(tmp_path, "ml-1m", rows + [(1, "x", 1, 99)])
    dataset = rec.load(path)
    assert list(dataset.item_names) == ["200", "30", "5", "x"]
    assert named(dataset)[0] == ("1", ["5", "30", "200", "x"], [0, 1, 2, 99])


def test_k_core_takes_rounds(tmp_path):
    # k = 2. Round 1 removes item z (1 interaction) and user D (1); then item w has 1 (from C)
    # and user C has 1: round 2 removes both. One round would have kept C with [w].
    rows = [("A", "x"), ("A", "y"), ("B", "x"), ("B", "y"), ("C", "w"), ("C", "z"), ("D", "w")]
    path = tmp_path / "e.csv"
    path.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in rows))
    assert rec.load(path, min_history=1).num_users == 4
    dataset = rec.load(path, min_interactions=2, min_history=1)
    assert named(dataset) == [("A", ["x", "y"], [0, 1]), ("B", ["x", "y"], [0, 1])]
    assert list(dataset.item_names) == ["x", "y"]


def test_k_core_counts_duplicates(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text("user,item\nA,x\nA,x\nA,y\n")
    assert named(rec.load(path, min_interactions=2, min_history=1)) == [("A", ["x", "x"],
                                                                        [0, 1])]


def test_min_history_after_the_k_core_can_leave_items_below_k(tmp_path):
    # The 2-core keeps everything (x 2, y 3, v 2; A 3, B 2, C 2); min_history 3 then keeps A
    # only, whose items have 1 interaction each.
    rows = [("A", "x"), ("A", "y"), ("A", "v"), ("B", "x"), ("B", "y"), ("C", "v"), ("C", "y")]
    path = tmp_path / "e.csv"
    path.write_text("user,item\n" + "".join(f"{u},{i}\n" for u, i in rows))
    dataset = rec.load(path, min_interactions=2)
    assert named(dataset) == [("A", ["x", "y", "v"], [0, 1, 2])]
    assert dataset.num_items == 3 and list(dataset.item_names) == ["v", "x", "y"]
    assert rec.load(path, min_interactions=2, min_history=2).num_users == 3


def reference(rows, k, min_history):
    """The preprocessing written plainly: rows are (user, item, time) in file order."""
    rows = [(u, i, t, n) for n, (u, i, t) in enumerate(rows)]
    while k:
        users = {u: sum(r[0] == u for r in rows) for u, _, _, _ in rows}
        items = {i: sum(r[1] == i for r in rows) for _, i, _, _ in rows}
        kept = [r for r in rows if users[r[0]] >= k and items[r[1]] >= k]
        if len(kept) == len(rows):
            break
        rows = kept
    users = {u: sum(r[0] == u for r in rows) for u, _, _, _ in rows}
    rows = [r for r in rows if users[r[0]] >= min_history]
    return [(str(u), [str(r[1]) for r in sorted((r for r in rows if r[0] == u),
                                                 key=lambda r: (r[2], r[3]))],
             sorted(r[2] for r in rows if r[0] == u))
            for u in sorted({r[0] for r in rows})]


@pytest.mark.parametrize("seed", range(6))
def test_matches_a_plain_reference(tmp_path, monkeypatch, seed):
    # Blocks shorter than a line, several blocks, one block.
    monkeypatch.setattr(data, "_BLOCK_BYTES", [5, 200, 1 << 24][seed % 3])
    rng = random.Random(seed)
    rows = [(rng.randint(1, 12), rng.randint(1, 15), rng.randint(0, 8)) for _ in range(150)]
    k, min_history = rng.choice([0, 2, 3, 4]), rng.choice([1, 3, 5])
    expected = reference(rows, k, min_history)
    for format in ("ml-1m", "ml-100k", "ml-csv", "csv"):
        path = write(tmp_path, format, [(u, i, 1, t) for u, i, t in rows])
        got = named(rec.load(path, min_interactions=k, min_history=min_history))
        assert got == expected, format
        # The line-by-line reader alone gives the same.
        with monkeypatch.context() as m:
            m.setattr(data, "_plain", lambda text, separators: False)
            assert named(rec.load(path, min_interactions=k, min_history=min_history)) == got


def test_dataset_defaults_keep_old_constructors():
    dataset = rec.Dataset([np.array([1, 2, 1])], [np.array([0, 1, 2])], 2, "x")
    assert dataset.has_time and dataset.user_names is None and dataset.item_names is None


@pytest.mark.parametrize("name,text,kwargs,message", [
    ("ratings.dat", "1::10::5::300\n1::20::3\n", {},
     r"ratings.dat:2: expected UserID::MovieID::Rating::Timestamp, got '1::20::3'"),
    ("ratings.dat", "1::10::5::300\r\n\r\n1::10::5::later\r\n", {},
     r"ratings.dat:3: timestamp 'later' is not a number"),
    ("ratings.dat", "1::10::5::300\n::10::5::300\n", {}, r"ratings.dat:2: empty user or item"),
    ("u.data", "1\t10\t5\t300\n\n1\t10\t5\n", {},
     r"u.data:3: expected 4 tab-separated fields \(user item rating timestamp\), "
     r"got '1\\t10\\t5'"),
    ("u.data", "1\t10\t5\t300\n1\t10\t5\t3e99\n", {},
     r"u.data:2: timestamp '3e99' does not fit in int64"),
    ("Beauty.txt", "1 10\n1 11 12\n", {},
     r"Beauty.txt:2: expected 2 fields separated by whitespace \(user item\), got '1 11 12'"),
    ("ratings.csv", "userId,movieId,rating,timestamp\n1,2,3.5\n", {},
     r"ratings.csv:2: expected 4 columns as in the header, got 3: \['1', '2', '3.5'\]"),
    ("ratings.csv", "userId,movieId,rating\n1,2,3.5\n", {"format": "ml-csv"},
     r"ratings.csv:1: expected the header userId,movieId,rating,timestamp, "
     r"got 'userId,movieId,rating'"),
    ("e.csv", "user,item,timestamp\n1,2,3\n1,2,3,4\n", {},
     r"e.csv:3: expected 3 columns as in the header, got 4"),
    ("e.csv", "user,item,timestamp\n1,2,3\n1,,4\n", {}, r"e.csv:3: empty user or item"),
    ("e.csv", "user,item,timestamp\n1,2,nan\n", {}, r"e.csv:2: timestamp 'nan' is not a number"),
    ("e.csv", "user,item,timestamp\n1,2,\n", {}, r"e.csv:2: timestamp '' is not a number"),
    ("e.csv", "usr,item\n1,2\n", {},
     r"e.csv:1: the header has no column 'user' \(--user-col\); its columns are "
     r"\['usr', 'item'\]"),
    ("e.csv", "user,item,timestamp\n1,2,3\n", {"time_col": "ts"},
     r"e.csv:1: the header has no column 'ts' \(--time-col\); its columns are "
     r"\['user', 'item', 'timestamp'\]"),
    ("e.csv", "\nuser,item\n", {}, r"e.csv: the file has a header but no interactions"),
    ("e.csv", "user,item,timestamp\n1,2,3\n", {}, r"e.csv: no user has 3 or more interactions$"),
    ("e.csv", "user,item\n1,2\n1,3\n1,2\n", {"min_interactions": 2},
     r"e.csv: no user has 3 or more interactions once users and items with fewer than 2 "
     r"interactions are removed \(min_interactions=2\)"),
    ("e.csv", b"user,item\n\xff,1\n", {}, r"e.csv: not UTF-8 text"),
    ("data.txt", "1,2,3\n", {},
     r"data.txt:1: could not detect the format of '1,2,3'; pass --format \(format=\), one of "
     r"ml-100k, ml-1m, ml-csv, sasrec, csv"),
    ("data.txt", "\n \n", {}, r"data.txt: the file is empty"),
])
def test_bad_files_name_the_line(tmp_path, name, text, kwargs, message):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(rec.DataError, match=message):
        rec.load(path, **kwargs)


@pytest.mark.parametrize("block_bytes", [7, 100, 1 << 24])
def test_an_error_after_many_blocks_names_its_line(tmp_path, monkeypatch, block_bytes):
    monkeypatch.setattr(data, "_BLOCK_BYTES", block_bytes)
    path = tmp_path / "ratings.dat"
    path.write_text("".join(f"1::{i}::5::{i}\n" for i in range(1, 500)) + "1::2::3\n")
    with pytest.raises(rec.DataError, match=r"ratings.dat:500: expected UserID::MovieID"):
        rec.load(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(rec.DataError, match=re.escape(f"{tmp_path / 'nope'}: no such file")):
        rec.load(tmp_path / "nope")
    with pytest.raises(rec.DataError, match="is a directory"):
        rec.load(tmp_path)


@pytest.mark.parametrize("kwargs,message", [
    ({"format": "movielens"}, r"unknown format 'movielens'; the formats are ml-100k"),
    ({"format": "ml-1m", "user_col": "u"}, r"name the columns of a 'csv' file"),
    ({"min_interactions": -1}, r"min_interactions must be an integer >= 0"),
    ({"min_history": 0}, r"min_history must be an integer >= 1"),
    ({"user_col": "user", "item_col": "USER"}, r"the user, item and time columns must differ"),
])
def test_bad_arguments(tmp_path, kwargs, message):
    path = write(tmp_path, "csv")
    with pytest.raises(ValueError, match=message):
        rec.load(path, **kwargs)


def test_formats_constant():
    assert data.FORMATS == ("ml-100k", "ml-1m", "ml-csv", "sasrec", "csv")


@pytest.mark.parametrize("format", ["ml-100k", "ml-1m", "ml-csv"])
@pytest.mark.parametrize("block", [True, False])
def test_ratings_follow_their_events(tmp_path, format, block, monkeypatch):
    if not block:  # the line-by-line reader (a block that numpy does not take)
        monkeypatch.setattr(data, "_plain", lambda text, separators: False)
    dataset = rec.load(write(tmp_path, format), ratings=True)
    half = 0.5 if format == "ml-csv" else 0.0
    # Time order of ROWS' users 2 and 10 (see test_every_format_is_read_in_time_order).
    assert [r.tolist() for r in dataset.ratings] == [[3 + half, 4 + half, 1 + half, 5 + half],
                                                      [2 + half, 4 + half, 2 + half, 2 + half]]
    assert rec.load(write(tmp_path, format)).ratings is None  # only when asked


def test_ratings_survive_the_k_core(tmp_path):
    dataset = rec.load(write(tmp_path, "ml-100k"), ratings=True, min_interactions=2)
    for items, ratings in zip(dataset.items, dataset.ratings):
        assert len(items) == len(ratings)


def test_csv_rating_column_and_bad_ratings(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text("user,item,stars,t\nu,a,4.5,1\nu,b,2,2\nu,c,5,3\n")
    dataset = rec.load(path, rating_col="stars", time_col="t")
    assert dataset.ratings[0].tolist() == [4.5, 2.0, 5.0]
    with pytest.raises(data.DataError, match="no column 'rating'"):
        rec.load(path, ratings=True, time_col="t")
    path.write_text("user,item,stars,t\nu,a,4.5,1\nu,b,x,2\nu,c,5,3\n")
    with pytest.raises(data.DataError, match=r"e.csv:3: rating 'x' is not a number"):
        rec.load(path, rating_col="stars", time_col="t")
    with pytest.raises(data.DataError, match="no ratings"):
        rec.load(write(tmp_path, "sasrec"), ratings=True)
    with pytest.raises(ValueError, match="rating_col"):
        rec.load(write(tmp_path, "ml-100k"), format="ml-100k", rating_col="r")
