"""What a calibration describes: the device, the host and the software versions (torch's view of
them, kept here so that `simpar.sim` never imports torch)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from .timing import BenchConfig


def cuda_devices() -> tuple[int, str | None]:
    """(number of visible CUDA devices, name of the first) — (0, None) without CUDA."""
    if not torch.cuda.is_available():
        return 0, None
    return torch.cuda.device_count(), torch.cuda.get_device_name(0)


def software_versions() -> dict[str, str]:
    from simpar import __version__

    return {"torch": torch.__version__, "python": platform.python_version(), "simpar": __version__}


def device_info(cfg: BenchConfig) -> dict:
    """What the calibration describes: device name, software versions, host."""
    info = {
        "kind": cfg.device,
        "backend": cfg.backend,
        "nproc": cfg.nproc,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "machine": platform.machine(),
        "threads_per_process": 1 if cfg.device == "cpu" else None,
    }
    if cfg.device == "cuda":
        info["name"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    else:
        info["name"] = _cpu_name() or platform.processor() or "cpu"
        info["cpu_count"] = os.cpu_count()
    return info


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None
