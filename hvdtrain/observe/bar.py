"""The run's progress bar on a terminal: drawn by rank 0 (``train.progress: bar``) or by the launcher."""
from __future__ import annotations

from typing import Optional, TextIO


class TerminalBar:
    """A tqdm bar over a whole run: epoch, step, loss, samples/s and the run's ETA.

    Rank 0 draws it on its own terminal (mode ``bar``); the ``hvdtrain`` launcher draws it
    from rank 0's progress events. ``done`` is the optimizer steps finished before the bar
    starts (a resumed run), so the rate and ETA count only steps timed here.
    """

    def __init__(self, epochs: int, steps: int, done: int = 0, stream: Optional[TextIO] = None):
        from tqdm import tqdm

        self.epochs, self.steps = epochs, steps
        self._bar = tqdm(total=epochs * steps, initial=done, file=stream, dynamic_ncols=True, leave=True,
                         unit="step", bar_format="{desc} {percentage:3.0f}%|{bar}| ETA {remaining}")
        self._figures = ""
        self.update(*divmod_epoch(done, steps))

    @property
    def finished(self) -> bool:
        return self._bar.n >= self._bar.total

    def update(self, epoch: int, step: int, loss: Optional[float] = None,
               samples_per_sec: Optional[float] = None) -> None:
        """Move to ``step`` (1-based, 0 before the first) of ``epoch``; ``None`` keeps the last figures."""
        epoch = max(epoch, 1)
        if loss is not None and samples_per_sec is not None:
            self._figures = f" | loss {loss:.4f} | {samples_per_sec:,.0f} samples/s"
        self._bar.set_description_str(f"epoch {epoch}/{self.epochs} step {step}/{self.steps}{self._figures} |",
                                      refresh=False)
        self._bar.update((epoch - 1) * self.steps + step - self._bar.n)  # also redraws

    def write(self, line: str, stream: Optional[TextIO] = None) -> None:
        """A line above the bar."""
        self._bar.write(line, file=stream or self._bar.fp)

    def close(self) -> None:
        self._bar.close()


def divmod_epoch(done: int, steps: int) -> tuple[int, int]:
    """(epoch, step) after ``done`` optimizer steps: the 1-based epoch and the step within it (pure)."""
    epoch, step = divmod(done, steps)
    return (epoch, steps) if step == 0 and epoch > 0 else (epoch + 1, step)
