"""One training iteration, run: `simulate()` wires model, cluster and plan to the engine (the
interpreter of the iteration program, `sim.engine`), runs it once with every repeated part
compressed away (identical steady-state pipeline rounds, `rounds`; identical pipelines,
`replicas`: each says why it is exact), or over many iterations with slowed GPUs (`repeat`), and
gives back what came out (`results`)."""
