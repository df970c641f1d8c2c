"""The iteration program: what one training iteration is, in one place. `terms` prices each term
around the pipeline's compute (gradient buckets, ZeRO gathers, FSDP's per-layer passes, the tied
embedding's and the replicas' all-reduces, the sequence-parallel sync, the optimizer step and its
host part); `program` says which of them a plan's ranks run, and when. The engine interprets the
program; the sweep's estimate and lower bound add up the same terms."""
