"""Interaction data for the sequential recommenders: interaction files (MovieLens 100K / 1M /
10M / 20M / 25M / 32M, SASRec's preprocessed Amazon and Steam files, CSV files with named
columns).

A data set is per-user histories ordered by time: item ids are mapped to ``1..num_items``
(0 is never an item), timestamps are int64 seconds (or positions, when the file has no time).
Users with fewer than 3 interactions are dropped (leave-one-out needs a training, a validation
and a test item: ``evaluation.Split``). docs/data.md describes the formats and the
preprocessing; ``synthetic.py`` makes the built-in synthetic set.
"""
import csv
import dataclasses
import io
import itertools
import math
import os
import re
from typing import List

import numpy as np


@dataclasses.dataclass
class Dataset:
    items: List[np.ndarray]  # per user, int64 item ids in 1..num_items, time order
    timestamps: List[np.ndarray]  # per user, int64 seconds, non-decreasing
    num_items: int
    source: str
    item_names: np.ndarray = None  # original ids of items 1..num_items (index i - 1)
    user_names: np.ndarray = None  # original ids of the users, in the order of `items`
    has_time: bool = True  # False: the file had no time; timestamps are positions 0, 1, ...
    ratings: List[np.ndarray] = None  # per user, float32 ratings (``load(ratings=True)``)

    @property
    def num_users(self):
        return len(self.items)


class DataError(ValueError):
    """A data file that cannot be read; the message names the file and line."""


ML_100K, ML_1M, ML_CSV, SASREC, CSV = "ml-100k", "ml-1m", "ml-csv", "sasrec", "csv"
FORMATS = (ML_100K, ML_1M, ML_CSV, SASREC, CSV)
_ENCODINGS = {ML_100K: "latin-1", ML_1M: "latin-1", ML_CSV: "utf-8-sig", SASREC: "utf-8-sig",
              CSV: "utf-8-sig"}
_BLOCK_BYTES = 1 << 24  # numpy parses the lines about 16 MB at a time
_BLOCK_ROWS = 1 << 18  # rows the line-by-line reader collects before making arrays of them
_EXACT = 2.0 ** 53  # floats below this are exact integers
_INT64 = (-2 ** 63, 2 ** 63 - 1)
_LEADING_ZERO = re.compile(rb"\n0[0-9]")


