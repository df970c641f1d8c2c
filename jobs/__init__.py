"""How simpar runs jobs, beside the simulator: worker processes that never outlive their parent and
a small forked pool (`procs`), Ctrl-C and SIGTERM during a long run (`interrupt`), and one run at a
time per output folder (`lock`). Nothing here knows a model, a plan or a cluster; the sweep
(`simpar.sim.sweep`), validation and the CLI use it."""
