"""simpar sweep: search the 3D configuration space, rank and explain the plans, write a report."""
