"""One simulated training iteration: the SimPy engine (`core`), the iteration terms it shares with
the sweep's estimator (`iteration`), `simulate()` that wires model, cluster and plan to it, and
what comes out (`results`, `trace`)."""
