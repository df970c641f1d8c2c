"""The optimizers a plan may train with, as facts: the state each keeps per parameter beside the
stack's master copies, the memory traffic of its step, and Muon's Newton-Schulz matrix products.

State bytes are the optimizer's own (the stack's fp32 master weights and gradient copies are the
stack's: `specs.stack.StateBytes`); ZeRO shards them with the rest of the optimizer side. A step is
memory-bound: per locally owned parameter it reads and writes the fp32 master (8 bytes), reads the
16-bit gradient (2), writes the 16-bit weight (2) and reads and writes its own state.

- ``adam`` / ``adamw``: two fp32 moments, 8 bytes (Kingma & Ba 2015; AdamW's decoupled weight decay,
  Loshchilov & Hutter 2019, changes the update, not the state); step 8 + 2 + 2 + 16 = 28 bytes.
  Megatron-Core's ``--optimizer adam`` is Apex/TE FusedAdam in AdamW mode; torchtitan and the
  executor run torch's AdamW.
- ``adam-8bit``: both moments block-wise quantised to 8 bits with an fp32 absmax per block of 2,048
  (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR 2022, §2):
  2 + 2 x 4 / 2048 bytes; step 8 + 2 + 2 + 4 = 16 bytes (plus the scales).
- ``adafactor``: no first moment (beta1 = 0, the paper's and torch's default) and the second moment
  factored into a row and a column vector per weight matrix (Shazeer & Stern 2018, §3-5): an a x b
  matrix keeps 4 (a + b) bytes, 4 (1/a + 1/b) per parameter, counted here for the model's h x h
  shape (8/h); step 8 + 2 + 2 + 2 (a second read of the gradient for the row and column sums) = 14.
- ``sgd``: SGD with momentum, one fp32 buffer, 4 bytes; step 8 + 2 + 2 + 8 = 20 bytes.
- ``muon``: one fp32 momentum buffer, 4 bytes (Jordan et al. 2024; Liu et al., "Muon is Scalable
  for LLM Training", 2025), step traffic as SGD's, plus 5 Newton-Schulz iterations on each weight
  matrix (torch.optim.Muon's ``ns_steps`` default). One iteration on an a x b matrix (a <= b) is
  X X^T (2 a^2 b FLOPs), a quintic in it (2 a^3) and its product with X (2 a^2 b): 4a + 2a^2/b per
  parameter, 6h on the model's h x h shape, run as 16-bit GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..choices import OPTIMIZERS

#: master weights read and written (fp32), the gradient read and the weight written (16-bit)
_BASE_STEP_BYTES = 8 + 2 + 2
#: Newton-Schulz iterations of Muon's orthogonalisation (torch.optim.Muon ns_steps)
MUON_NS_STEPS = 5


@dataclass(frozen=True)
class OptimizerFacts:
    """``state_bytes``: bytes of the optimizer's own state per parameter, ``None`` where it
    depends on the weight shapes (Adafactor's factored moment: `state_bytes_for`);
    ``state_traffic``: bytes of that state its step reads and writes per parameter;
    ``extra_reads``: further bytes the step reads per parameter; ``ns_steps``: Newton-Schulz
    iterations per weight matrix (Muon)."""

    name: str
    state_bytes: float | None
    state_traffic: float
    extra_reads: float = 0.0
    ns_steps: int = 0

    def state_bytes_for(self, hidden: int) -> float:
        """State bytes per parameter for a model of width ``hidden``."""
        if self.state_bytes is not None:
            return self.state_bytes
        return 8.0 / hidden  # Adafactor: 4 (1/a + 1/b) on an h x h matrix

    @property
    def step_bytes(self) -> float:
        """HBM bytes its step moves per locally owned parameter (module docstring)."""
        return _BASE_STEP_BYTES + self.state_traffic + self.extra_reads

    def step_flops(self, hidden: int) -> float:
        """Matrix FLOPs of its step per parameter (Muon's Newton-Schulz; 0 for the others)."""
        return self.ns_steps * 6.0 * hidden


OPTIMIZER_FACTS: dict[str, OptimizerFacts] = {
    "adam": OptimizerFacts("adam", 8.0, 16.0),
    "adamw": OptimizerFacts("adamw", 8.0, 16.0),
    "adam-8bit": OptimizerFacts("adam-8bit", 2.0 + 8.0 / 2048, 4.0),
    "adafactor": OptimizerFacts("adafactor", None, 0.0, extra_reads=2.0),
    "sgd": OptimizerFacts("sgd", 4.0, 8.0),
    "muon": OptimizerFacts("muon", 4.0, 8.0, ns_steps=MUON_NS_STEPS),
}
assert set(OPTIMIZER_FACTS) == set(OPTIMIZERS)


def optimizer_facts(name: str) -> OptimizerFacts:
    return OPTIMIZER_FACTS[name]
