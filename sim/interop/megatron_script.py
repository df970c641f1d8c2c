"""A Megatron-LM launch script as users keep it, read into the launch's words without running bash
(`read_script`): a small interpreter of the subset of bash such scripts are written in.

Read: variable assignments (``TP=8``, ``export A=1 B=2``, ``declare``/``local``/``readonly``), arrays
(``ARGS=( --a 1 )``, ``ARGS+=( ... )``, ``"${ARGS[@]}"``, ``${ARGS[*]}``, ``${#ARGS[@]}``),
expansions (``$X``, ``${X}``, ``${X:-d}``, ``${X-d}``, ``${X:=d}``, ``${X:?m}``, ``${X:+a}``),
integer arithmetic ``$(( ))``, quoting and word splitting as bash does them, line continuations and
comments, ``if``/``elif``/``else`` on ``[ ]``, ``[[ ]]``, ``test``, ``true``/``false`` (string and
integer comparisons, ``-z``/``-n``, glob patterns), ``eval`` of a command held in a variable, and the
launch itself: ``torchrun``, ``python [-m torch.distributed.run|launch]``, ``deepspeed``, ``srun``
... followed by the training script (``*.py``) and its arguments (a pipe or a redirection after it,
``| tee log``, is dropped).

The script is read as run without arguments in a clean environment: ``$#`` is 0, and a positional
parameter or a variable the script does not set has no value that simpar knows. ``${X:-d}`` then
reads as ``d`` (said in the notes); a bare ``$X`` becomes an unknown value (`UNKNOWN` mark), which
is fine as the value of an argument that does not change the answer and refused where simpar needs
it (`unknown_in`). Command substitution (``$(...)``, backticks) and file tests (``-f``) give
unknown values too.

Decided constructs: an ``if`` whose condition is known runs its branch; one whose condition is not
known (a file test, an unknown value) runs no branch, and every variable either branch sets becomes
unknown (refused only where the launch uses it). A loop (``for``, ``while``, ``until``, ``select``),
a ``case``, a function body and a ``{ }``/``( )`` group are not run: the variables they set become
unknown the same way, and a launch inside one is refused naming the construct and its line. So are a
here-document, two launches, and none. Every refusal is one `SpecError` naming the line and the construct.

Other files (`shell_source.Files`): ``source FILE`` / ``. FILE`` runs FILE's commands in the script's
own variables, and ``sbatch [options] JOB.sh`` runs the job script in the environment sbatch gives it
(``--export``: which variables are exported is tracked, ``export``, ``declare -x``, ``set -a``); both
are looked for beside the script read as a file, and what cannot be found or followed is refused by
name. A message about a line of another file names the file (``SRUN.sh line 14``).
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from .shell_source import Files, allexport, exported

#: marks an unknown value inside a word: "\x00U<n>\x00"; `Script.unknowns[n]` says where it came from
UNKNOWN = re.compile("\x00U([0-9]+)\x00")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?)=")
#: commands that start a launch (their basename); anything else before a *.py is not one
LAUNCHERS = frozenset(
    {"torchrun", "python", "python3", "deepspeed", "srun", "mpirun", "mpiexec", "nsys", "numactl", "env"}
    | {"taskset", "exec", "time", "nohup", "ncu", "accelerate", "uv", "conda", "apptainer", "singularity"}
)
#: commands that neither set variables nor launch (read and skipped)
_SKIPPED = frozenset(
    {"echo", "printf", "mkdir", "cd", "pushd", "popd", "rm", "cp", "mv", "ln", "touch", "cat", "ls", "sleep"}
    | {"set", "unset", "shopt", "trap", "ulimit", "umask", "wait", "exit", "return", "shift", "tee", "date"}
    | {"nvidia-smi", "hostname", "pip", "git", "chmod", "wandb", "huggingface-cli", "module", "ml", "which"}
    | {"true", "false", ":", "sync", "kill", "pkill", "scontrol", "mpirun_rsh", "wget", "curl"}
)


@dataclass
class Script:
    """What a launch script comes to: the launch's words and what simpar could not know."""

    launcher: list[str]  # the words before the training script (torchrun and its options)
    script: str | None  # the training script (None: a bare argument list)
    args: list[str]  # the training script's arguments
    line: int | None  # the launch's line (None: a bare argument list)
    notes: list[str] = field(default_factory=list)  # defaults used, for the warning block
    unknowns: dict[int, str] = field(default_factory=dict)  # UNKNOWN mark -> what it stands for
    file: str | None = None  # the file holding the launch, where it is one the script reads (SRUN.sh)

    @property
    def place(self) -> str:
        """Where the launch is: ``line 12``, or ``SRUN.sh line 14`` in a file the script reads."""
        return _place(self.file, self.line)

    def unknown_in(self, value: str) -> str | None:
        """What the first unknown value in ``value`` stands for (None: ``value`` is known)."""
        m = UNKNOWN.search(value)
        return None if m is None else self.unknowns[int(m.group(1))]

    def shown(self, value: str) -> str:
        """``value`` with its unknown parts written as ``<what>``."""
        return UNKNOWN.sub(lambda m: "<" + self.unknowns[int(m.group(1))].split(" (")[0] + ">", value)


