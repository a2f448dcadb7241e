"""fasttoml must agree with tomllib on everything it accepts, and hand
everything else (including all invalid input) to tomllib."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import pytest

from infer_units.generator import fasttoml

ACCEPTED = [
    "",
    "# only a comment\n",
    'a = "x"\n',
    "a = 'lit\\eral'\n",
    'a = "esc \\" \\\\ \\n \\t \\u00e9 \\U0001F680"\n',
    "a = 1\nb = -2\nc = +3\nd = 0\n",
    "a = true\nb = false\n",
    'a = []\nb = [1, 2, 3,]\nc = [\n  "x", # comment\n  "y",\n]\n',
    "a = [[1, 2], [\"x\"]]\n",
    "[env]\nA = \"1\"\n[nccl]\np2p = \"off\"\n",
    "  a  =  \"spaced\"   # trailing\n\n\n[ t ]\nk = 1\n",
    "a = \"x\"\r\nb = 2\r\n",
    "key-with_dash = 1\n123 = 2\n",
    'a = "ünï 模型"\n',
    'a = "tab\there"\n',
    # The one-line forms read whole (fasttoml._line_value), and their neighbours.
    'args = ["--flag", "a, b", "[x]", "#not a comment", "100% $HOME", "it\'s"]\n',
    "a = ['lit \"q\" \\ back']\nb = 'say \"hi\"'\nc = [\"x\",]\nd = [ ]\n",
    "gpus = [0, 1, -2, +3]\nf = [true, false, 0]\ne = [1,]\n",
    'a = "x" # comment\nb = [1, 2] # comment\nc = ["a", 1]\nd = ["x"] # c]\n',
]

REJECTED = [
    "a = 1.5\n", "a = 1e3\n", "a = 0x10\n", "a = 1_000\n", "a = 01\n",
    "a = 1979-05-27\n", 'a = """multi"""\n', "a = '''multi'''\n", "a = {x = 1}\n",
    "a.b = 1\n", '"quoted" = 1\n', "[a.b]\nx = 1\n", "[[arr]]\nx = 1\n",
    "a = 1\na = 2\n", "[t]\n[t]\n", "t = 1\n[t]\n", 'a = "bad \\q escape"\n',
    'a = "unterminated\n', "a = [1, 2\n", "a = truex\n", "a = 1 2\n", "a =\n",
    "= 1\n", 'a = "ctrl \x01"\n', "a = 1\rb = 2\n", "a = 1 # bad \x00\n",
    'a = "\\ud800"\n', "a = [1,,2]\n", "a = -\n", "a = inf\n",
    'a = "x" "y"\n', 'a = ["a" "b"]\n', 'a = ["a",, "b"]\n', "a = [1 2]\n", "a = [,]\n",
    "a = 'x' 'y'\n", 'a = ["x"], ["y"]\n', "a = [00]\n", "a = +\n",
    'a = ["x\\"]\n', 'a = "x\\"\n', 'a = ["x"\n',
    # Left to tomllib (and to the loader's limits): may not fit 64 bits, or
    # nested deeper than any model file (fasttoml must not recurse into a
    # RecursionError of its own).
    "a = 1234567890123456789\n", "a = " + "1" * 5000 + "\n", "a = " + "[" * 9 + "]" * 9 + "\n",
    "a = " + "[" * 5000 + "]" * 5000 + "\n",
]


@pytest.mark.parametrize("text", ACCEPTED)
def test_accepted_same_as_tomllib(text: str) -> None:
    assert fasttoml.loads(text.encode()) == tomllib.loads(text)


@pytest.mark.parametrize("text", REJECTED)
def test_rest_goes_to_tomllib(text: str) -> None:
    with pytest.raises(fasttoml.Unsupported):
        fasttoml.loads(text.encode())


def test_every_fixture_parses_like_tomllib() -> None:
    files = [p for p in (Path(__file__).parents[1] / "cases").rglob("*.toml")
             if p.is_file() and not p.is_symlink()]
    assert len(files) > 40
    agreed = 0
    for path in files:
        data = path.read_bytes()
        try:
            expected = tomllib.loads(data.decode())
        except tomllib.TOMLDecodeError:
            with pytest.raises(fasttoml.Unsupported):
                fasttoml.loads(data)
            continue
        try:
            assert fasttoml.loads(data) == expected, path
            agreed += 1
        except fasttoml.Unsupported:
            pass
    assert agreed > 30


MIN_ACCEPTED = 1000    # 1263 with this seed (2026-12-01)


def test_random_mutations_never_disagree() -> None:
    """Byte-level mutations of valid files: fasttoml either matches tomllib or
    declines; it never returns something tomllib would reject or read otherwise."""
    rng = random.Random(20261130)
    seeds = [t for t in ACCEPTED if t]
    alphabet = list(" \t\n\"'[]=,#\\-_.01aeuxU{}") + ["\u00e9"]
    accepted = 0
    for _ in range(4000):
        text = list(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(text) + 1)
            action = rng.random()
            if action < 0.4:
                text.insert(pos, rng.choice(alphabet))
            elif action < 0.8 and text:
                del text[min(pos, len(text) - 1)]
            elif text:
                text[min(pos, len(text) - 1)] = rng.choice(alphabet)
        mutated = "".join(text)
        try:
            ours = fasttoml.loads(mutated.encode())
        except fasttoml.Unsupported:
            continue
        try:
            theirs = tomllib.loads(mutated)
        except tomllib.TOMLDecodeError:
            raise AssertionError(f"fasttoml accepted invalid TOML: {mutated!r} -> {ours!r}")
        assert ours == theirs, mutated
        accepted += 1
    # A fasttoml that declined everything would agree vacuously: most mutations
    # (a space, a comment, another digit) stay in its subset and must be read.
    assert accepted >= MIN_ACCEPTED, f"fasttoml read only {accepted} of 4000 mutations"


def test_what_fasttoml_reads_is_within_the_loaders_limits() -> None:
    """loader._copied skips _deep_copy's checks for fasttoml's tables: the
    deepest array and the longest integer fasttoml reads must pass them."""
    from infer_units.generator import loader
    deepest = "a = " + "[" * 8 + "1" + "]" * 8 + "\n"
    assert fasttoml.loads(deepest.encode()) == tomllib.loads(deepest)
    with pytest.raises(fasttoml.Unsupported):
        fasttoml.loads(("a = " + "[" * 9 + "1" + "]" * 9 + "\n").encode())
    widest = "[t]\na = -999999999999999999\nb = 999999999999999999\n"
    table = fasttoml.loads(widest.encode())
    # A table's value is merged at depth 2; each array level adds one.
    loader._deep_copy(table["t"]["a"], "f", "t.a", 2)
    loader._deep_copy(fasttoml.loads(deepest.encode())["a"], "f", "t.a", 2)
    assert loader._copied(table) == table and loader._copied(table)["t"] is not table["t"]
