"""The files a launch script reads besides itself (`Files`), for `megatron_script`'s interpreter:
``source FILE`` / ``. FILE``, whose commands run in the script's own variables (bash semantics: what
the file assigns is seen after it), and the job script an ``sbatch`` line submits, which runs as a new
shell in the environment sbatch gives the job.

Where a file is found. bash looks a relative FILE up in the working directory; simpar reads the launch
as run from its own folder (said in the notes), so FILE is looked for there, for a file sourced from a
sourced file too, and `` `pwd` ``, ``$(pwd)``, ``$PWD`` at the head of the name stand for that folder
(Megatron-LM's examples/sc21 scripts source `` `pwd` ``/CONFIG.sh and `` `pwd` ``/SBATCH.sh, run from
their folder). A name built from the script's own location (``$0``, ``BASH_SOURCE``, ``dirname``) or
from a value simpar does not know is refused by name, and so is a relative name in a launch given as
text (there is no folder to look in). Each file is read through `sim.files.read_text`; a missing one
is refused naming it and the line that reads it. At most `MAX_DEPTH` files are read one inside
another, and a file that reads one still being read (a cycle) is refused naming both. Arguments after
FILE (``source FILE ARGS``: $1.. inside it) are refused.

sbatch (Slurm's src/sbatch/opt.c: its getopt string and long options): the first word after sbatch's
options is the job script, whose ``#SBATCH`` lines before its first command are options too (the
command line's win). Its environment is sbatch(1)'s ``--export``: ``ALL`` (the default) the
exported variables, ``NAME`` a named exported one, ``NAME=value`` that value (under ``ALL``, only where
the caller's environment has no NAME), ``NONE`` none; nothing it assigns comes back. Refused by name:
``--wrap`` (a command line, not a job script), ``--export-file`` and ``--get-user-env`` (an
environment simpar does not see), ``--chdir`` (another folder), arguments after the job script, and an
sbatch line with no job script (one read from standard input).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import files
from ..errors import SpecError
from ..files import read_text
from .schema import key_name

#: how many files simpar reads one inside another (sourced, or submitted by sbatch)
MAX_DEPTH = 8

#: sbatch's short options that take a value, and those that take none (``k``: a value only attached),
#: from its getopt string "+ba:A:B:c:C:d:D:e:F:G:hHi:IJ:k::L:m:M:n:N:o:Op:P:q:QsS:t:uU:vVw:Wx:"
SBATCH_SHORT_VALUE = frozenset("aABcCdDeFGiJLmMnNopPqStUwx")
SBATCH_SHORT_FLAG = frozenset("bhHIOQsuvVWk")
#: sbatch's long options that take no value, or one only after "=" (no_argument / optional_argument);
#: every other one takes the next word when it is given without "="
SBATCH_LONG_FLAG = frozenset(
    {"help", "hold", "immediate", "overcommit", "oversubscribe", "quiet", "share", "usage", "verbose"}
    | {"version", "wait", "contiguous", "ignore-pbs", "no-requeue", "reboot", "requeue", "spread-job"}
    | {"test-only", "use-min-nodes", "no-kill", "exclusive", "get-user-env", "nice", "parsable", "propagate", "x11"}
)
#: sbatch options simpar does not follow: (why, the fix), by long name (short ones are mapped to it)
SBATCH_REFUSED = {
    "wrap": ("gives the job as a command line, which simpar does not read", "put the launch in a job script"),
    "export-file": ("loads the job's environment from a file", "use --export=NAME,..."),
    "get-user-env": ("loads the job's environment from the user's login", "use --export=NAME,..."),
    "chdir": ("runs the job in another folder", "drop it"),
    "workdir": ("runs the job in another folder", "drop it"),
}
_SHORT_NAMES = {"D": "chdir"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Part = tuple[str, Any]  # a word's part, as `megatron_script` lexes it: (kind, text)


def _own_place(word: list[Part]) -> bool:
    """Whether ``word`` names a path by the script's own location ($0, BASH_SOURCE, dirname)."""
    for kind, text in word:
        if kind == "dq" and _own_place(text):
            return True
        if kind == "var" and text == "0":
            return True
        if kind == "param" and re.match(r"#?(0\b|BASH_SOURCE)", text):
            return True
        if kind == "cmd" and re.search(r"\bdirname\b|\$\{?0\b|BASH_SOURCE|readlink|realpath", text[0]):
            return True
    return False


def _is_pwd(part: Part) -> bool:
    kind, text = part
    return (kind == "cmd" and text[0].strip() == "pwd") or (kind in ("var", "param") and text == "PWD")