def _place(file: str | None, line: int | None) -> str:
    return f"{file + ' ' if file else ''}line {line}"


# ---------------------------------------------------------------------------------------------
# words: a word is a list of parts (kind, text): "lit" (unquoted), "sq" (single-quoted),
# "dq" (double-quoted: a list of parts of its own), "param" (${...}), "var" ($X), "cmd" ($(...),
# `...`), "arith" ($((...)))
Part = tuple[str, Any]


@dataclass
class Tok:
    kind: str  # "word", "op", "nl", "array"
    value: Any
    line: int


class _Lexer:
    def __init__(self, text: str, where: str) -> None:
        self.s = text.replace("\r\n", "\n")
        self.i = 0
        self.line = 1
        self.where = where

    def fail(self, line: int, construct: str, problem: str, fix: str) -> SpecError:
        return SpecError(f"{self.where} line {line}: {construct}", problem, fix)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def tokens(self) -> list[Tok]:
        out: list[Tok] = []
        while self.i < len(self.s):
            c = self.peek()
            if c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c in " \t":
                self.i += 1
            elif c == "\n":
                out.append(Tok("nl", "\n", self.line))
                self.i += 1
                self.line += 1
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            elif c in ";&|()<>":
                out.append(self._operator())
            else:
                line = self.line
                word = self._word()
                if self.peek() != "" and self.peek() in "<>" and str(_plain(word)).isdigit():
                    continue  # a file descriptor before a redirection (2>&1): dropped with it
                if self.peek() == "(" and word and word[-1][0] == "lit" and _ASSIGN.match(_flat_lit(word)):
                    out.append(Tok("array", (_flat_lit(word), self._array()), line))
                else:
                    out.append(Tok("word", word, line))
        out.append(Tok("nl", "\n", self.line))
        return out

    def _operator(self) -> Tok:
        line = self.line
        for op in (";;", "&&", "||", "<<", ">>", "&>", "2>&1", ">&", ";", "&", "|", "(", ")", "<", ">"):
            if self.s.startswith(op, self.i):
                if op == "<<":
                    raise self.fail(
                        line, "here-document", "is not read by simpar.", "write the launch's arguments on the line."
                    )
                self.i += len(op)
                return Tok("op", op, line)
        raise AssertionError("unreachable")  # every operator character is listed above

    def _array(self) -> list[list[Part]]:
        """The elements of ``NAME=( ... )`` (the lexer is at the opening parenthesis)."""
        start = self.line
        self.i += 1
        items: list[list[Part]] = []
        while True:
            if self.i >= len(self.s):
                raise self.fail(start, "array", "has no closing parenthesis.", "close it with ).")
            c = self.peek()
            if c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c in " \t":
                self.i += 1
            elif c == "\n":
                self.i += 1
                self.line += 1
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            elif c == ")":
                self.i += 1
                return items
            elif c in ";&|(<>":
                raise self.fail(self.line, "array", f"holds {c!r}, which bash does not allow there.", "quote it.")
            else:
                items.append(self._word())

    def _word(self, stops: str = " \t\n;&|()<>") -> list[Part]:
        parts: list[Part] = []
        lit = ""
        while self.i < len(self.s):
            c = self.peek()
            if c in stops:
                break
            if c == "\\":
                nxt = self.peek(1)
                self.i += 2
                if nxt == "\n":
                    self.line += 1
                else:
                    parts, lit = _push(parts, lit), ""
                    parts.append(("sq", nxt))
                continue
            if c in "'\"$`":
                parts, lit = _push(parts, lit), ""
                if c == "'":
                    parts.append(("sq", self._until("'")))
                elif c == '"':
                    parts.append(("dq", self._double()))
                else:
                    parts.append(self._dollar())
                continue
            lit += c
            self.i += 1
        return _push(parts, lit)

    def _until(self, end: str) -> str:
        start = self.line
        j = self.s.find(end, self.i + 1)
        if j < 0:
            raise self.fail(start, "quote", f"opens a {end} quote it does not close.", "close every quote.")
        text = self.s[self.i + 1 : j]
        self.line += text.count("\n")
        self.i = j + 1
        return text

    def _double(self) -> list[Part]:
        start = self.line
        self.i += 1
        parts: list[Part] = []
        lit = ""
        while True:
            if self.i >= len(self.s):
                raise self.fail(start, "quote", 'opens a " quote it does not close.', "close every quote.")
            c = self.peek()
            if c == '"':
                self.i += 1
                return _push(parts, lit)
            if c == "\\" and self.peek(1) in '$`"\\\n':
                if self.peek(1) == "\n":
                    self.line += 1
                else:
                    lit += self.peek(1)
                self.i += 2
                continue
            if c in "$`":
                parts, lit = _push(parts, lit), ""
                parts.append(self._dollar())
                continue
            if c == "\n":
                self.line += 1
            lit += c
            self.i += 1

    def _balanced(self, open_: str, close: str, skip: int) -> str:
        """The text up to the ``close`` matching an ``open_`` (the lexer is ``skip`` characters
        before the body), quotes respected."""
        start = self.line
        self.i += skip
        depth, j = 1, self.i
        while j < len(self.s):
            c = self.s[j]
            if c in "'\"":
                k = self.s.find(c, j + 1)
                j = (k if k >= 0 else len(self.s)) + 1
                continue
            if c == "\\":
                j += 2
                continue
            depth += (c == open_) - (c == close)
            if depth == 0:
                body = self.s[self.i : j]
                self.line += body.count("\n")
                self.i = j + 1
                return body
            j += 1
        raise self.fail(start, f"{open_}...{close}", f"has no closing {close}.", f"close it with {close}.")

    def _dollar(self) -> Part:
        if self.peek() == "`":
            start = self.line
            return ("cmd", (self._until("`"), start))
        nxt = self.peek(1)
        if self.s.startswith("$((", self.i):
            body = self._balanced("(", ")", 3)
            if self.peek() != ")":
                raise self.fail(self.line, "$((...))", "is not closed by )).", "close it.")
            self.i += 1
            return ("arith", body)
        if nxt == "(":
            start = self.line
            return ("cmd", (self._balanced("(", ")", 2), start))
        if nxt == "{":
            return ("param", self._balanced("{", "}", 2))
        if nxt == "'":  # $'...': ANSI-C quoting, read as a single-quoted string
            self.i += 1
            return ("sq", self._until("'"))
        m = _NAME.match(self.s, self.i + 1)
        if m:
            self.i = m.end()
            return ("var", m.group(0))
        if nxt and (nxt.isdigit() or nxt in "#@*?$!-"):
            self.i += 2
            return ("var", nxt)
        self.i += 1
        return ("lit", "$")


