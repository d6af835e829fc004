"""The version watcher (issue 54, item 3; cases 12 and 13): a version is loaded only once its
directory has stopped changing, a failed load shows in the model's status with its error and
in the log, and is tried again when the directory changes; only ASCII-digit names are versions;
nothing (odd names, the model directory renamed away for a moment) stops the watcher.

``Versions.poll`` is called by hand where the order of events matters (no timing involved);
the server-level tests poll every 0.2 s and wait for what they expect with a deadline."""
import logging
import os
import shutil
import time

import pytest
from test_server import _apis, _export, _Server

from recops_tf.serving.models import Versions, version_number

DEADLINE = 60  # seconds; what is awaited takes a few polls and one load (about a second)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """One tiny export of `recops-tf train` (copied into each test's model directory)."""
    path = tmp_path_factory.mktemp("export") / "e"
    _export(path)
    return path


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.INFO, logger="recops_tf.serving")
    return caplog


def _logged(caplog, *words):
    return [r.getMessage() for r in caplog.records
            if r.name == "recops_tf.serving" and all(w in r.getMessage() for w in words)]


def _copy_in(export_dir, path):
    """`export_dir` appears whole as `path` (written beside it, then renamed in)."""
    shutil.copytree(export_dir, str(path) + ".tmp")
    os.rename(str(path) + ".tmp", path)


def _files(root):
    """The files of an export, saved_model.pb first (the worst order for a reader) and the
    variables last."""
    found = sorted(os.path.relpath(os.path.join(d, f), root)
                   for d, _, files in os.walk(root) for f in files)
    return sorted(found, key=lambda f: (not f.endswith("saved_model.pb"), "variables" in f))


def _truncate(path):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 3])


def _states(versions):
    return [(n, s.state) for n, s in versions.status()]


def _wait(what, ask):
    deadline = time.monotonic() + DEADLINE
    while True:
        got = ask()
        if got or time.monotonic() > deadline:
            assert got, f"still not {what} after {DEADLINE} s"
            return got
        time.sleep(0.05)


def test_version_names_are_ascii_digits_within_int64():
    assert [version_number(n) for n in ("1", "007", "12", str((1 << 63) - 1))] == [
        1, 7, 12, (1 << 63) - 1]
    for name in ("³", "٣", "1³", "0", "-1", "+1", " 1", "1 ", "1\n", "1.0", "1e3", "0x1",
                 "", "saved_model", str(1 << 63), "9" * 5000):
        assert version_number(name) is None, name


def test_a_version_copied_file_by_file_loads_only_once_complete(tmp_path, export_dir, log):
    """Case 12, the non-atomic copy: while files keep appearing nothing is loaded (no failed
    load of half a version); a copy that pauses half-way fails to load, says why, and is
    loaded once the rest arrives and the directory is quiet for a poll."""
    base = tmp_path / "m"
    _copy_in(export_dir, base / "1")
    versions = Versions(str(base))
    assert _states(versions) == [(1, "AVAILABLE")]
    files = _files(export_dir)
    first = [f for f in files if "variables" not in f]  # all but the weights
    for name in first:  # a copy in progress: a file between two polls
        os.makedirs(os.path.dirname(base / "2" / name), exist_ok=True)
        shutil.copy2(export_dir / name, base / "2" / name)
        assert versions.poll() and versions.get().number == 1
        assert _states(versions) == [(2, "START"), (1, "AVAILABLE")]
    assert not _logged(log, "failed")
    versions.poll()  # quiet since the last poll: loaded, and a version without weights fails
    (_, state), _ = versions.status()
    assert state.state == "END" and state.error_code != "OK" and state.error_message, state
    assert versions.get().number == 1
    assert _logged(log, "version 2", "failed to load", state.error_message)
    versions.poll()  # failed as it is: not tried again while it does not change
    assert len(_logged(log, "version 2", "failed to load")) == 1
    for name in files[len(first):]:
        os.makedirs(os.path.dirname(base / "2" / name), exist_ok=True)
        shutil.copy2(export_dir / name, base / "2" / name)
        versions.poll()
        assert versions.get().number == 1 and _states(versions)[0] == (2, "START")
    versions.poll()
    assert versions.get().number == 2
    assert _states(versions) == [(2, "AVAILABLE"), (1, "END")]
    assert [s.error_code for _, s in versions.status()] == ["OK", "OK"]
    assert len(_logged(log, "version 2", "failed to load")) == 1
    assert _logged(log, "serving version 2")


