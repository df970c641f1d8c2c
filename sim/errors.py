"""The project's exceptions: bad input and infeasible plans, each with one readable line.

`SimparError` is raised for anything a user can fix (a malformed file, a plan that does not
divide, an unknown preset). Its message names the field and the fix; the CLI prints it on one
line and exits with code 2. Internal invariants use `assert`, never this class.
"""

from __future__ import annotations


class SimparError(Exception):
    """Bad input, reported as ``field: problem. fix`` on one line."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"{field}: {problem}"
        if fix:
            text += f" Fix: {fix}"
        super().__init__(text)

    def __reduce__(self):
        """Rebuilt from its three parts (so it crosses a process pool whole)."""
        return (type(self), (self.field, self.problem, self.fix))


class PlanError(SimparError):
    """A parallel plan that is invalid for the model and cluster (does not divide, etc.)."""


class SpecError(SimparError):
    """A hardware, model or calibration file that cannot be read or is malformed."""


class ScheduleError(SimparError):
    """A pipeline schedule that is malformed, inconsistent or would deadlock."""
