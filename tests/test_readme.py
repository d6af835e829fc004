"""The front door cannot rot (issue 56, item 4): every fenced code block of README.md and of
docs/README.md (the docs' index) is run here as written, or listed in BLOCKS as not run, with
the reason and the check that stands in for the run. A block that BLOCKS does not know fails
the test, and so does an entry of BLOCKS that no block matches any more.

- python blocks run in a fresh interpreter, in a temporary directory;
- bash blocks run in bash (`set -e`) with HOME a temporary directory, changed only by the
  substitutions in SUBSTITUTIONS, each visible there and required to apply exactly as often as
  it says: the download replaced by a tiny MovieLens-100K-like folder (40 users, 60 items,
  u.data and u.user) written by the test, 20 training steps, the server on a free port;
- the install and test commands are not run (they are CI's own legs): they must be commands
  .ci/run runs, and the wheel's line must name the project's version and TensorFlow pin.

The quick starts' blocks share the tiny data folder; the whole file takes about a minute.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRONT_DOORS = ("README.md", os.path.join("docs", "README.md"))


def _read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def _blocks():
    """(file, language, code) of every fenced block of the front-door files, in order."""
    found = []
    for path in FRONT_DOORS:
        for language, code in re.findall(r"^```(\w*)\n(.*?)^```", _read(path), re.S | re.M):
            found.append((path, language, code))
    return found


def _pyproject():
    """The project's version and its `cpu` extra's TensorFlow pin (no tomllib on Python 3.10)."""
    text = _read("pyproject.toml")
    version = re.search(r'^version = "([^"]+)"$', text, re.M).group(1)
    tensorflow = re.search(r'^cpu = \["([^"]+)"\]$', text, re.M).group(1)
    return version, tensorflow


def _ci_commands():
    """The commands of .ci/run, one a line (comments and blank lines left out)."""
    lines = [line.strip() for line in _read(os.path.join(".ci", "run")).splitlines()]
    return {line for line in lines if line and not line.startswith("#")}


def _commands(code):
    """The shell commands of a block: its lines, split at `&&`, comments dropped."""
    out = []
    for line in code.splitlines():
        line = line.split("  #", 1)[0].strip()
        out += [part.strip() for part in line.split("&&") if part.strip()]
    return out


# -- what is changed before a block runs -------------------------------------------------------

QUICK_START_2 = ("curl -sLo ~/ml-100k.zip https://files.grouplens.org/datasets/movielens/"
                 "ml-100k.zip && python -m zipfile -e ~/ml-100k.zip ~")
QUICK_START_3 = "recops-tf train --task ranking --data ~/ml-100k/u.data --out ~/recops-runs/rank/1"

# Per bash block (by its first line): each (text in the block, what it becomes, how many times
# it occurs), the only changes made to the block before it runs.
SUBSTITUTIONS = {
    QUICK_START_2: [
        # The download (MovieLens-100K, 5 MB): the tiny folder the `home` fixture wrote instead.
        (QUICK_START_2, "true  # the tiny ~/ml-100k written by the test", 1),
        # 20 steps, not the defaults' thousands.
        ("--out ~/recops-runs/ml-100k/1", "--out ~/recops-runs/ml-100k/1 --max-steps 20", 1),
        # A free port for REST (8501 may be taken on a test machine), any free one for gRPC.
        ("recops-tf serve --model ~/recops-runs/ml-100k",
         "recops-tf serve --model ~/recops-runs/ml-100k --rest-port {port} --grpc-port 0", 1),
        ("localhost:8501", "localhost:{port}", 2),
    ],
    QUICK_START_3: [
        # 20 steps; --max-steps does not bound the two-tower baseline's retrieval model
        # (recops-tf train's defaults, about a minute here): the ranker and the DLRM-style
        # baseline only.
        ("--out ~/recops-runs/rank/1",
         "--out ~/recops-runs/rank/1 --max-steps 20 --baselines dlrm", 1),
    ],
}


# -- the tiny data and the runners -------------------------------------------------------------

def _tiny_movielens(home, users=40, items=60, events=15, seed=0):
    """~/ml-100k/u.data (user item rating timestamp, ratings from an item quality and a user
    bias) and u.user, in MovieLens-100K's formats: what the quick starts download, tiny."""
    rng = np.random.default_rng(seed)
    quality, bias = rng.normal(0, 1, items + 1), rng.normal(0, 0.7, users + 1)
    lines = []
    for u in range(1, users + 1):
        for j, i in enumerate(rng.choice(np.arange(1, items + 1), events, replace=False)):
            r = int(np.clip(np.round(3 + quality[i] + bias[u] + rng.normal(0, 0.3)), 1, 5))
            lines.append(f"{u}\t{i}\t{r}\t{880000000 + 1000 * u + 17 * j}\n")
    folder = os.path.join(home, "ml-100k")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "u.data"), "w") as f:
        f.write("".join(lines))
    with open(os.path.join(folder, "u.user"), "w") as f:
        f.write("".join(f"{u}|{20 + u}|{'MF'[u % 2]}|{['writer', 'artist', 'other'][u % 3]}|"
                        f"{10000 + u}\n" for u in range(1, users + 1)))


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """The HOME the blocks run in (shared: quick start 3 reads quick start 2's data)."""
    path = str(tmp_path_factory.mktemp("home"))
    _tiny_movielens(path)
    return path


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home):
    env = dict(os.environ, HOME=home, TF_CPP_MIN_LOG_LEVEL="2")
    # This interpreter's scripts (recops-tf, python) first, as an activated venv has them.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _run(argv, home, timeout):
    """Runs argv in its own process group (a server a block starts in the background is in
    it), which is ended when the block has run, whatever happened."""
    proc = subprocess.Popen(argv, cwd=home, env=_env(home), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{argv[-1]}: not done in {timeout} s; its output:\n{out[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"exit status {proc.returncode}; the output:\n{out[-4000:]}"
    return out


def run_python(code, home):
    path = os.path.join(home, "block.py")
    with open(path, "w") as f:
        f.write(code)
    return _run([sys.executable, path], home, timeout=180)


def run_bash(code, home):
    if shutil.which("curl") is None and "curl " in code:
        pytest.skip("curl is not installed")
    port = _free_port()
    for old, new, count in SUBSTITUTIONS.get(_key(code), []):
        new = new.format(port=port)
        assert code.count(old) == count, (
            f"the substitution of {old!r} applies {code.count(old)} times, not {count}: the "
            "block changed; update SUBSTITUTIONS")
        code = code.replace(old, new)
    path = os.path.join(home, "block.sh")
    with open(path, "w") as f:
        f.write("set -e\n" + code)
    return _run(["bash", path], home, timeout=300)


# -- the checks that stand in for a run ----------------------------------------------------------

def check_wheel_block(code, home):
    install, version_line = code.strip().splitlines()
    version, tensorflow = _pyproject()
    assert install == (f"pip install {tensorflow} && pip install "
                       f"recops_tf-{version}-cp311-cp311-manylinux_2_34_x86_64.whl")
    # What builds and checks that wheel, as the README's next paragraph says.
    readme = _read("README.md")
    for script in ("tools/build_wheel.sh", "tools/wheel_smoke.sh"):
        assert f"bash {script}" in readme and os.path.isfile(os.path.join(ROOT, script))
        assert f"bash {script}" in _read(os.path.join(".ci", "run"))
    # The block's second line does run: the version the wheel's name promises.
    assert version_line == "recops-tf --version"
    out = _run(["recops-tf", "--version"], home, timeout=60)
    assert out.strip() == f"recops_tf {version}"
    return out


def check_ci_block(code, home):
    ci = _ci_commands()
    for command in _commands(code):
        assert command in ci, f"{command!r} is not a command of .ci/run"
    assert 'pip install -e ".[cpu,test]"' in _commands(code)
    assert "python -m pytest" in _commands(code)


# -- the blocks -------------------------------------------------------------------------------

# The first line of each block -> (how it is checked, why not run or None, what its output
# must hold).
BLOCKS = {
    "pip install tensorflow-cpu==2.21.0 && pip install "
    "recops_tf-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl":
        (check_wheel_block, "installs a wheel into the environment: tools/wheel_smoke.sh does "
         "that in a fresh venv in CI's wheel leg", ["recops_tf "]),
    'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[cpu,test]"':
        (check_ci_block, "the install and the test suite (this test is part of it) are CI's "
         "own legs", []),
    "import tensorflow as tf":
        (run_python, None, ["(5, 2, 16) (1000, 32)"]),
    QUICK_START_2:
        (run_bash, None, ["exported: ", '{"predictions":']),
    QUICK_START_3:
        (run_bash, None, ["hstu step 20", "dlrm step 20",
                          "(SavedModel: serving_default and rank)"]),
}


def _key(code):
    return code.splitlines()[0].strip() if code.strip() else ""


def test_every_block_is_run_or_said_why_not():
    known = set(BLOCKS)
    seen = [_key(code) for _, _, code in _blocks()]
    unknown = [(path, key) for (path, _, code), key in zip(_blocks(), seen) if key not in known]
    assert not unknown, (
        f"blocks that tests/test_readme.py neither runs nor explains: {unknown}; add each to "
        "BLOCKS (run it, or say why not and check it another way)")
    assert len(seen) == len(set(seen)), "two blocks start with the same line"
    stale = known - set(seen)
    assert set(SUBSTITUTIONS) <= known
    assert not stale, f"BLOCKS lists blocks that are gone: {sorted(stale)}"
    for key, (check, reason, _) in BLOCKS.items():
        assert (check in (run_python, run_bash)) == (reason is None), key


@pytest.mark.parametrize("path, language, code", _blocks(),
                         ids=[f"{p}:{_key(c)[:40]}" for p, _, c in _blocks()])
def test_block(path, language, code, home):
    if _key(code) not in BLOCKS:
        pytest.fail(f"{path}: a block tests/test_readme.py does not know: {_key(code)!r}")
    check, reason, expect = BLOCKS[_key(code)]
    assert (language, check) in {("python", run_python), ("bash", run_bash),
                                 ("bash", check_wheel_block), ("bash", check_ci_block)}, (
        f"a {language!r} block checked by {check.__name__}")
    out = check(code, home) or ""
    for text in expect:
        assert text in out, f"{text!r} not in the output:\n{out[-4000:]}"


def test_readme_is_a_front_door():
    readme = _read("README.md")
    assert len(readme.splitlines()) <= 150
    headings = re.findall(r"^## (.+)$", readme, re.M)
    assert headings[0] == "Install and test"
    assert [h for h in headings if h.startswith("Quick start")] == [
        "Quick start 1: the ops inside `tf.function`", "Quick start 2: train, recommend, serve",
        "Quick start 3: a ranker (`--task ranking`)"]
    # History belongs in CHANGELOG.md and git, not in the user-facing pages.
    for path in FRONT_DOORS:
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", _read(path)), f"{path} holds a date"


def _anchors(path):
    """The heading anchors GitHub gives a markdown file."""
    text = re.sub(r"^```.*?^```", "", _read(path), flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("path", FRONT_DOORS)
def test_links_lead_somewhere(path):
    text = re.sub(r"^```.*?^```", "", _read(path), flags=re.S | re.M)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
        assert os.path.exists(os.path.join(ROOT, full)), f"{path}: {link} leads nowhere"
        if anchor:
            assert anchor in _anchors(full), f"{path}: {full} has no heading #{anchor}"


def test_the_index_lists_every_page():
    index = _read(os.path.join("docs", "README.md"))
    pages = sorted(name for name in os.listdir(os.path.join(ROOT, "docs"))
                   if name.endswith(".md") and name != "README.md")
    missing = [name for name in pages if f"]({name})" not in index]
    assert not missing, f"docs/README.md does not list {missing}"


def test_the_results_are_quoted_from_quality_md():
    # The README's table quotes docs/quality.md: every figure in it is one of that page's.
    section = _read("README.md").split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    figures = re.findall(r"\b0\.\d{4}\b", table)
    assert len(figures) >= 30
    quality = _read(os.path.join("docs", "quality.md"))
    assert not [f for f in figures if f not in quality], "figures docs/quality.md does not have"