def _push(parts: list[Part], lit: str) -> list[Part]:
    return [*parts, ("lit", lit)] if lit else parts


def _flat_lit(word: list[Part]) -> str:
    return "".join(t for k, t in word if k == "lit")


def _plain(word: list[Part]) -> str | None:
    """The text of a word with no expansion in it (None where it has one)."""
    out = ""
    for k, t in word:
        if k in ("lit", "sq"):
            out += t
        elif k == "dq" and all(kk == "lit" for kk, _ in t):
            out += "".join(tt for _, tt in t)
        else:
            return None
    return out


# ---------------------------------------------------------------------------------------------
# commands
@dataclass
class Simple:
    words: list[list[Part]]
    arrays: list[tuple[str, list[list[Part]]]]  # NAME=( ... ) / NAME+=( ... ) in this command
    line: int
    piped: bool = False  # a pipe follows (the launch's words are this command's)


@dataclass
class Block:
    kind: str  # "if", "for", "while", "until", "select", "case", "function", "group", "subshell"
    line: int
    body: list[Any]  # commands (for "if": the branches' bodies, conditions apart)
    conds: list[list[Simple]] = field(default_factory=list)  # "if": each branch's condition
    orelse: list[Any] | None = None
    joins: list[list[str]] = field(default_factory=list)  # "if": the && / || between condition commands


_OPENERS = {"if": "fi", "for": "done", "while": "done", "until": "done", "select": "done", "case": "esac"}