def test_at_start_a_broken_newest_version_gives_way_to_the_one_before(tmp_path, export_dir):
    base = tmp_path / "m"
    _copy_in(export_dir, base / "1")
    _copy_in(export_dir, base / "3")
    _truncate(base / "3" / "saved_model" / "saved_model.pb")
    (base / "5").mkdir()  # empty
    versions = Versions(str(base))
    assert versions.get().number == 1
    assert _states(versions) == [(5, "END"), (3, "END"), (1, "AVAILABLE")]
    five, three = versions.status(5)[0][1], versions.status(3)[0][1]
    assert five.error_code == "NOT_FOUND" and "no saved_model.pb" in five.error_message
    assert three.error_code != "OK" and three.error_message


def test_a_failed_version_shows_its_error_and_is_loaded_once_replaced(tmp_path, export_dir,
                                                                      log):
    """Case 12: a truncated DIR/4 is in the model's status (REST and gRPC) as END with its
    error, logged, answered 404 with the reason; once a valid export replaces it, it serves."""
    base = tmp_path / "m"
    _copy_in(export_dir, base / "1")
    server = _Server(base)  # polls every 0.2 s
    try:
        shutil.copytree(export_dir, base / "4.tmp")
        _truncate(base / "4.tmp" / "saved_model" / "saved_model.pb")
        os.rename(base / "4.tmp", base / "4")

        def failed():
            status, body = server.http("/v1/models/default/versions/4")
            return status == 200 and body["model_version_status"][0]["state"] == "END" and body

        (four,) = _wait("failed", failed)["model_version_status"]
        assert four["version"] == "4" and four["status"]["error_code"] != "OK", four
        message = four["status"]["error_message"]
        assert message and "Traceback" not in message, four
        assert _logged(log, "version 4", "failed to load", message)
        status, body = server.http("/v1/models/default")
        assert [(v["version"], v["state"]) for v in body["model_version_status"]] == [
            ("4", "END"), ("1", "AVAILABLE")]
        request = _apis.GetModelStatusRequest()
        request.model_spec.name = "default"
        request.model_spec.version.value = 4
        (got,) = server.stubs.GetModelStatus(request, timeout=60).model_version_status
        assert got.state == _apis.ModelVersionStatus.END and got.status.error_code != 0
        assert got.status.error_message == message
        status, answer = server.http("/v1/models/default/versions/4:predict", {"instances": [
            {"items": [1], "timestamps": [1]}]})
        assert status == 404 and "load failed" in answer["error"], answer
        assert server.http("/v1/models/default:recommend", {
            "user_id": "u", "items": ["i1"]})[1]["model_version"] == "1"
        # The fix: a valid export in its place.
        shutil.rmtree(base / "4")
        _copy_in(export_dir, base / "4")
        _wait("served", lambda: server.http("/v1/models/default:recommend", {
            "user_id": "u", "items": ["i2"]})[1].get("model_version") == "4")
        status, body = server.http("/v1/models/default")
        assert [(v["version"], v["state"], v["status"]["error_code"])
                for v in body["model_version_status"]] == [("4", "AVAILABLE", "OK"),
                                                           ("1", "END", "OK")]
    finally:
        server.close()


def test_the_watcher_survives_odd_names_and_its_directory_renamed_away(tmp_path, export_dir,
                                                                        log):
    """Case 13: directories named by non-ASCII digits ("³": int() refuses it; "٣": int()
    reads 3), a number past int64, a file named 6, and the model directory renamed away for a
    moment: the watcher logs what failed, keeps polling, and loads the next version."""
    base = tmp_path / "m"
    _copy_in(export_dir, base / "1")
    server = _Server(base)  # polls every 0.2 s
    try:
        (base / "³").mkdir()
        _copy_in(export_dir, base / "٣")
        (base / ("9" * 30)).mkdir()
        (base / "6").write_text("not a version")
        os.rename(base, tmp_path / "away")
        _wait("logged", lambda: _logged(log, "looking for versions", "failed",
                                        "still serving version 1"))
        os.rename(tmp_path / "away", base)
        _wait("logged", lambda: _logged(log, "works again"))
        assert len(_logged(log, "looking for versions", "failed")) == 1  # once, not a poll
        _copy_in(export_dir, base / "2")
        _wait("served", lambda: server.http("/v1/models/default")[1][
            "model_version_status"][0] == {"version": "2", "state": "AVAILABLE",
                                           "status": {"error_code": "OK",
                                                      "error_message": ""}})
        status, body = server.http("/v1/models/default")
        assert [(v["version"], v["state"]) for v in body["model_version_status"]] == [
            ("2", "AVAILABLE"), ("1", "END")]
        assert server.http("/healthz") == (200, {"status": "ready"})
        assert server.running.poller.is_alive()
    finally:
        server.close()
