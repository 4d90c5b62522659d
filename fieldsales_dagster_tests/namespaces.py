"""A real small file system for tests: a tmpfs in a private mount namespace.

``private_tmpfs(mountpoint, size)`` mounts a tmpfs of ``size`` at ``mountpoint`` in a mount
namespace of its own, held by a sleeping process: commands run inside it through ``enter`` (the
tmpfs visible at ``mountpoint``), the test reaches its files through ``seen``
(``/proc/<pid>/root``), and it vanishes with the process, whatever the test does. As root (CI)
a plain ``unshare -m``; otherwise a user namespace maps this user to root (``unshare -rm``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class PrivateTmpfs:
    def __init__(self, mountpoint: Path, size: str, read_only: bool = False):
        self.mountpoint = mountpoint
        self.as_root = os.geteuid() == 0
        options = f"size={size}" + (",ro" if read_only else "")
        script = f"mount -t tmpfs -o {options} fieldsales-test {mountpoint} && echo ready && "
        unshare = ["unshare", "-m"] if self.as_root else ["unshare", "-rm"]
        self.proc = subprocess.Popen(
            [*unshare, "--propagation", "private", "sh", "-c", script + "exec sleep 900"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            self.close()
            raise RuntimeError(f"could not mount a private tmpfs: {self.proc.stderr.read()}")

    def enter(self, argv: list[str], cwd: Path) -> list[str]:
        """``argv``, run inside the namespace in folder ``cwd``."""
        user = [] if self.as_root else ["-U", "--preserve-credentials"]
        return ["nsenter", "-t", str(self.proc.pid), *user, "-m", f"--wd={cwd}", "--", *argv]

    def seen(self, path: Path) -> Path:
        """``path`` (at or under the mount point) as this process reaches it."""
        return Path(f"/proc/{self.proc.pid}/root") / path.relative_to("/")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@contextmanager
def private_tmpfs(mountpoint: Path, size: str, read_only: bool = False) -> Iterator[PrivateTmpfs]:
    mountpoint.mkdir(parents=True, exist_ok=True)
    fs = PrivateTmpfs(mountpoint, size, read_only)
    try:
        yield fs
    finally:
        fs.close()
