"""`Decision`: a planned value with its reason, what every rule returns (rules.py, device_choice.py,
recipe.py, budget_size.py) and a run prints."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    value: object
    reason: str
    # Printed among the run's decisions. A value given for a setting the trainer otherwise
    # works out from the data (image size, model, batch, lr, ...) is not: it is in config.yaml.
    shown: bool = True
    # Also printed on stderr at the start: it runs, but slowly here, or likely not as meant.
    warning: str = ""

    def line(self) -> str:
        return f"{self.value}: {self.reason}"


def asked(value) -> Decision:
    return Decision(value, "asked for", shown=False)
