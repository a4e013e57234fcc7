"""The learned router at serving time: checkpoint loading, one-pass scoring, the decision rule.

Never imports TRL or the training package.
"""

from litellm_energy_router.router.decide import (
    decide_lambda,
    decide_target,
    lambda_breakpoints,
    lambda_grid,
)

__all__ = ["decide_lambda", "decide_target", "lambda_breakpoints", "lambda_grid"]