class _Parser:
    def __init__(self, toks: list[Tok], where: str) -> None:
        self.t = toks
        self.i = 0
        self.where = where

    def fail(self, line: int, construct: str, problem: str, fix: str) -> SpecError:
        return SpecError(f"{self.where} line {line}: {construct}", problem, fix)

    def word_at(self, k: int = 0) -> str | None:
        j = self.i + k
        if j < len(self.t) and self.t[j].kind == "word":
            return _plain(self.t[j].value)
        return None

    def parse(self, stop: frozenset[str] = frozenset()) -> list[Any]:
        """Commands up to a word in ``stop`` (or ``)`` / ``;;`` where those are in it)."""
        out: list[Any] = []
        while self.i < len(self.t):
            tok = self.t[self.i]
            if tok.kind == "op" and tok.value in (")", ";;") and tok.value in stop:
                return out
            if tok.kind == "nl" or (tok.kind == "op" and tok.value in (";", "&", "&&", "||")):
                self.i += 1
                continue
            if self.word_at() in stop:
                return out
            start = self.i
            out.append(self.command())
            if self.i == start:  # an operator no command takes here: ")" without "(", a stray ";;"
                raise self.fail(tok.line, str(tok.value), "stands where bash expects a command.", "remove it.")
        if stop:
            raise self.fail(
                self.t[-1].line, "end of file", f"comes before {' / '.join(sorted(stop))}.", "close the block."
            )
        return out

    def command(self) -> Any:
        tok = self.t[self.i]
        w = self.word_at()
        if w == "if":
            return self.if_block()
        if w in ("for", "while", "until", "select"):
            return self.skip_block(w, "do", "done")
        if w == "case":
            return self.skip_block("case", None, "esac")
        if w == "function" or (
            w is not None and self.i + 2 < len(self.t) and self.t[self.i + 1].value == "(" and self._is_func()
        ):
            return self.function()
        if w == "{":
            self.i += 1
            body = self.parse(frozenset({"}"}))
            self.i += 1
            return Block("group", tok.line, body)
        if tok.kind == "op" and tok.value == "(":
            self.i += 1
            body = self.parse(frozenset({")"}))
            self.i += 1
            return Block("subshell", tok.line, body)
        return self.simple()

    def _is_func(self) -> bool:
        return self.i + 2 < len(self.t) and self.t[self.i + 2].kind == "op" and self.t[self.i + 2].value == ")"

    def simple(self) -> Simple:
        line = self.t[self.i].line
        words: list[list[Part]] = []
        arrays: list[tuple[str, list[list[Part]]]] = []
        in_test = False
        while self.i < len(self.t):
            tok = self.t[self.i]
            if tok.kind == "nl" and not in_test:
                break
            if tok.kind == "op":
                if in_test and tok.value in ("&&", "||", "(", ")", "<", ">"):
                    words.append([("lit", tok.value)])
                    self.i += 1
                    continue
                if tok.value in (">", ">>", "<", "&>", ">&"):  # a redirection and its target: dropped
                    self.i += 2 if self.i + 1 < len(self.t) and self.t[self.i + 1].kind == "word" else 1
                    continue
                if tok.value == "2>&1":
                    self.i += 1
                    continue
                if tok.value == "|":
                    self.i += 1
                    rest = self.simple()  # the commands a pipe feeds: read, not run
                    del rest
                    return Simple(words, arrays, line, piped=True)
                break
            if tok.kind == "array":
                arrays.append(tok.value)
            elif tok.kind == "word":
                plain = _plain(tok.value)
                if plain == "[[" and not words:
                    in_test = True
                elif plain == "]]":
                    in_test = False
                words.append(tok.value)
            self.i += 1
        if in_test:
            raise self.fail(line, "[[", "is not closed by ]].", "close the test.")
        return Simple(words, arrays, line)

    def if_block(self) -> Block:
        line = self.t[self.i].line
        self.i += 1
        conds: list[list[Simple]] = []
        joins: list[list[str]] = []
        bodies: list[Any] = []
        orelse: list[Any] | None = None
        while True:
            cond, join = self.condition()
            conds.append(cond)
            joins.append(join)
            if self.word_at() != "then":
                raise self.fail(line, "if", "has no then.", "write if CONDITION; then ... fi.")
            self.i += 1
            bodies.append(self.parse(frozenset({"elif", "else", "fi"})))
            w = self.word_at()
            self.i += 1
            if w == "elif":
                continue
            if w == "else":
                orelse = self.parse(frozenset({"fi"}))
                self.i += 1
            return Block("if", line, bodies, conds, orelse, joins)

    def condition(self) -> tuple[list[Simple], list[str]]:
        cmds: list[Simple] = []
        joins: list[str] = []
        while True:
            while self.t[self.i].kind == "nl":
                self.i += 1
            cmds.append(self.simple())
            tok = self.t[self.i]
            if tok.kind == "op" and tok.value in ("&&", "||"):
                joins.append(tok.value)
                self.i += 1
                continue
            if tok.kind == "op" and tok.value == ";" or tok.kind == "nl":
                self.i += 1
                while self.t[self.i].kind == "nl":
                    self.i += 1
            return cmds, joins

    def skip_block(self, kind: str, opener: str | None, closer: str) -> Block:
        """A loop or case: its commands are parsed (a launch inside is named), not run."""
        line = self.t[self.i].line
        self.i += 1
        if kind == "case":
            return self._case(line)
        if kind in ("while", "until"):
            cond, joins = self.condition()
            if self.word_at() != "do":
                raise self.fail(line, kind, "has no do.", f"write {kind} CONDITION; do ... done.")
            self.i += 1
            body = self.parse(frozenset({closer}))
            self.i += 1
            return Block(kind, line, body, [cond], None, [joins])
        while self.word_at() != opener:
            if self.i >= len(self.t) - 1:
                raise self.fail(line, kind, f"has no {opener}.", f"write {kind} ...; {opener} ... {closer}.")
            self.i += 1
        self.i += 1
        body = self.parse(frozenset({closer}))
        self.i += 1
        return Block(kind, line, body)

    def _case(self, line: int) -> Block:
        body: list[Any] = []
        while self.word_at() != "in":
            if self.i >= len(self.t) - 1:
                raise self.fail(line, "case", "has no in.", "write case WORD in ... esac.")
            self.i += 1
        self.i += 1
        while True:
            while self.t[self.i].kind == "nl":
                self.i += 1
            if self.word_at() == "esac":
                self.i += 1
                return Block("case", line, body)
            while not (self.t[self.i].kind == "op" and self.t[self.i].value == ")"):  # the pattern
                if self.i >= len(self.t) - 1:
                    raise self.fail(line, "case", "has a pattern without ).", "write PATTERN) ... ;;.")
                self.i += 1
            self.i += 1
            body += self.parse(frozenset({"esac", ";;"}))
            if self.i < len(self.t) and self.t[self.i].kind == "op" and self.t[self.i].value == ";;":
                self.i += 1

    def function(self) -> Block:
        line = self.t[self.i].line
        if self.word_at() == "function":
            self.i += 1
        self.i += 1  # the name
        if self.t[self.i].kind == "op" and self.t[self.i].value == "(":
            self.i += 2
        while self.t[self.i].kind == "nl":
            self.i += 1
        if self.word_at() != "{":
            raise self.fail(line, "function", "has no { body }.", "write NAME() { ...; }.")
        self.i += 1
        body = self.parse(frozenset({"}"}))
        self.i += 1
        return Block("function", line, body)