def load(path, format=None, user_col=None, item_col=None, time_col=None, min_interactions=0,
         min_history=3, ratings=False, rating_col=None):
    """Reads an interaction file into per-user histories in time order.

    Formats (`FORMATS`; docs/data.md has examples):

    - ``"ml-100k"``: MovieLens 100K ``u.data``, ``user item rating timestamp`` separated by
      tabs (or any whitespace).
    - ``"ml-1m"``: MovieLens 1M / 10M ``ratings.dat``, ``UserID::MovieID::Rating::Timestamp``.
    - ``"ml-csv"``: MovieLens 20M / 25M / 32M ``ratings.csv``, the header
      ``userId,movieId,rating,timestamp``.
    - ``"sasrec"``: SASRec's preprocessed files (Amazon Beauty / Games, Steam), ``user item``
      per line, each user's lines in time order and no time: positions are the timestamps.
    - ``"csv"``: a CSV file with a header; the columns are found by name, case-insensitively
      (`user_col`, `item_col`, `time_col`; by default ``user``, ``item``, ``timestamp``), other
      columns are ignored. Without a time column, file order is the time order.

    Timestamps may be integers or floats (floored to int64 seconds).

    Preprocessing, as in SASRec and generative-recommenders: each user's interactions are
    sorted by time with a stable sort (equal times keep their file order); a repeated
    (user, item) pair stays as separate events; with ``min_interactions=k > 0`` users and items
    with fewer than k interactions are removed, again and again until every remaining one has
    k or more (the k-core); then users with fewer than `min_history` interactions are dropped
    (leave-one-out needs a training, a validation and a test item), which can leave an item
    with fewer than k. Items are numbered ``1..num_items`` and users ordered by their original
    ids, numerically when all of them are integers (written as ``str(int(x))`` writes them),
    else as strings, so the numbering does not depend on the order of the file.

    Args:
      path: the file.
      format: one of `FORMATS`, or None to detect it from the first non-empty line; None with
        a column name given means ``"csv"``.
      user_col, item_col, time_col: the columns of a ``"csv"`` file. A `time_col` given must
        exist; the default ``timestamp`` may be missing.
      min_interactions: k of the k-core filter; 0 keeps every user and item.
      min_history: the fewest interactions a user keeps (3 by default).
      ratings: also read each event's rating (or any numeric action value) into
        ``Dataset.ratings``: MovieLens' rating field, a CSV's `rating_col` (default
        ``rating``). SASRec's files have none (a DataError).
      rating_col: the rating column of a ``"csv"`` file (implies `ratings`).

    Returns:
      A `Dataset` with `item_names` and `user_names` (original ids as str) and `has_time`
      False when the file had no time (the timestamps are then 0, 1, 2, ... per user).

    Raises:
      DataError: the file is missing, empty or of no known format, a line is malformed (the
        message names the file and line, what was expected and what was found), or no user
        is left.
      ValueError: an unknown format, columns given for a format other than ``"csv"``, or a
        negative `min_interactions` or `min_history` below 1.
    """
    path = os.fspath(path)
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; the formats are {', '.join(FORMATS)}")
    columns = (user_col, item_col, time_col)
    ratings = bool(ratings) or rating_col is not None
    if any(c is not None for c in columns + (rating_col,)):
        if format not in (None, CSV):
            raise ValueError(f"user_col, item_col, time_col and rating_col name the columns "
                             f"of a 'csv' file; the format {format!r} has fixed columns")
        format = CSV
    if isinstance(min_interactions, bool) or int(min_interactions) != min_interactions \
            or min_interactions < 0:
        raise ValueError(f"min_interactions must be an integer >= 0, got {min_interactions!r}")
    if isinstance(min_history, bool) or int(min_history) != min_history or min_history < 1:
        raise ValueError(f"min_history must be an integer >= 1, got {min_history!r}")
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    if os.path.isdir(path):
        raise DataError(f"{path}: is a directory; pass the ratings file in it (u.data, "
                        f"ratings.dat or ratings.csv)")
    first = _first_line(path)
    if first is None:
        raise DataError(f"{path}: the file is empty")
    if format is None:
        format = _detect(path, *first)
    if ratings and format == SASREC:
        raise DataError(f"{path}: SASRec's 'user item' files have no ratings")
    try:
        with open(path, encoding=_ENCODINGS[format]) as f:
            if format in (ML_CSV, CSV):
                users, items, stamps, values = _read_csv(path, f, format == ML_CSV, *columns,
                                                         rating_col if ratings else False)
            else:
                parse, rows, has_time = _LINE_FORMATS[format]
                if ratings:
                    parse = _RATED_PARSERS[format]
                users, items, stamps, values = _read(path, f, 1, parse, rows, has_time,
                                                     ratings)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason}: byte "
                        f"{e.object[e.start:e.start + 1]!r}); save the file as UTF-8") from None
    if not len(users):
        raise DataError(f"{path}: the file has a header but no interactions")
    return _preprocess(path, users, items, stamps, int(min_interactions), int(min_history),
                       values)


def _first_line(path):
    """(line number, stripped text) of the first non-empty line, or None."""
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                return number, line.strip()
    return None


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _detect(path, number, line):
    if "::" in line:
        return ML_1M
    fields = [f.strip() for f in next(csv.reader([line]))]
    if "userId" in fields and "movieId" in fields:
        return ML_CSV
    if len(fields) > 1 and not all(map(_is_number, fields)):
        return CSV
    fields = line.split()
    if len(fields) == 4 and all(map(_is_number, fields)):
        return ML_100K
    if len(fields) == 2:
        return SASREC
    raise DataError(f"{path}:{number}: could not detect the format of {line[:80]!r}; pass "
                    f"--format (format=), one of {', '.join(FORMATS)}")


# Line by line: every malformed line is an error naming it. Each reader yields
# (line number, user, item, timestamp text or None, rating text or None).

def _ml_1m_rows(path, lines, number):
    for number, line in enumerate(lines, number):
        line = line.strip()
        if not line:
            continue
        parts = line.split("::")
        if len(parts) != 4:
            raise DataError(f"{path}:{number}: expected UserID::MovieID::Rating::Timestamp, "
                            f"got {line[:80]!r}")
        yield number, parts[0].strip(), parts[1].strip(), parts[3].strip(), parts[2].strip()


