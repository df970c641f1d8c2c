"""Energy and cost of a plan's iteration: each GPU's power by state (`power`), the energy of each state
from the event run's accounts (`account`), a power cap and EnvPipe-style clock lowering off the
critical path (`clocks`), prices from the user (`price`)."""