# ---------------------------------------------------------------------------------------------
# the interpreter
Value = str | list[str]


@dataclass
class _Found:
    words: list[str]
    line: int
    file: str | None  # the file read beside the script that holds it (None: the script)


class _Interp:
    def __init__(self, where: str, path: Path | None = None) -> None:
        self.where = where
        self.vars: dict[str, Value] = {}
        self.exported: set[str] = set()  # the variables a job submitted with sbatch sees (--export=ALL)
        self.allexport = False  # set -a
        self.unknowns: dict[int, str] = {}
        self.notes: list[str] = []
        self.launches: list[_Found] = []
        self.line = 0
        self.file: str | None = None  # the file being read, where it is not the script
        self.files = Files(path, where, self.notes, self.unknown_in)

    @property
    def label(self) -> str:
        """What a message about the file being read starts with."""
        return f"{self.where} {self.file}" if self.file else self.where

    def at(self, line: int | None = None) -> str:
        """``line N`` of the script, or ``FILE line N`` of a file it reads (the current line by default)."""
        return _place(self.file, self.line if line is None else line)

    def fail(self, line: int, construct: str, problem: str, fix: str) -> SpecError:
        return SpecError(f"{self.label} line {line}: {construct}", problem, fix)

    def unknown_in(self, value: str) -> str | None:
        """What the first unknown value in ``value`` stands for (None: ``value`` is known)."""
        m = UNKNOWN.search(value)
        return None if m is None else self.unknowns[int(m.group(1))]

    def unknown(self, what: str) -> str:
        """A mark for a value simpar does not know; ``what`` (one line) says where it comes from."""
        n = len(self.unknowns)
        self.unknowns[n] = " ".join(what.replace("\x00", "").split())
        return f"\x00U{n}\x00"

    # -- expansion
    def lookup(self, name: str) -> Value | None:
        if name == "#":
            return "0"  # run without arguments
        if name in ("@", "*"):
            return []
        return self.vars.get(name)

    def absent(self, name: str) -> str:
        what = "a positional parameter" if name.isdigit() else "not set in the script"
        return self.unknown(f"${name} ({what}, {self.at()})")

    def scalar(self, v: Value) -> str:
        return " ".join(v) if isinstance(v, list) else v

    def param(self, body: str) -> Value:
        """The value of ``${body}`` (a list for ``${A[@]}``)."""
        m = re.fullmatch(r"#([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?", body)
        if m:
            v = self.lookup(m.group(1))
            if v is None:
                return self.absent(m.group(1))
            return str(len(v) if isinstance(v, list) else len(v) if not m.group(2) else 1)
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[#@*?$!])(?:\[([^\]]*)\])?(?:(:?[-=?+])(.*))?", body, re.S)
        if m is None:
            shown = body if len(body) <= 40 else body[:37] + "..."
            return self.unknown(f"${{{shown}}} (an expansion simpar does not read, {self.at()})")
        name, index, op, word = m.groups()
        v = self.lookup(name)
        if index is not None and v is not None:
            if index in ("@", "*"):
                v = v if isinstance(v, list) else [v]
            else:
                i = self.arith(index)
                items = v if isinstance(v, list) else [v]
                v = items[int(i)] if i.lstrip("-").isdigit() and -len(items) <= int(i) < len(items) else None
        if op is None:
            return self.absent(name) if v is None else v
        empty = v is None or (op.startswith(":") and self.scalar(v) == "")
        if op.endswith("+"):
            return "" if empty else self.expand_text(word)
        if not empty:
            assert v is not None
            return v
        if op.endswith("?"):
            return self.unknown(f"${name} ({self.expand_text(word) or 'required'}, {self.at()})")
        default = self.expand_text(word)
        if op.endswith("="):
            self.vars[name] = default
        if UNKNOWN.search(default) is None:
            self.notes.append(f"${name} unset: {default!r} ({self.at()})")
        return default

    def expand_text(self, text: str) -> str:
        """A string (a default, an eval's text) expanded as inside double quotes."""
        parts = _Lexer(text, self.label)._word(stops="")
        return " ".join(self.expand_parts(parts, quoted=True)[0])

    def arith(self, expr: str) -> str:
        """``$(( expr ))``: integers, + - * / % ** and comparisons over known variables."""

        def name(m: re.Match[str]) -> str:
            v = self.lookup(m.group(1))
            return self.scalar(v) if v is not None else "x"

        text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", name, expr)
        text = re.sub(r"\b([A-Za-z_][A-Za-z0-9_]*)\b", name, text)
        try:
            return str(_arith(ast.parse(text.strip() or "0", mode="eval").body))
        except (ValueError, SyntaxError, ZeroDivisionError, RecursionError, OverflowError):
            return self.unknown(f"$(({expr.strip()})) (arithmetic over values simpar does not know, {self.at()})")

    def expand_parts(self, parts: list[Part], quoted: bool) -> tuple[list[str], bool]:
        """(fields, whether the last field may be split further): ``"${A[@]}"`` gives one field
        per element; other quoted parts join into one field."""
        fields = [""]
        for kind, text in parts:
            if kind in ("lit", "sq"):
                fields[-1] += text
                continue
            v = self.expand_parts(text, quoted)[0] if kind == "dq" else self.part_value(kind, text)
            if isinstance(v, list):
                if not v:
                    continue
                fields[-1] += v[0]
                fields += v[1:]
            else:
                fields[-1] += v
        return fields, False

    def part_value(self, kind: str, text: Any) -> Value:
        if kind == "var":
            v = self.lookup(text)
            return self.absent(text) if v is None else v
        if kind == "param":
            return self.param(text)
        if kind == "arith":
            return self.arith(text)
        if kind == "cmd":
            body, line = text
            return self.unknown(f"$({' '.join(body.split())[:40]}) (a command simpar does not run, {self.at(line)})")
        raise AssertionError(kind)

    def expand(self, word: list[Part]) -> list[str]:
        """A word's fields after expansion and word splitting (no pathname expansion)."""
        fields: list[str] = []
        cur: str | None = None  # the field being built (None: none started)
        for kind, text in word:
            if kind in ("lit", "sq"):
                cur = (cur or "") + text
            elif kind == "dq":
                parts, _ = self.expand_parts(text, quoted=True)
                cur = (cur or "") + parts[0]
                if len(parts) > 1:
                    fields.append(cur)
                    fields += parts[1:-1]
                    cur = parts[-1]
            else:
                v = self.part_value(kind, text)
                pieces: list[str] = []
                for item in v if isinstance(v, list) else [v]:
                    pieces += item.split()
                if not pieces:
                    continue
                lead = bool(isinstance(v, str) and v[:1].isspace())
                if cur is not None and not lead:
                    cur += pieces[0]
                else:
                    if cur is not None:
                        fields.append(cur)
                    cur = pieces[0]
                for p in pieces[1:]:
                    fields.append(cur)
                    cur = p
        if cur is not None:
            fields.append(cur)
        return fields

    # -- running
    def run(self, cmds: list[Any], blocked: str | None = None) -> None:
        """Run ``cmds``; ``blocked`` names the construct they sit in when they are not run (their
        assignments become unknown, a launch among them is refused)."""
        for c in cmds:
            if isinstance(c, Block):
                self.block(c, blocked)
            else:
                self.simple(c, blocked)

    def block(self, b: Block, blocked: str | None) -> None:
        if b.kind == "if" and blocked is None:
            for cond, join, body in zip(b.conds, b.joins, b.body):
                truth = self.condition(cond, join)
                if truth is True:
                    self.run(body)
                    return
                if truth is None:  # not decidable: no branch runs, what they set is unknown
                    rest = b.body[b.body.index(body) :] + ([b.orelse] if b.orelse else [])
                    for r in rest:
                        self.run(r, f"if ({self.at(b.line)}) whose condition simpar cannot decide")
                    return
            if b.orelse:
                self.run(b.orelse)
            return
        if b.kind in ("while", "until") and blocked is None:
            truth = self.condition(b.conds[0], b.joins[0])
            if truth is (b.kind == "until"):  # the body never runs
                return
        name = {"for": "for loop", "while": "while loop", "until": "until loop", "select": "select loop"}
        name |= {"group": "{ } group", "subshell": "( ) subshell"}
        inner = blocked or f"{name.get(b.kind, b.kind)} ({self.at(b.line)})"
        for body in [*b.body, b.orelse or []] if b.kind == "if" else [b.body]:
            self.run(body, inner)

    def condition(self, cmds: list[Simple], joins: list[str]) -> bool | None:
        """An ``if`` condition: its commands joined by && / || (tests have no side effects)."""
        value = self.test(cmds[0])
        for join, c in zip(joins, cmds[1:]):
            value = _three(value, self.test(c), join)
        return value

    def test(self, c: Simple) -> bool | None:
        self.line = c.line
        words = [f for w in c.words for f in self.expand_test_word(w)]
        if not words:
            return None
        neg = False
        while words and words[0] == "!":
            neg, words = not neg, words[1:]
        if not words:
            return None
        head = words[0]
        if head in ("true", ":"):
            r: bool | None = True
        elif head == "false":
            r = False
        elif head in ("[", "[[", "test"):
            body = words[1:-1] if head != "test" else words[1:]
            r = _test_expr(body, head == "[[")
        else:
            r = None  # a command's exit status: not run
        return None if r is None else r != neg

    def expand_test_word(self, w: list[Part]) -> list[str]:
        """A test's word: a variable the script does not set (or a positional parameter) is empty, as
        in a clean environment run without arguments (said in the notes)."""

        def unset(m: re.Match[str]) -> str:
            what = self.unknowns[int(m.group(1))]
            if "(not set in the script" not in what and "(a positional parameter" not in what:
                return m.group(0)
            self.notes.append(f"{what.split(' (')[0]} read as unset in the test at {self.at()}")
            return ""

        fields = [UNKNOWN.sub(unset, f) for f in self.expand(w)]
        if not fields:  # an unquoted empty expansion in a test: bash drops it
            return [] if any(k not in ("dq", "sq") for k, _ in w) else [""]
        return fields

    def simple(self, c: Simple, blocked: str | None) -> None:
        self.line = c.line
        words = [(w, _plain(w)) for w in c.words]
        lead_assign = []
        while words and words[0][0] and words[0][0][0][0] == "lit" and _ASSIGN.match(words[0][0][0][1]):
            lead_assign.append(words.pop(0)[0])
        head = words[0][1] if words else None
        if head in ("export", "declare", "typeset", "local", "readonly"):
            lead_assign += [w for w, _ in words[1:] if w and w[0][0] == "lit" and _ASSIGN.match(w[0][1])]
            if blocked is None:
                exported(head, [w[0][1] for w, _ in words[1:] if w and w[0][0] == "lit"], self.exported)
            words = []
        for name, items in c.arrays:
            self.assign_array(name, items, blocked)
        if not words:
            for w in lead_assign:
                self.assign(w, blocked)
            return
        if head in ("source", "."):
            self.source([w for w, _ in words[1:]], head, c.line, blocked)
            return
        if head == "eval":
            text = " ".join(f for w, _ in words[1:] for f in self.expand(w))
            self._eval(text, c.line, blocked)
            return
        fields = [f for w, _ in words for f in self.expand(w)]
        if not fields:
            return
        if fields[0] == "set" and blocked is None:
            self.allexport = allexport(fields[1:], self.allexport)
            return
        if fields[0].rsplit("/", 1)[-1] == "sbatch":
            self.sbatch(fields, c.line, blocked)
            return
        shell = [
            i for i, f in enumerate(fields[:-1]) if f.rsplit("/", 1)[-1] in ("sh", "bash") and fields[i + 1] == "-c"
        ]
        if shell and shell[0] + 2 < len(fields):  # sh -c "COMMAND": the command is read as eval reads it
            text = fields[shell[0] + 2]
            self._eval(text, c.line, blocked)
            return
        if self._is_launch(fields):
            if blocked is not None:
                raise self.fail(
                    c.line,
                    blocked.split(" (")[0],
                    f"holds the launch (the {blocked} is not run by simpar).",
                    "write the launch at the top level of the script.",
                )
            self.launches.append(_Found(fields, c.line, self.file))

    def source(self, words: list[list[Part]], head: str, line: int, blocked: str | None) -> None:
        """``source FILE`` / ``. FILE``: FILE's commands, run here in the script's variables."""
        at = self.at(line)
        first = [self.files.folder_word(words[0], at, head)] if words else []
        name = self.files.name([f for w in first + words[1:] for f in self.expand(w)], at, head)
        with self.files.reading(name, at, head) as (label, text):
            self.run_file(label, text, blocked)

    def sbatch(self, fields: list[str], line: int, blocked: str | None) -> None:
        """``sbatch [options] JOB.sh``: the job script, run as a new shell in the variables sbatch gives
        it (`shell_source.Files.job_env`); nothing it sets comes back."""
        at = self.at(line)
        job, export = self.files.sbatch(fields, at)
        with self.files.reading(self.files.name([job], at, "sbatch"), at, "sbatch") as (label, text):
            env = self.files.job_env(export, text, label, self.vars, self.exported, at)
            saved = self.vars, self.exported, self.allexport
            self.vars, self.exported, self.allexport = dict(env), set(env), False
            self.run_file(label, text, blocked)
            self.vars, self.exported, self.allexport = saved

    def run_file(self, label: str, text: str, blocked: str | None) -> None:
        """Run the commands of a file the script reads (``label``: its name in messages)."""
        where = f"{self.where} {label}"
        cmds = _Parser(_Lexer(text, where).tokens(), where).parse()
        saved, self.file = self.file, label
        self.run(cmds, blocked)
        self.file = saved

    def _eval(self, text: str, line: int, blocked: str | None) -> None:
        toks = _Lexer(text, self.label).tokens()
        for t in toks:
            t.line = line
        self.run(_Parser(toks, self.label).parse(), blocked)

    def _is_launch(self, fields: list[str]) -> bool:
        if not any(f.endswith(".py") for f in fields):
            return False
        first = fields[0].rsplit("/", 1)[-1]
        if first in _SKIPPED:
            return False
        return (
            first in LAUNCHERS
            or first.startswith("python")
            or UNKNOWN.fullmatch(fields[0]) is not None
            or first.endswith(".py")
        )

    def assign(self, w: list[Part], blocked: str | None) -> None:
        head = w[0][1]
        m = _ASSIGN.match(head)
        assert m is not None
        name, index, append = m.groups()
        rest = [("lit", head[m.end() :]), *w[1:]] if head[m.end() :] else w[1:]
        if blocked is not None:
            self.vars[name] = self.unknown(f"${name} (set inside a {blocked})")
            return
        if self.allexport:
            self.exported.add(name)
        value = "".join(self.expand_parts(rest, quoted=True)[0]) if rest else ""
        if index is not None:
            self.vars[name] = self.unknown(f"${name} (an array element assignment, {self.at()})")
            return
        old = self.vars.get(name)
        if append and isinstance(old, list):
            self.vars[name] = [*old, value]
        else:
            self.vars[name] = (self.scalar(old) if append and old is not None else "") + value

    def assign_array(self, head: str, items: list[list[Part]], blocked: str | None) -> None:
        m = _ASSIGN.match(head)
        assert m is not None
        name, _, append = m.groups()
        if blocked is not None:
            self.vars[name] = self.unknown(f"${name} (set inside a {blocked})")
            return
        values = [f for it in items for f in self.expand(it)]
        old = self.vars.get(name)
        if append and old is not None:
            self.vars[name] = [*(old if isinstance(old, list) else [old]), *values]
        else:
            self.vars[name] = values


def _three(a: bool | None, b: bool | None, join: str) -> bool | None:
    """``a && b`` / ``a || b`` over true, false and unknown (None)."""
    if join == "&&":
        if a is False or b is False:
            return False
        return None if a is None or b is None else True
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


_INT_OPS: dict[str, Callable[[int, int], bool]] = {
    "-eq": operator.eq,
    "-ne": operator.ne,
    "-gt": operator.gt,
    "-lt": operator.lt,
    "-ge": operator.ge,
    "-le": operator.le,
}


def _test_expr(w: list[str], double: bool) -> bool | None:
    """``[ ... ]`` / ``[[ ... ]]`` over known strings (None: not decidable here)."""
    for op in ("||", "-o", "&&", "-a"):
        if op in w and (double or op.startswith("-")):
            i = w.index(op)
            return _three(
                _test_expr(w[:i], double), _test_expr(w[i + 1 :], double), "&&" if "a" in op or op == "&&" else "||"
            )
    if w and w[0] == "!":
        r = _test_expr(w[1:], double)
        return None if r is None else not r
    if w and w[0] == "(" and w[-1] == ")":
        return _test_expr(w[1:-1], double)
    if any(UNKNOWN.search(x) for x in w):
        return None
    if len(w) == 1:
        return w[0] != ""
    if len(w) == 2:
        op, x = w
        if op == "-z":
            return x == ""
        if op == "-n":
            return x != ""
        return None  # file tests and the like
    if len(w) == 3:
        a, op, b = w
        if op in ("=", "=="):
            return fnmatch.fnmatchcase(a, b) if double else a == b
        if op == "!=":
            return not fnmatch.fnmatchcase(a, b) if double else a != b
        if op in _INT_OPS and re.fullmatch(r"-?[0-9]{1,18}", a) and re.fullmatch(r"-?[0-9]{1,18}", b):
            return _INT_OPS[op](int(a), int(b))
    return None


_BIN: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,
    ast.Mod: operator.mod,
}


