"""Outputs that must never land on what otfuse reads, and that are written all together or not at all.

``check_disjoint`` compares every path a run will write (the model, the data files placed beside
it, the report) with every path it reads (the input model and its data files) and with each other,
after resolving symlinks and ``..``, and by inode for hard links. ``StagedFiles`` writes each output
under a temporary name in its own folder and renames all of them into place only on ``commit``, so
a failure before then (an unwritable report, a failed ``--verify``) leaves nothing behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from otfuse.errors import OutputWriteError


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)  # hard links, symlinks, bind mounts
    return a.resolve() == b.resolve()


def check_disjoint(written: dict[str, Path], read: dict[str, Path]) -> None:
    """Raise ``OutputWriteError`` when a written path is a read path or another written one.
    Keys say what each path is, for the message."""
    for out_role, out_path in written.items():
        for in_role, in_path in read.items():
            if _same_file(out_path, in_path):
                raise OutputWriteError(
                    f"the {out_role} {str(out_path)!r} is the input's {in_role}; otfuse never "
                    "overwrites what it reads")
    roles = list(written.items())
    for i, (role_a, path_a) in enumerate(roles):
        for role_b, path_b in roles[i + 1:]:
            if _same_file(path_a, path_b):
                raise OutputWriteError(f"the {role_a} and the {role_b} are the same file {str(path_a)!r}")


class StagedFiles:
    """Files written under temporary names and renamed into place together."""

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []  # (temporary, final)
        self.created: list[Path] = []  # files made at their final names (external data), removed on abort

    def stage(self, final: Path, data: bytes) -> Path:
        """Write ``data`` beside ``final`` under a temporary name; return that name."""
        folder = final.parent if str(final.parent) else Path(".")
        tmp = ""
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=folder)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)
        except OSError as exc:
            if tmp:
                Path(tmp).unlink(missing_ok=True)
            raise OutputWriteError(f"cannot write {str(final)!r}: {exc.strerror or exc}") from None
        self._staged.append((Path(tmp), final))
        return Path(tmp)

    def commit(self) -> None:
        try:
            for tmp, final in self._staged:
                os.replace(tmp, final)
        except OSError as exc:
            self.abort()
            raise OutputWriteError(f"cannot write {str(final)!r}: {exc.strerror or exc}") from None
        self._staged.clear()
        self.created.clear()

    def abort(self) -> None:
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        for path in self.created:
            path.unlink(missing_ok=True)
        self._staged.clear()
        self.created.clear()