class Files:
    """The files one reading of a launch script has open: the script itself (``path``; None for a
    launch given as text), and those it sources or submits, innermost last."""

    def __init__(
        self, path: Path | None, where: str, notes: list[str], unknown_in: Callable[[str], str | None]
    ) -> None:
        self.where = where  # what messages start with ("Megatron-LM arguments")
        self.folder = None if path is None else path.parent
        self.open: list[tuple[Path, str]] = [] if path is None else [(_real(path), path.name)]
        self.base = len(self.open)
        self.notes = notes
        self.unknown_in = unknown_in

    def folder_word(self, word: list[Part], at: str, head: str) -> list[Part]:
        """``word`` (the name after ``source``) with a leading `` `pwd` `` / ``$PWD`` written ``.``: the
        script's folder, where `reading` looks a relative name up; its own-location forms refused. ``at``:
        the line that reads it (``line 3``, ``SBATCH.sh line 4``)."""
        place = f"{self.where} {at}"
        if _own_place(word):
            raise SpecError(
                f"{place}: {head}",
                "names the file by the script's own location ($0, BASH_SOURCE, dirname), which simpar does not follow.",
                "write the file's name relative to the script's folder, or pass the launch line itself.",
            )
        inner = word[0][1] if word and word[0][0] == "dq" else None
        first = inner[0] if inner else word[0] if word else None
        if first is None or not _is_pwd(first):
            return word
        if self.folder is None:
            raise self._no_folder(place, head, "`pwd`")
        folder = ("sq", ".")  # the folder it is looked up in (`reading`)
        return [("dq", [folder, *inner[1:]]), *word[1:]] if inner else [folder, *word[1:]]

    def name(self, fields: list[str], at: str, head: str) -> str:
        """The one file name ``source`` is given (its expanded words; ``--`` before it dropped)."""
        place = f"{self.where} {at}"
        fields = fields[1:] if fields[:1] == ["--"] else fields
        if not fields or not fields[0]:
            raise SpecError(f"{place}: {head}", "names no file.", "write the file's name after it.")
        what = self.unknown_in(fields[0])
        if what is not None:
            raise SpecError(
                f"{place}: {head}",
                f"reads a file whose name is {what}: simpar cannot tell which file it is.",
                "write the file's name, or pass the launch line itself.",
            )
        if len(fields) > 1:
            raise SpecError(
                f"{place}: {head} with arguments",
                f"passes {key_name(' '.join(fields[1:]))} to {key_name(fields[0])} ($1.. inside it), which simpar "
                "does not read.",
                "set the values as variables before the line, or pass the launch line itself.",
            )
        return fields[0]

    @contextmanager
    def reading(self, name: str, at: str, head: str) -> Iterator[tuple[str, str]]:
        """(its label, its text) of the file ``name``, held open while its commands run."""
        place = f"{self.where} {at}"
        path = Path(name)
        beside = not path.is_absolute()
        if beside:
            if self.folder is None:
                raise self._no_folder(place, head, name)
            self._note_folder()
            path = self.folder / path
        inside = self.folder is not None and path.is_relative_to(self.folder)
        label = key_name(str(path.relative_to(self.folder)) if self.folder is not None and inside else name)
        if not files.is_file(path):
            raise SpecError(
                f"{place}: {head} {label}",
                f"reads {label}, which is not next to the script ({key_name(str(path))} is not a file)."
                if beside
                else f"reads {label}, which is not a file.",
                f"put {label} next to the script, or pass the launch line itself."
                if beside
                else "check the path, or pass the launch line itself.",
            )
        real = _real(path)
        labels = [lab for p, lab in self.open]
        if any(p == real for p, _ in self.open):
            chain = " -> ".join(labels[[p for p, _ in self.open].index(real) :] + [label])
            raise SpecError(
                f"{place}: {head} {label}",
                f"reads {label}, which is still being read ({chain}): the files read each other in a cycle.",
                "remove one of the two lines.",
            )
        if len(self.open) - self.base >= MAX_DEPTH:
            raise SpecError(
                f"{place}: {head} {label}",
                f"would be the {len(self.open) - self.base + 1}th file read one inside another "
                f"({' -> '.join([*labels, label])}); simpar follows {MAX_DEPTH}.",
                "read fewer files inside one another, or pass the launch line itself.",
            )
        text = read_text(path, f"{place}: {head}")
        self.open.append((real, label))
        try:
            yield label, text
        finally:
            self.open.pop()

    def _note_folder(self) -> None:
        note = f"files read relative to the script's folder ({self.folder}), as if it were run from there"
        if note not in self.notes:
            self.notes.append(note)

    def _no_folder(self, place: str, head: str, name: str) -> SpecError:
        return SpecError(
            f"{place}: {head} {key_name(name)}",
            "reads a file beside the script, and the launch was given as text, not as a file in its folder.",
            "pass the script's path (with the file next to it), or the launch line itself.",
        )

    def sbatch(self, fields: list[str], at: str) -> tuple[str, str | None]:
        """(the job script, the --export value or None) of the sbatch line ``fields``."""
        place = f"{self.where} {at}"
        i, export = _sbatch_options(fields, 1, place)
        if i >= len(fields):
            raise SpecError(
                f"{place}: sbatch",
                "submits no job script (it would read one from standard input, which simpar does not see).",
                "name the job script after sbatch's options, or pass the launch line itself.",
            )
        if i + 1 < len(fields):
            raise SpecError(
                f"{place}: sbatch {key_name(fields[i])} with arguments",
                f"passes {key_name(' '.join(fields[i + 1 :]))} to the job script ($1.. inside it), which simpar "
                "does not read.",
                "export them as variables instead, or pass the launch line itself.",
            )
        return fields[i], export

    def _directives(self, text: str, where: str) -> str | None:
        """The --export of a job script's own ``#SBATCH`` lines (None: they give none), read as sbatch
        reads them: the lines before its first command, each split as a shell splits words."""
        words = ["#SBATCH"]
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if line.startswith("#SBATCH"):
                try:
                    words += shlex.split(line[len("#SBATCH") :], comments=True)
                except ValueError:
                    raise SpecError(
                        f"{where} line {n}: #SBATCH", "opens a quote it does not close.", "close it."
                    ) from None
            elif line and not line.startswith("#"):
                break
        return _sbatch_options(words, 1, f"{where} #SBATCH lines")[1]

    def job_env(
        self, export: str | None, text: str, label: str, variables: Mapping[str, Any], exported: set[str], at: str
    ) -> dict[str, Any]:
        """The variables the job script ``text`` (``label``) starts with: those the sbatch line's
        ``--export`` gives it, else its own ``#SBATCH --export``, else ALL (arrays are not exported); a
        note says which."""
        place = f"{self.where} {at}"
        own = self._directives(text, f"{self.where} {label}")  # read whatever the line gives: it may refuse
        export = export or own or "ALL"
        what = self.unknown_in(export)
        if what is not None:
            raise SpecError(
                f"{place}: sbatch --export",
                f"is {what}: simpar cannot tell which variables the job sees.",
                "write the names, or pass the launch line itself.",
            )
        items = [x for x in export.split(",") if x]
        given = {k: variables[k] for k in exported if isinstance(variables.get(k), str)}
        env = dict(given) if "ALL" in items else {}
        for item in items:
            name, eq, value = item.partition("=")
            if item in ("ALL", "NONE"):
                continue
            if not _NAME.fullmatch(name):
                raise SpecError(
                    f"{place}: sbatch --export",
                    f"names {key_name(name)}, which is not a variable name.",
                    "write --export=NAME,NAME=value,...",
                )
            if eq and not (name in env and "ALL" in items):  # under ALL, the caller's value is kept
                env[name] = value
            elif not eq and name in given:
                env[name] = given[name]
        self.notes.append(
            f"sbatch at {at}: its job script {label} read with {', '.join(sorted(env)) or 'no variables'} "
            f"(--export={export}); the GPUs it asks Slurm for are not read (the command's --gpus is)"
        )
        return env


