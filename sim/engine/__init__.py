"""The engine: a small interpreter of one iteration's program (`sim.program`) on SimPy. `core`
runs each rank's lowered schedule and tail, `walk` runs compute ahead of the clock where nothing
else can change it, `shards` the data-parallel reductions and ZeRO gathers, `transfers` the
pipeline's sends and receives, `hostpath` the offloaded optimizer's host copies, `tail` the
program's tail ops; `state` and `trace` are what a run holds and records. Driving it over a plan
(compressions, repeated iterations, results) is `sim.iteration`."""
