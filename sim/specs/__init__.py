"""File formats -> validated values: GPUs, clusters, models. Units are converted here, once."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecError
from .cluster import ClusterSpec
from .gpu import GPUSpec
from .loader import build, preset_names, read_mapping, resolve
from .model import ModelSpec, load_model

__all__ = ["ClusterSpec", "GPUSpec", "ModelSpec", "load_cluster", "load_gpu", "load_model", "preset_names"]


def load_gpu(name_or_path: str | Path) -> GPUSpec:
    path = resolve("gpus", name_or_path, "gpu")
    data = read_mapping(path, "gpu")
    data.setdefault("name", path.stem)
    return build(GPUSpec, data, f"gpu file {path.name}")


def load_cluster(name_or_path: str | Path, gpus: int | None = None) -> ClusterSpec:
    """A cluster preset (or YAML file); its ``gpu:`` key names a GPU preset or holds a GPU mapping.
    With ``gpus`` the cluster is scaled to that many GPUs (whole nodes)."""
    path = resolve("clusters", name_or_path, "cluster")
    data = read_mapping(path, "cluster")
    data.setdefault("name", path.stem)
    gpu = data.get("gpu")
    if isinstance(gpu, str):
        try:
            data["gpu"] = load_gpu(gpu)
        except SpecError as exc:  # name the cluster file, not only the GPU preset
            raise SpecError(f"cluster file {path.name}: gpu", exc.problem, exc.fix) from None
    spec = build(ClusterSpec, data, f"cluster file {path.name}")
    return spec.with_gpus(gpus) if gpus is not None else spec
