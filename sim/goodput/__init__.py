"""A whole training run, beyond one iteration: its wall time under failures, checkpoints and
restarts (`interval`: the Young and Daly formulas; `events`: the run as a discrete-event simulation;
`run`: what a plan's run costs)."""
