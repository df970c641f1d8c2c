"""Framework configurations in and out: Megatron-LM launches, DeepSpeed configs, torchtitan jobs
read onto simpar's plan (`megatron`, `deepspeed`, `torchtitan`) and a plan written back as their
launch recipes (`emit`)."""
