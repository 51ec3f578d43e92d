"""Reading the files users hand the advisor: regular files of bounded size, UTF-8 text, and JSON
without the parser's own failure modes.

A device (/dev/zero) read whole fills the memory, a FIFO blocks the command forever, a binary file
fails to decode, JSON nested 200,000 deep overflows the parser's stack, and an integer of thousands
of digits cannot even be printed. Each becomes one error naming the file, raised as the loader's own
error class (`error`) so that its callers need not know this module.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

MAX_DOCUMENT_BYTES = 16 * 2**20  # a config, a profile, a band: some kB to a few hundred kB
MAX_LINES_BYTES = 256 * 2**20  # run records and sweeps, one JSON object a line: some MB
MAX_DEPTH = 64  # our deepest files nest 8 levels; Python's parsers fail near 1,000


def read_text(path: str | Path, error: type[ValueError], max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """The text of a regular file of at most `max_bytes`. Opened without blocking and checked once open,
    so a FIFO or a device named as a file is refused rather than waited on or read without end."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise error(f"cannot read {shown_path(path)}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{path}: not a regular file (a device, FIFO or socket cannot be read as one)")
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise error(f"{path}: larger than {max_bytes // 2**20} MiB; not a file the advisor reads")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}): a binary file?") from None


def parse_json(text: str, origin: str, error: type[ValueError], hjson_too: bool = False):
    """`text` as JSON (with `hjson_too`, HJSON where it is not JSON, as DeepSpeed reads its configs); one
    error naming `origin` for malformed JSON, nesting deeper than MAX_DEPTH and integers too long to
    convert."""
    try:
        value = _loads(text, hjson_too)
    except RecursionError:
        raise error(f"{origin}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # malformed, or an integer of more digits than Python converts (4,300)
        raise error(f"{origin}: not valid JSON ({exc})") from None
    _check_depth(value, origin, error)
    return value


def _loads(text: str, hjson_too: bool):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if not hjson_too:
            raise
    import hjson

    return hjson.loads(text)


def cut_short(text: str) -> bool:
    """Whether `text` is malformed JSON of the kind a writer killed mid-line leaves: a syntax error, not
    nesting too deep or an integer too long (those are whole lines, and wrong)."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return True
    except (RecursionError, ValueError):
        return False
    return False


def _check_depth(value, origin: str, error: type[ValueError]) -> None:
    """At most MAX_DEPTH levels of arrays and objects, walked without recursion: every recursive walker
    after the parser (validation, hashing, printing) is then safe."""
    level, depth = [value], 0
    while level := [node for node in level if isinstance(node, (dict, list))]:
        depth += 1
        if depth > MAX_DEPTH:
            raise error(f"{origin}: nested deeper than {MAX_DEPTH} levels")
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)]


def read_json(path: str | Path, error: type[ValueError], max_bytes: int = MAX_DOCUMENT_BYTES):
    """A JSON file's value, read and parsed as above."""
    return parse_json(read_text(path, error, max_bytes), str(path), error)


def shown_path(path) -> str:
    """A path as a message shows it: whole, or its two ends where it is longer than a line."""
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]}"


def shown(value) -> str:
    """A value as a message shows it: an integer of many digits by its size, not all of its digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        digits = len(str(abs(value)))
        return f"{'-' if value < 0 else ''}{str(abs(value))[0]}e{digits - 1} (a {digits}-digit integer)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
