"""Stragglers and variability over many iterations: each GPU's and NIC's speed drawn from a
`simpar.sim.specs.variability.VariabilitySpec` (`draw`), each iteration simulated as events with every
pipeline walked (`run`): P50/P90/P99 iteration time, the ranks that set it, and what one slow GPU does."""
