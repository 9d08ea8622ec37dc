"""The kernel cache's size cap: whole entries evicted, least recently used first.

An entry is everything one kernel source left on disk (see :mod:`measure_agent.engine.build`): its
source ``<cache_dir>/kernels/k_<digest>.py`` and the machine code numba wrote beside it,
``kernels/__pycache__/k_<digest>.<function>-<line>.py<ver>.nbi`` (index) and ``...<n>.nbc`` (data).
A tuning run leaves one entry per distinct kernel, so without a cap the cache grows until the disk
is full (an SD card on a Raspberry Pi first).

"Recently used" is the source file's access time, which :func:`mark_used` sets explicitly on every
load (mounts with ``noatime``, common on SD cards, would not); its modification time is never
touched, since numba's index checks it. Entries in use (the batch being built or run) are never
evicted; another agent sharing the cache directory may still evict them, and then the run worker
writes the source again and compiles it (under the build limit), so the cost is time, not a
failure. Standard library only: the agent stays light.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Collection

# The default cap of an agent's kernel cache (``measure-agent --cache-max-mb``); 0 means no cap.
DEFAULT_CACHE_MAX_MB = 512
# Eviction goes down to this share of the cap, so the next scan waits for that much new code
# (a scan stats every file: 5000 kernels took 0.4 s on a busy 2-core host).
LOW_WATER = 0.9
SOURCE_PREFIX = "k_"  # kernels/k_<digest>.py


@dataclass(frozen=True)
class Eviction:
    """What :func:`evict_to_cap` removed (oldest first) and what the cache holds after it."""

    evicted: tuple["CacheEntry", ...]
    remaining_bytes: int
    remaining_entries: int


@dataclass(frozen=True)
class CacheEntry:
    """One kernel's files, their total size and when it was last used (seconds since the epoch)."""

    digest: str
    files: tuple[Path, ...]
    size_bytes: int
    last_used: float


def kernels_directory(cache_dir: Path) -> Path:
    return Path(cache_dir) / "kernels"


def mark_used(source_path: Path) -> None:
    """Record a use of the kernel at ``source_path``: its access time becomes now (its
    modification time, which numba's cache index checks, stays as it was)."""
    try:
        stat = source_path.stat()
        os.utime(source_path, ns=(time.time_ns(), stat.st_mtime_ns))
    except OSError:  # evicted or unwritable meanwhile: the entry just looks older
        pass


def cache_entries(cache_dir: Path) -> list[CacheEntry]:
    """Every entry of the cache, least recently used first."""
    directory = kernels_directory(cache_dir)
    files: dict[str, list[tuple[Path, os.stat_result]]] = {}
    for folder in (directory, directory / "__pycache__"):
        try:
            with os.scandir(folder) as scan:
                for item in scan:
                    if not item.name.startswith(SOURCE_PREFIX) or not item.is_file(follow_symlinks=False):
                        continue
                    digest = item.name[len(SOURCE_PREFIX):].split(".", 1)[0]
                    try:
                        files.setdefault(digest, []).append((Path(item.path), item.stat(follow_symlinks=False)))
                    except FileNotFoundError:  # removed meanwhile (another agent's eviction)
                        continue
        except FileNotFoundError:
            continue
    entries = []
    for digest, found in files.items():
        # The source's access time, or a file's later write (numba writes its code after the load).
        last_used = max(max(st.st_atime, st.st_mtime) if path.suffix == ".py" else st.st_mtime for path, st in found)
        entries.append(CacheEntry(digest, tuple(path for path, _ in found), sum(st.st_size for _, st in found),
                                  last_used))
    return sorted(entries, key=lambda e: (e.last_used, e.digest))


def evict_to_cap(cache_dir: Path, max_bytes: int, keep: Collection[str] = (),
                 target_bytes: int | None = None) -> Eviction:
    """When the cache holds more than ``max_bytes``, remove the least recently used entries, never
    those whose digest is in ``keep``, until it holds at most ``target_bytes`` (default
    ``max_bytes``) or only kept entries are left. ``max_bytes <= 0``: no cap, nothing is evicted."""
    entries = cache_entries(cache_dir)
    total = sum(e.size_bytes for e in entries)
    if max_bytes <= 0 or total <= max_bytes:
        return Eviction((), total, len(entries))
    target = max_bytes if target_bytes is None else min(target_bytes, max_bytes)
    evicted: list[CacheEntry] = []
    for entry in entries:
        if total <= target:
            break
        if entry.digest in keep:
            continue
        # numba's files first: an index whose source is gone would never be used again.
        for path in sorted(entry.files, key=lambda p: p.suffix == ".py"):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        total -= entry.size_bytes
        evicted.append(entry)
    return Eviction(tuple(evicted), total, len(entries) - len(evicted))


class ScanSchedule:
    """When a cache held to ``max_bytes`` is due for its next scan (a scan stats every file): once
    the last scan's bytes plus an average entry for each kernel built since may pass the cap. The
    first build is always due. Not thread-safe: one engine's builds report in turn."""

    def __init__(self, max_bytes: int, entry_bytes_guess: float = 256 * 1024.0) -> None:
        self.max_bytes = max_bytes
        self._estimate: float | None = None  # never scanned
        self._entry_bytes = entry_bytes_guess

    def built(self, kernels: int) -> bool:
        """Count ``kernels`` just built; whether a scan is due."""
        if self.max_bytes <= 0:
            return False
        if self._estimate is None:
            return True
        self._estimate += kernels * self._entry_bytes
        return self._estimate > self.max_bytes

    def scanned(self, eviction: Eviction) -> None:
        """What a scan (and its eviction) left: the next estimate starts from it."""
        self._estimate = float(eviction.remaining_bytes)
        if eviction.remaining_entries:
            self._entry_bytes = eviction.remaining_bytes / eviction.remaining_entries
