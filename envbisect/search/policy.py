"""How much of a verdict must be observed rather than inferred (``envbisect bisect --policy``).

A `Policy` is one of three named settings of the search, serialised by its text (run records
store ``"confirm"``, ``"fast"`` or ``"thorough"``). `parse_policy` is the one place that text is
checked."""
from __future__ import annotations

from enum import Enum
from typing import Sequence

from envbisect.search.strategy import Search
from envbisect.search.types import Prior


class Policy(str, Enum):
    # a culprit is seen failing alone (so an interaction is never called a single culprit) and the
    # fix is seen passing (so a second independent culprit is never inferred away)
    CONFIRM = "confirm"
    # trust the prior: fewest restarts; interactions and second culprits are inferred unlikely
    FAST = "fast"
    # interactions and second culprits as likely as a single culprit: every claim checked
    THOROUGH = "thorough"

    @property
    def prior(self) -> Prior:
        return _PRIORS[self]

    @property
    def require_fix(self) -> bool:
        """"These are all the culprits" only once current-minus-culprits passed."""
        return self is not Policy.FAST

    def search(self, units: Sequence[str], **kw) -> Search:
        return Search(units, prior=self.prior, require_fix=self.require_fix, **kw)


_PRIORS: dict[Policy, Prior] = {
    Policy.CONFIRM: Prior(interaction=1.0, multiple=1.0 / 60.0, later_interaction=1.0 / 60.0),
    Policy.FAST: Prior(),
    Policy.THOROUGH: Prior.cautious(),
}

# the policies by their text, as run records and the command line spell them
POLICIES: dict[str, Policy] = {p.value: p for p in Policy}


def parse_policy(text: str) -> Policy:
    """The policy named ``text``; a ValueError naming the choices for any other text."""
    try:
        return POLICIES[text]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {text!r} (one of {', '.join(POLICIES)})") from None


__all__ = ["Policy", "POLICIES", "parse_policy"]
