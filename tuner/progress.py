"""Terminal progress of a tuning job (rich), on stderr so stdout stays parseable."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.job import Progress as JobProgress


class ProgressDisplay:
    """A progress bar: trials done, best GFLOPS so far, errors. Quiet when stderr is no terminal."""

    def __init__(self, title: str) -> None:
        self._console = Console(stderr=True)
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("best {task.fields[best]}"),
            TextColumn("errors {task.fields[errors]}"),
            TimeElapsedColumn(),
            console=self._console,
            transient=False,
            disable=not self._console.is_terminal,
        )
        self._title = title
        self._task = None

    def __enter__(self) -> "ProgressDisplay":
        self._bar.__enter__()
        self._task = self._bar.add_task(self._title, total=None, best="-", errors=0)
        return self

    def update(self, progress: JobProgress) -> None:
        best = f"{progress.best_gflops:.2f} GFLOPS" if progress.best_gflops else "-"
        description = self._title if progress.state == "running" else f"{self._title} ({progress.state})"
        self._bar.update(self._task, completed=progress.done, total=progress.total, best=best,
                         errors=progress.errors, description=description)
        if not self._console.is_terminal:
            self._console.print(
                f"[{progress.done}/{progress.total}] {progress.state}, best {best}, errors {progress.errors}",
                highlight=False,
            )

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)
