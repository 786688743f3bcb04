"""`Decision`: a planned value with its reason, what every rule returns (rules.py, device_choice.py,
recipe.py, budget_size.py) and a run prints."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

ASKED = "asked for"
# The settings behind a decision whose name is no setting's.
SETTINGS_OF = {"threads": ("threads", "workers"), "compile_mode": ("compile",)}


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
    return Decision(value, ASKED, shown=False)


def labelled(decisions: dict[str, Decision], sources: Mapping[str, str]) -> dict[str, Decision]:
    """`decisions` with each "asked for" naming where its setting came from (`sources`:
    setting -> "asked for in this command", "kept from the saved run (RUN/config.yaml)", "from
    --config FILE"; config_files.config_and_sources); the plan's own reasons stay."""
    out = {}
    for name, decision in decisions.items():
        where = [sources[s] for s in SETTINGS_OF.get(name, (name,)) if s in sources]
        if where and decision.reason.startswith(ASKED):
            decision = dataclasses.replace(
                decision, reason=where[0] + decision.reason[len(ASKED):])
        out[name] = decision
    return out
