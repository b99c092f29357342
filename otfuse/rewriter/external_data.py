"""Make a model's external data files reachable from an output in another folder.

``copy`` (the default) clones the file where the filesystem can (reflink), else copies only its
data extents, so a sparse file stays sparse. ``link`` makes a hard link: instant, but onnx's own
loader refuses data files with several links ("hardlink attack"), for the original too, as long
as both exist; ONNX Runtime accepts them.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path

from otfuse.errors import OutputWriteError

DATA_MODES = ("copy", "link")
_FICLONE = 0x40049409  # linux/fs.h: clone a whole file (btrfs, xfs, ...)


def _copy_extents(src_fd: int, dst_fd: int) -> None:
    """Copy the data extents of ``src_fd``; holes are skipped and stay holes."""
    size = os.fstat(src_fd).st_size
    position = 0
    while position < size:
        try:
            start = os.lseek(src_fd, position, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole remains
                break
            raise
        end = os.lseek(src_fd, start, os.SEEK_HOLE)
        offset = start
        while offset < end:
            copied = os.copy_file_range(src_fd, dst_fd, end - offset, offset, offset)
            if copied == 0:
                break
            offset += copied
        position = end
    os.ftruncate(dst_fd, size)


def clone_or_copy(src: Path, dst: Path) -> None:
    """Write ``dst`` as a copy of ``src`` through a temporary name, then rename it into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        with open(src, "rb") as source:
            try:
                fcntl.ioctl(fd, _FICLONE, source.fileno())
            except OSError:
                _copy_extents(source.fileno(), fd)
        os.close(fd)
        fd = -1
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise


def place_external_files(files: set[str], src_dir: Path, dst_dir: Path, mode: str = "copy") -> list[Path]:
    """Put each data file at ``dst_dir/location``; return the paths created (for cleanup)."""
    if mode not in DATA_MODES:
        raise OutputWriteError(f"unknown external data mode {mode!r} (use {' or '.join(DATA_MODES)})")
    created: list[Path] = []
    if src_dir.resolve() == dst_dir.resolve():
        return created  # the output sits beside the input: same references, nothing to do
    try:
        for location in sorted(files):
            src, dst = src_dir / location, dst_dir / location
            if dst.exists():
                if os.path.samefile(src, dst):
                    continue
                raise OutputWriteError(
                    f"{str(dst)!r} already exists and is not the input's external data file; "
                    "write the fused model to another folder"
                )
            dst.parent.mkdir(parents=True, exist_ok=True)
            if mode == "link":
                os.link(src, dst)
            else:
                clone_or_copy(src, dst)
            created.append(dst)
    except OSError as exc:
        remove(created)
        raise OutputWriteError(f"cannot place external data next to the output: {exc}") from None
    except OutputWriteError:
        remove(created)
        raise
    return created


def remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
