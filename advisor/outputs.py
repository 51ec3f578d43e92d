"""Where commands write: every output path is checked before the work that fills it, and every file is
written whole or not at all.

A fit's minutes were lost to a folder that could not take the file, and `fit --out` once replaced a
device, a symbolic link's target and the very profile it was reading (voiding that profile's band).
So an output must be a regular file or a new one, not a link, not a file this command reads, in a
folder that takes new files; and it is written to a temporary file beside it, then renamed over it,
so a failed or killed command leaves the old file or none, never half of one.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


class OutputError(ValueError):
    """An output path that cannot or must not take the command's file; the message names the option."""


def output_file(text: str, option: str, make_folder: bool = False, reads: tuple = ()) -> Path:
    """A path that may take a new file: a regular file or none, not a symbolic link, not one of the
    files in `reads` (the command's inputs), in a folder (made, with `make_folder`) that takes new files."""
    path = Path(text)
    if not str(text).strip():
        raise OutputError(f"bad {option}: no file named")
    if path.is_symlink():
        raise OutputError(f"bad {option} '{text}': a symbolic link; name the file itself, or a new one")
    if path.is_dir():
        raise OutputError(f"bad {option} '{text}': a folder; name a file in it")
    if path.exists() and not path.is_file():
        raise OutputError(f"bad {option} '{text}': not a regular file (a device, FIFO or socket); name a file")
    for read in reads:
        if read and path.exists() and Path(read).exists() and os.path.samefile(path, read):
            raise OutputError(f"bad {option} '{text}': the file this command reads ({read}); write elsewhere")
    _check_folder(path.parent if str(path.parent) else Path("."), option, text, make=make_folder)
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"bad {option} '{text}': cannot write there")
    return path


def output_folder(text: str, option: str) -> Path:
    """A folder, made where missing, that takes new files."""
    folder = Path(text)
    if not str(text).strip():
        raise OutputError(f"bad {option}: no folder named")
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"bad {option} '{text}': a file, not a folder")
    _check_folder(folder, option, text, make=True)
    return folder


def _check_folder(folder: Path, option: str, text: str, make: bool) -> None:
    """`folder` exists (made, with `make`) and takes a new file: a scratch file is written, since
    root's access checks pass where writes fail (/proc)."""
    if make:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"bad {option} '{text}': cannot make folder {folder} ({exc.strerror})") from None
    if not folder.is_dir():
        raise OutputError(f"bad {option} '{text}': folder {folder} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".advisor-write-check-"):
            pass
    except OSError as exc:
        raise OutputError(f"bad {option} '{text}': cannot write there ({exc.strerror})") from None


@contextmanager
def replacing(path: str | Path):
    """A temporary file beside `path` (same suffix, so writers that infer a format from it still do) to
    write in the block; renamed over `path` when the block ends, removed when it raises. The file gets
    the mode a new file would have, or the old file's."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.",
                                   suffix=path.suffix)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, text: str) -> None:
    """`text` as the whole of `path`, or `path` untouched."""
    with replacing(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def _mode_for(path: Path) -> int:
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
