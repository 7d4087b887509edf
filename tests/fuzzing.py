"""What the fuzz tests of the readers share: byte mutations of a valid file, the one-line-error
rule, and a runner that records how many inputs each reader was given.

The rule every reader is held to: it returns data or raises its package's one-line error (a
``ValueError`` subclass) whose message is a single line naming the file it read. Anything else
(``IndexError``, ``UnicodeDecodeError``, ``tf.errors.*``, a multi-line message) fails the test.

Runs are reproducible (``derandomize=True``: the same inputs in CI as on a laptop). The count of
inputs tried is recorded as the test property ``fuzz inputs: <reader>``; ``tests/conftest.py``
adds the counts up and prints one line per reader at the end of the session.
"""

from __future__ import annotations

import json

import hypothesis
import hypothesis.strategies as st

# Bytes that are not UTF-8: a lone continuation byte, a truncated 2-byte sequence, an encoded
# surrogate, an overlong '/', a code point past U+10FFFF, and 0xFF.
INVALID_UTF8 = (b"\x80", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xff")
TEXT = st.text(st.characters(codec="utf-8"), max_size=30)


MUTATIONS = (
    "flip", "truncate", "insert_bytes", "invalid_utf8", "unicode",  # bytes
    "insert_line", "delete_line", "duplicate_line", "swap_columns", "replace_field",  # lines
)  # fmt: skip


@st.composite
def _mutation(draw, data: bytes, delimiter: bytes) -> bytes:
    kind = draw(st.sampled_from(MUTATIONS))
    at = draw(st.integers(0, len(data)))
    lines = data.split(b"\n")
    line = draw(st.integers(0, len(lines) - 1))
    if kind == "flip" and data:
        at = min(at, len(data) - 1)
        return data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1 :]
    if kind == "truncate":
        return data[:at]
    if kind == "insert_bytes":
        return data[:at] + draw(st.binary(min_size=1, max_size=12)) + data[at:]
    if kind == "invalid_utf8":
        return data[:at] + draw(st.sampled_from(INVALID_UTF8)) + data[at:]
    if kind == "unicode":
        return data[:at] + draw(TEXT).encode("utf-8") + data[at:]
    if kind == "insert_line":
        # Lines the readers give a meaning to: blank, only delimiters, a CoNLL document break.
        new = draw(TEXT | st.sampled_from(["", delimiter.decode() * 3, "-DOCSTART- -X- O O"]))
        lines.insert(line, new.encode("utf-8"))
    elif kind == "delete_line":
        del lines[line]
    elif kind == "duplicate_line":
        lines.insert(line, lines[line])
    elif kind in ("swap_columns", "replace_field"):
        fields = lines[line].split(delimiter)
        i, j = draw(st.integers(0, len(fields) - 1)), draw(st.integers(0, len(fields) - 1))
        if kind == "swap_columns":
            fields[i], fields[j] = fields[j], fields[i]
        else:
            fields[i] = draw(TEXT | st.sampled_from(["", "-1", "1e400", "null", "0", "4"])).encode()
        lines[line] = delimiter.join(fields)
    return b"\n".join(lines)


@st.composite
def mutated(draw, original: bytes, delimiter: bytes = b"\t", max_mutations: int = 3) -> bytes:
    """``original`` after 1 to ``max_mutations`` random edits (byte flips, truncation, inserted
    bytes / lines / invalid UTF-8 / unicode, deleted or duplicated lines, swapped or replaced
    columns split on ``delimiter``)."""
    data = original
    for _ in range(draw(st.integers(1, max_mutations))):
        data = draw(_mutation(data, delimiter))
    return data


def file_contents(original: bytes, delimiter: bytes = b"\t"):
    """Mostly mutations of ``original``; also empty input, random bytes and random text."""
    edits = mutated(original, delimiter)
    return st.one_of(
        edits,  # three times: one_of picks its branches evenly, and edits find the most bugs
        edits,
        edits,
        st.just(b""),
        st.binary(max_size=200),
        TEXT.map(lambda s: s.encode("utf-8")),
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


def _paths(node, path=()):
    """Every path into a JSON tree (keys and list indices), the root's ``()`` first."""
    yield path
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return
    for key, child in items:
        yield from _paths(child, (*path, key))


@st.composite
def json_mutated(draw, document, max_mutations: int = 3):
    """``document`` (parsed JSON) after 1 to ``max_mutations`` edits at random places in its
    tree: a value replaced by random JSON or by a value of another type, a key deleted, a list
    emptied or an item duplicated."""
    document = json.loads(json.dumps(document))  # a private copy
    for _ in range(draw(st.integers(1, max_mutations))):
        path = draw(st.sampled_from(list(_paths(document))))
        if not path:
            document = draw(JSON)
            continue
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        key, value = path[-1], parent[path[-1]]
        kind = draw(st.sampled_from(["json", "retype", "delete", "empty", "duplicate"]))
        if kind == "delete":
            del parent[key]
        elif kind == "empty" and isinstance(value, (list, dict, str)):
            parent[key] = type(value)()
        elif kind == "duplicate" and isinstance(value, list) and value:
            value.append(value[0])
        elif kind == "retype":
            parent[key] = draw(
                st.sampled_from([None, True, 0, -1, 1.5, "", "x", [], {}, [value], str(value)])
            )
        else:
            parent[key] = draw(JSON)
    return document


def check_one_line(error: BaseException, *names: str) -> None:
    """The message is one line that names each of ``names`` (the file read)."""
    message = str(error)
    assert message and "\n" not in message and "\r" not in message, repr(message)
    for name in names:
        assert str(name) in message, f"{message!r} does not name {name}"


def fuzz(record_property, reader: str, strategy, check, *, max_examples: int) -> int:
    """Runs ``check(value)`` on ``max_examples`` values of ``strategy`` (fewer if hypothesis runs
    out of distinct ones); records and returns how many it tried."""
    tried = 0

    @hypothesis.settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(strategy)
    def property_holds(value):
        nonlocal tried
        tried += 1
        check(value)

    property_holds()
    record_property(f"fuzz inputs: {reader}", tried)
    return tried
