"""simpar's reference executor: the simulator's plan and schedule run with torch on real devices
(CPU with gloo, CUDA with NCCL), numerically verified and measured, written as a trace in the
simulator's format. Importing this package does not import torch; its modules do.

Modules: ``model`` (GPT/Llama from a ModelSpec), ``moe`` (its Mixture-of-Experts layers and
expert-parallel all-to-alls), ``parallel`` (mesh, TP/SP, DDP/FSDP/ZeRO),
``torch_pipelining`` (the only place private torch APIs are used), ``measure`` (timings, memory),
``verify`` (single-process reference), ``checks`` (fail-fast validation, no torch), ``worker``
(one rank), ``entry`` (torchrun entry point), ``launch`` (torchrun command, local spawning).
``microbench``, ``commbench`` and ``insitu`` (the benchmarks of ``simpar calibrate``), ``probe`` (device-speed
probe), ``timing`` (their shared timing helpers), ``devinfo`` (device and versions),
``kernels`` (the kernel microbenchmarks of ``benchmarks/gpu``).
See README.md.
"""
