"""How long work takes and how much memory it holds: the compute model of one GPU
(`compute`), measured tables a calibration may carry (`tables`), the executor's runtime profile
(`profile`), per-stage work of a plan (`workload`), the one memory model (`memory`), and a plan
resolved against all of them once (`resolved`)."""