def _ml_100k_rows(path, lines, number):
    for number, line in enumerate(lines, number):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4:
            raise DataError(f"{path}:{number}: expected 4 tab-separated fields (user item "
                            f"rating timestamp), got {line.strip()[:80]!r}")
        yield number, parts[0], parts[1], parts[3], parts[2]


def _sasrec_rows(path, lines, number):
    for number, line in enumerate(lines, number):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise DataError(f"{path}:{number}: expected 2 fields separated by whitespace (user "
                            f"item), got {line.strip()[:80]!r}")
        yield number, parts[0], parts[1], None, None


def _csv_rows(path, lines, first, columns, width):
    reader = csv.reader(lines)
    user, item, stamp, rating = columns
    consumed = 0
    try:
        for row in reader:
            number, consumed = first + consumed, reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != width:
                raise DataError(f"{path}:{number}: expected {width} columns as in the header, "
                                f"got {len(row)}: {str(row)[:80]}")
            yield (number, row[user].strip(), row[item].strip(),
                   None if stamp is None else row[stamp].strip(),
                   None if rating is None else row[rating].strip())
    except csv.Error as e:
        raise DataError(f"{path}:{first + reader.line_num}: {e}") from None


def _timestamp(path, number, text):
    try:
        value = int(text)
    except ValueError:
        try:
            real = float(text)
        except ValueError:
            real = math.nan
        if not math.isfinite(real):
            raise DataError(f"{path}:{number}: timestamp {text!r} is not a number") from None
        value = math.floor(real)
    if not _INT64[0] <= value <= _INT64[1]:
        raise DataError(f"{path}:{number}: timestamp {text!r} does not fit in int64")
    return value


