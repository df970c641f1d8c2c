"""Reading torch.profiler (Kineto) traces: streaming reader, kernel classes, a measured iteration."""
