"""Live progress: a tqdm bar on a terminal, plain periodic lines when stdout is a file or pipe."""
from __future__ import annotations

import sys


def format_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    def __init__(self, *, total_steps: int, enabled: bool = True, stream=None):
        self.stream = stream or sys.stdout
        self.total_steps = total_steps
        self.enabled = enabled
        self.bar = None
        if enabled and self.stream.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total_steps, file=self.stream, dynamic_ncols=True,
                            unit="step", leave=True)

    def set_total(self, total_steps: int) -> None:
        """The run's length changed (--time-budget sized it after its first steps)."""
        self.total_steps = total_steps
        if self.bar is not None:
            self.bar.total = total_steps
            self.bar.refresh()

    def start(self, step: int) -> None:
        if self.bar is not None:
            self.bar.n = step
            self.bar.refresh()

    def update(self, *, epoch: int, epochs: int, step: int, loss: float,
               images_per_second: float | None, data_wait_fraction: float | None,
               eta_seconds: float) -> None:
        if not self.enabled:
            return
        speed = ((f"{images_per_second:,.0f} img/s", f"data-wait {data_wait_fraction:.0%}")
                 if images_per_second is not None else ("warming up",))
        fields = (f"epoch {epoch + 1}/{epochs}", f"loss {loss:.4f}", *speed)
        if self.bar is not None:
            self.bar.set_description(fields[0])
            self.bar.set_postfix_str(", ".join(fields[1:]), refresh=False)
            self.bar.update(step - self.bar.n)
        else:
            print(f"{fields[0]}  step {step}/{self.total_steps}  " + "  ".join(fields[1:]) +
                  f"  ETA {format_eta(eta_seconds)}", file=self.stream, flush=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
