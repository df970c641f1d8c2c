"""Find a preset by name or a user's file by path, read YAML/JSON, and turn pydantic's
validation errors into one `SpecError` line that names the file and the field."""

from __future__ import annotations

import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .. import files
from ..errors import SpecError

T = TypeVar("T", bound=BaseModel)


@cache
def presets_dir(kind: str) -> Path:
    """Folder of the shipped presets of one kind (`gpus`, `clusters`, `models`): where the
    installed package lies, found once."""
    return Path(str(resources.files("simpar.topologies"))) / kind


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in presets_dir(kind).glob("*.yaml"))


def resolve(kind: str, name_or_path: str | Path, what: str) -> Path:
    """A preset name (``dgx-h100``) or a path to a user's YAML file. A bare name (no folder, no
    .yaml/.yml/.json ending) is the preset of that name, unless an existing file in the working
    directory has the same name, which is refused naming both; a folder is never a preset file,
    so a folder named like a preset (``deepspeed/``, ``llama3-8b/``) does not shadow it."""
    text = str(name_or_path)
    try:
        return _resolve(kind, text, what)
    except OSError as exc:  # a name the file system refuses (too long, ...)
        problem = f"{text[:80]!r} cannot be a file name ({exc.strerror})."
        raise SpecError(what, problem, "give a preset name or a path.") from None


def _resolve(kind: str, text: str, what: str) -> Path:
    p = Path(text)
    cand = presets_dir(kind) / f"{text}.yaml"
    pathlike = p.suffix in (".yaml", ".yml", ".json") or "/" in text or os.sep in text
    preset = not pathlike and bool(text) and cand.is_file()
    if p.is_file():
        if preset:
            raise SpecError(
                what,
                f"{text!r} names both the preset {text} and the file {text} in the working directory.",
                f"write ./{text} for the file, or rename the file to use the preset.",
            )
        return p
    if preset:
        return cand
    if pathlike:
        problem = "is a folder, not a file" if p.is_dir() else "does not exist"
        raise SpecError(what, f"file {text!r} {problem}.", "give a preset name or an existing file.")
    names = ", ".join(preset_names(kind))
    folder = " (a folder of that name is not a preset file)" if p.is_dir() else ""
    raise SpecError(what, f"unknown preset {text!r}{folder}.", f"use one of: {names}; or a path to a YAML file.")


def read_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML/JSON file of keys and values (`simpar.sim.files` reports every failure)."""
    return files.read_mapping(path, what)


def build(model: type[T], data: dict[str, Any], source: str) -> T:
    """Validate ``data`` into ``model``; one clear line on failure."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            fix = f"add `{loc}` to the file."
        elif err["type"] == "extra_forbidden":
            fields = _fields_at(model, err["loc"][:-1])
            fix = f"remove or rename `{loc}` (allowed keys: {', '.join(fields)})."
        else:
            fix = f"correct `{loc}`."
        raise SpecError(f"{source}: {loc}", msg + ".", fix) from None


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the (nested) model found at ``loc``; the top model's when not a model."""
    current: type[BaseModel] = model
    for part in loc:
        field = current.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return list(current.model_fields)
        current = ann
    return list(current.model_fields)


def load(kind: str, model: type[T], name_or_path: str | Path, what: str) -> T:
    path = resolve(kind, name_or_path, what)
    data = read_mapping(path, what)
    data.setdefault("name", path.stem)
    return build(model, data, str(path) if path.parent != presets_dir(kind) else f"{kind}/{path.name}")
