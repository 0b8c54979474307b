"""Files written whole: a hidden temporary name in the final folder, fsynced,
renamed into place; a failed write removes its partial and names the path."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from pipeline.errors import PublishError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _write_failed(path: Path, e: OSError) -> PublishError:
    if e.errno in _NO_SPACE:
        todo = (
            f"free space on the filesystem holding {path.parent} (df -h {path.parent}) and "
            f"re-run the release: what was published is kept and the rest resumes"
        )
    else:
        todo = f"make {path.parent} writable by this user and re-run the release: it resumes"
    return PublishError(f"{path}: writing failed ({e.strerror or e}); nothing was left under that name; {todo}")


def make_folder(folder: Path) -> None:
    """`folder` and its parents, or one PublishError naming the folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise PublishError(
            f"{folder}: a file is in the way of this destination folder; move it "
            f"or fix the profile's destination in release.toml"
        ) from None
    except OSError as e:
        raise PublishError(
            f"{folder}: cannot create this destination folder ({e.strerror}); create "
            f"it writable for this user or fix the profile's destination in "
            f"release.toml"
        ) from None


def write_atomic(dest: Path, source: Path | None = None, *, data: bytes | None = None) -> None:
    """`source`'s bytes (or `data`) at `dest`, by way of a hidden temporary
    file in dest's folder that is fsynced and renamed into place. A failed
    write removes the temporary file and raises PublishError naming `dest`."""
    make_folder(dest.parent)
    partial = dest.with_name(f".{dest.name}.partial")  # a stale one from a killed run is replaced
    fd = None
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            fd = None
            if data is not None:
                out.write(data)
            else:
                with source.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, dest)
    except OSError as e:
        if fd is not None:
            os.close(fd)
        partial.unlink(missing_ok=True)
        if source is not None and e.filename in (str(source), source):
            raise PublishError(
                f"{source}: cannot be read ({e.strerror}); run the release again from the build"
            ) from None
        raise _write_failed(dest, e) from None
    try:  # the rename itself survives a crash only once the folder is on disk
        dir_fd = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems cannot fsync a folder; the file itself is complete