def _arith(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        if abs(node.value) > 10**18:
            raise ValueError("too large")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        return _BIN[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exp = _arith(node.left), _arith(node.right)
        if not 0 <= exp <= 64 or abs(base) > 10**6:
            raise ValueError("too large")
        return int(base**exp)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _arith(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    raise ValueError("not integer arithmetic")


def read_script(text: str, where: str, path: Path | None = None) -> Script:
    """The launch a script comes to (see the module's docstring); a bare argument list (words that
    start with ``--``, no command) is its own launch. ``path``: the script's file, beside which the
    files it sources are looked for (None: a launch given as text)."""
    toks = _Lexer(text, where).tokens()
    cmds = _Parser(toks, where).parse()
    interp = _Interp(where, path)
    bare = _bare(cmds)
    if bare is not None:
        fields = [f for w in bare.words for f in interp.expand(w)]
        return Script([], None, fields, None, interp.notes, interp.unknowns)
    interp.run(cmds)
    if not interp.launches:
        raise SpecError(
            where,
            "has no launch: no torchrun / python line runs a training script (*.py).",
            "give the script that launches pretrain_gpt.py, or its arguments.",
        )
    if len(interp.launches) > 1:
        a, b = interp.launches[0], interp.launches[1]
        raise SpecError(
            f"{where} {_place(b.file, b.line)}",
            f"is a second launch (the first is at {_place(a.file, a.line)}).",
            "keep one launch in the script.",
        )
    found = interp.launches[0]
    i = next(i for i, f in enumerate(found.words) if f.endswith(".py"))
    launcher, script, args = found.words[:i], found.words[i], found.words[i + 1 :]
    return Script(launcher, script, args, found.line, interp.notes, interp.unknowns, found.file)


def _bare(cmds: list[Any]) -> Simple | None:
    """The one command of a bare argument list (its first word starts with ``-``), else None."""
    if len(cmds) != 1 or not isinstance(cmds[0], Simple) or not cmds[0].words:
        return None
    first = _plain(cmds[0].words[0])
    return cmds[0] if first is not None and first.startswith("-") else None