def _sbatch_options(fields: list[str], i: int, place: str) -> tuple[int, str | None]:
    """(the index of the first word after sbatch's options in ``fields`` from ``i``, their --export
    or None); an option simpar does not follow is refused by name."""
    export = None
    while i < len(fields) and fields[i].startswith("-") and fields[i] != "-":
        word = fields[i]
        i += 1
        if word == "--":
            break
        if word.startswith("--"):
            key, eq, value = word[2:].partition("=")
            if not eq and key not in SBATCH_LONG_FLAG:
                if i >= len(fields):
                    raise SpecError(f"{place}: sbatch --{key_name(key)}", "needs a value.", "give it one.")
                value, i = fields[i], i + 1
        else:
            key, value, j = "", "", 1
            while j < len(word):
                ch, j = word[j], j + 1
                if ch in SBATCH_SHORT_VALUE:
                    key, value = ch, word[j:]
                    if not value:
                        if i >= len(fields):
                            raise SpecError(f"{place}: sbatch -{ch}", "needs a value.", "give it one.")
                        value, i = fields[i], i + 1
                    break
                if ch not in SBATCH_SHORT_FLAG:
                    raise SpecError(
                        f"{place}: sbatch -{key_name(ch)}",
                        "is not an sbatch option.",
                        "check the spelling, or remove it.",
                    )
            key = _SHORT_NAMES.get(key, key)
        if key in SBATCH_REFUSED:
            why, fix = SBATCH_REFUSED[key]
            raise SpecError(f"{place}: sbatch --{key}", f"{why}.", f"{fix}, or pass the launch line itself.")
        if key == "export":
            export = value
    return i, export


def exported(head: str, words: list[str], names: set[str]) -> None:
    """Mark in ``names`` the variables ``export`` / ``declare -x`` / ``typeset -x`` give a job's
    environment (``export -n``: no longer); ``words``: the leading text of each word after ``head``."""
    flags = "".join(w[1:] for w in words if w.startswith("-"))
    if head != "export" and "x" not in flags:
        return
    for w in words:
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(\+?=|$)", w)
        if m is not None:
            (names.discard if head == "export" and "n" in flags else names.add)(m.group(1))


def allexport(args: list[str], now: bool) -> bool:
    """Whether ``set ARGS`` leaves bash exporting every variable it assigns (``-a``, ``-o allexport``)."""
    for i, a in enumerate(args):
        if re.fullmatch(r"[-+][A-Za-z]*a[A-Za-z]*", a) or (a == "allexport" and i and args[i - 1] in ("-o", "+o")):
            now = (a if a != "allexport" else args[i - 1]).startswith("-")
    return now


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: compared as written
        return path.absolute()