def _rating(path, number, text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise DataError(f"{path}:{number}: rating {text!r} is not a number")
    return value


def _ids(names):
    """The ids of a block as an array: int64 when every one is an integer written as
    ``str(int(x))`` writes it (so the integer gives the name back), else str."""
    array = np.array(names, dtype=str)
    try:
        ints = array.astype(np.int64)
    except (ValueError, OverflowError):
        return array
    return ints if np.array_equal(ints.astype(str), array) else array


def _collect(path, rows, has_time, rated=False):
    """Arrays (users, items, timestamps or None, ratings or None), a block of rows at a time,
    of the rows."""
    parts, users, items, stamps, values = [], [], [], [], []

    def block():
        return (_ids(users), _ids(items), np.array(stamps, np.int64) if has_time else None,
                np.array(values, np.float64) if rated else None)

    for number, user, item, stamp, value in rows:
        if not user or not item:
            raise DataError(f"{path}:{number}: empty user or item")
        users.append(user)
        items.append(item)
        if has_time:
            stamps.append(_timestamp(path, number, stamp))
        if rated:
            values.append(_rating(path, number, value))
        if len(users) == _BLOCK_ROWS:
            parts.append(block())
            users, items, stamps, values = [], [], [], []
    parts.append(block())
    return parts


# Blocks at a time: numpy parses blocks of plain numbers (the large MovieLens files) at C
# speed. A block is plain when it holds digits, '.', newlines and separators only and no field
# has a leading zero: numpy then reads each field as int() or float() would and the ids print
# back as written, so the result is the line-by-line reader's. From the first block that is
# not plain (or that numpy refuses: a wrong number of fields, an empty field) to the end of
# the file, the line-by-line reader takes over and names the line of any error.

def _plain(text, separators):
    if not text.isascii():
        return False
    data = text.encode("ascii")
    if data.translate(None, b"0123456789.\n" + separators):
        return False
    # A leading zero: a 0 and a digit at the start of a line or after a separator.
    data = b"\n" + data.translate(bytes.maketrans(separators, b"\n" * len(separators)))
    return _LEADING_ZERO.search(data) is None


def _block_parser(delimiter, separators, fields, colons=False):
    """A parser of blocks of lines with `fields` per line ('u' user, 'i' item, 't' time,
    'r' rating, '-' ignored), separated by `delimiter` (None: whitespace), that returns
    (users, items, timestamps or None, ratings or None) or None when the block is not plain.
    `colons`: '::' separates."""
    kinds = {"u": np.int64, "i": np.int64, "t": np.int64, "r": np.float64, "-": np.float64}
    dtypes = [np.dtype([(f"f{j}", kinds[kind]) for j, kind in enumerate(fields)])]
    if "t" in fields:  # integer times parse faster; float times take a second try
        kinds["t"] = np.float64
        dtypes.append(np.dtype([(f"f{j}", kinds[kind]) for j, kind in enumerate(fields)]))
    user, item = f"f{fields.index('u')}", f"f{fields.index('i')}"
    stamp = f"f{fields.index('t')}" if "t" in fields else None
    rating = f"f{fields.index('r')}" if "r" in fields else None

    def parse(text):
        if colons:
            if "\t" in text:
                return None
            text = text.replace("::", "\t")
            if ":" in text:
                return None
        if not _plain(text, separators):
            return None
        if not text.strip():
            table = np.zeros(0, dtypes[0])
        else:
            for dtype in dtypes:
                try:
                    table = np.loadtxt(io.StringIO(text), dtype=dtype, delimiter=delimiter,
                                       comments=None, ndmin=1)
                    break
                except (ValueError, OverflowError):
                    continue
            else:
                return None
        times = None if stamp is None else table[stamp]
        if times is not None and times.dtype.kind == "f":
            if not np.all(np.abs(times) < _EXACT):
                return None
            times = np.floor(times).astype(np.int64)
        values = None if rating is None else table[rating].copy()
        if values is not None and not np.all(np.isfinite(values)):
            return None  # the line-by-line reader names the line
        # Copies, so that the table (with the ignored columns) is freed.
        return (table[user].copy(), table[item].copy(),
                None if times is None else times.copy(), values)

    return parse


def _concat(parts):
    if any(p is None for p in parts):
        return None
    if all(p.dtype.kind == "i" for p in parts):
        return np.concatenate(parts)
    return np.concatenate([p.astype(str) if p.dtype.kind == "i" else p for p in parts])


def _read(path, f, number, parse, rows, has_time, rated=False):
    """(users, items, timestamps or None, ratings or None) of the lines of `f`, the first
    being line `number`: `parse` takes blocks of lines until one is not plain, then `rows`
    reads the rest line by line."""
    parts = [(np.zeros(0, np.int64), np.zeros(0, np.int64),
              np.zeros(0, np.int64) if has_time else None,
              np.zeros(0, np.float64) if rated else None)]
    carry = ""  # the start of a line that the next read completes
    while True:
        chunk = f.read(_BLOCK_BYTES)
        if chunk:
            cut = chunk.rfind("\n") + 1
            if not cut:
                carry += chunk
                continue
            block, carry = carry + chunk[:cut], chunk[cut:]
        elif carry:
            block, carry = carry, ""
        else:
            break
        parsed = parse(block)
        if parsed is None:
            lines = itertools.chain(io.StringIO(block + carry + f.readline()), f)
            parts += _collect(path, rows(path, lines, number), has_time, rated)
            break
        parts.append(parsed)
        number += block.count("\n")
    return tuple(_concat([p[k] for p in parts]) for k in range(4))


_LINE_FORMATS = {  # format: (block parser, line-by-line reader, has time)
    ML_100K: (_block_parser(None, b" \t", "ui-t"), _ml_100k_rows, True),
    ML_1M: (_block_parser("\t", b"\t", "ui-t", colons=True), _ml_1m_rows, True),
    SASREC: (_block_parser(None, b" \t", "ui"), _sasrec_rows, False),
}
_RATED_PARSERS = {ML_100K: _block_parser(None, b" \t", "uirt"),
                  ML_1M: _block_parser("\t", b"\t", "uirt", colons=True)}


def _read_csv(path, f, movielens, user_col, item_col, time_col, rating_col=False):
    """`rating_col`: False (no ratings), None (the default column) or a column name."""
    for number, line in enumerate(f, 1):
        if line.strip():
            break
    header = [h.strip() for h in next(csv.reader([line]))]
    if movielens:
        if not {"userId", "movieId", "timestamp"} <= set(header):
            raise DataError(f"{path}:{number}: expected the header userId,movieId,rating,"
                            f"timestamp, got {line.strip()[:80]!r}")
        columns = [header.index(name) for name in ("userId", "movieId", "timestamp")]
        if rating_col is not False:
            if "rating" not in header:
                raise DataError(f"{path}:{number}: the header has no rating column")
            columns.append(header.index("rating"))
    else:
        lower = [h.lower() for h in header]
        columns = []
        for name, default, flag in ((user_col, "user", "--user-col"),
                                    (item_col, "item", "--item-col"),
                                    (time_col, "timestamp", "--time-col")):
            if (name or default).lower() in lower:
                columns.append(lower.index((name or default).lower()))
            elif name is None and default == "timestamp":
                columns.append(None)
            else:
                raise DataError(f"{path}:{number}: the header has no column "
                                f"{name or default!r} ({flag}); its columns are {header}")
        if rating_col is not False:
            name = (rating_col or "rating").lower()
            if name not in lower:
                raise DataError(f"{path}:{number}: the header has no column "
                                f"{rating_col or 'rating'!r} (--rating-col); its columns are "
                                f"{header}")
            columns.append(lower.index(name))
        chosen = [c for c in columns if c is not None]
        if len(set(chosen)) != len(chosen):
            what = "item and time" if rating_col is False else "item, time and rating"
            raise ValueError(f"the user, {what} columns must differ, got "
                             f"{[header[c] for c in chosen]}")
    fields = ["-"] * len(header)
    for kind, column in zip("uitr", columns):
        if column is not None:
            fields[column] = kind

    def rows(path, lines, first):
        return _csv_rows(path, lines, first, (columns + [None])[:4], len(header))

    return _read(path, f, number + 1, _block_parser(",", b",", "".join(fields)), rows,
                 columns[2] is not None, rating_col is not False)


def _index(ids):
    """(the distinct ids in ascending order, the position of every id among them)."""
    if ids.dtype.kind == "i" and len(ids):
        low, high = int(ids.min()), int(ids.max())
        if high - low <= 4 * len(ids) + 4096:  # dense ids: a table instead of a sort
            offsets = ids - low
            present = np.zeros(high - low + 1, bool)
            present[offsets] = True
            return np.flatnonzero(present) + low, (np.cumsum(present) - 1)[offsets]
    return np.unique(ids, return_inverse=True)


def _preprocess(path, users, items, stamps, min_interactions, min_history, values=None):
    user_names, user = _index(users)
    item_names, item = _index(items)
    rows = np.arange(len(user))  # file order
    k = min_interactions
    while k > 0:  # the k-core: each round removes the users and items below k
        keep = ((np.bincount(user, minlength=len(user_names)) >= k)[user]
                & (np.bincount(item, minlength=len(item_names)) >= k)[item])
        if keep.all():
            break
        rows, user, item = rows[keep], user[keep], item[keep]
    keep = (np.bincount(user, minlength=len(user_names)) >= min_history)[user]
    rows, user, item = rows[keep], user[keep], item[keep]
    if not len(rows):
        extra = (f" once users and items with fewer than {k} interactions are removed "
                 f"(min_interactions={k})" if k else "")
        raise DataError(f"{path}: no user has {min_history} or more interactions{extra}")
    # Stable sorts of the rows (in file order) by user and time: equal times keep file order.
    if stamps is None:
        order = np.argsort(user, kind="stable")
    else:
        times = stamps[rows]
        low, span = int(times.min()), int(times.max()) - int(times.min()) + 1
        if len(user_names) * span < 2 ** 63:  # one sort of a (user, time) key
            order = np.argsort(user * span + (times - low), kind="stable")
        else:
            order = np.argsort(times, kind="stable")
            order = order[np.argsort(user[order], kind="stable")]
    kept_users, user = _index(user[order])
    kept_items, item = _index(item[order])
    counts = np.bincount(user)
    ends = np.cumsum(counts)
    if stamps is not None:
        times = stamps[rows[order]]
    else:
        times = np.arange(len(rows)) - np.repeat(ends - counts, counts)
    bounds = list(zip((ends - counts).tolist(), ends.tolist()))  # (slices: np.split is slow)
    item, times = item.astype(np.int64) + 1, times.astype(np.int64)
    rated = None
    if values is not None:
        values = values[rows[order]].astype(np.float32)
        rated = [values[a:b] for a, b in bounds]
    return Dataset([item[a:b] for a, b in bounds], [times[a:b] for a, b in bounds],
                   len(kept_items), path,
                   item_names=item_names[kept_items].astype(str),
                   user_names=user_names[kept_users].astype(str),
                   has_time=stamps is not None, ratings=rated)
