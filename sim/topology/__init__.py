"""A cluster as a networkx graph: GPUs, switches and links, routes between GPUs (`graph`)."""
