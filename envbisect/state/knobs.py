"""What the deployed engine says about its knobs: its env-var registry and server flags, read from the
installed package's source text with `ast` (never imported), as a small `KnobRegistry`.

SGLang first (`parse_sglang`): ``sglang/srt/environ.py`` declares each variable as a class attribute
of ``Envs`` (``SGLANG_X = EnvInt(4)``: name, type, default), renames old names in
``_convert_SGL_to_SGLANG`` (``_print_deprecated_env(...)`` pairs, whose argument order differs
between versions and is read from the function's own parameter names, and the blanket
``SGL_`` -> ``SGLANG_`` rewrite), and warns with ``_warn_deprecated_env_to_cli_flag(ENV, "use
'--flag'")`` where a variable gave way to a flag. ``sglang/srt/server_args.py`` declares the
``ServerArgs`` dataclass (field defaults) and ``parser.add_argument("--k", "--alias", default=
ServerArgs.k)`` calls. vLLM's ``vllm/envs.py`` (a dict of lambdas) would be another parser returning
the same interface.

A knob has one canonical name: the env var's current name, or ``flag:FIELD`` for a server flag and
for a variable that gave way to one. Deltas of the same knob are linked by `state.deltas.same_change`
whatever their spelling. Pure: text in, registry out.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Mapping, Protocol


class UnknownLayout(ValueError):
    """The package's files do not have the shape this parser knows."""


@dataclass(frozen=True)
class Knob:
    name: str  # canonical: "SGLANG_X" or "flag:page_size"
    default: str | None  # the documented default as text (None: no default, or not a literal)


class KnobRegistry(Protocol):
    engine: str
    version: str

    def knob(self, name: str) -> Knob | None:
        """The knob an environment variable (any alias) sets; None: the engine does not read it."""

    def flag(self, name: str) -> Knob | None:
        """The knob a server flag (``--tp`` or ``--tp-size``) sets; None: not a flag of this version."""

    def default(self, knob: Knob) -> str | None:
        """The knob's documented default as text."""

    def aliases(self, knob: Knob) -> tuple[str, ...]:
        """Every env-var and flag spelling of the knob."""

    def owns(self, name: str) -> bool:
        """Is `name` in this engine's namespace (so that not reading it means typo or stale)?"""


@dataclass(frozen=True)
class SglangRegistry:
    version: str
    envs: Mapping[str, str | None]  # current env var name -> default text
    renamed: Mapping[str, str]  # old env var name -> new name
    env_to_flag: Mapping[str, str]  # env var -> the flag that replaces it ("--x")
    flags: Mapping[str, str]  # "--k" (and its aliases) -> ServerArgs field
    fields: Mapping[str, str | None]  # ServerArgs field -> default text
    sgl_prefix: bool = True  # SGL_X is read as SGLANG_X
    engine: str = field(default="sglang")

    def _env_name(self, name: str) -> str:
        seen = set()
        while name in self.renamed and name not in seen:
            seen.add(name)
            name = self.renamed[name]
        if self.sgl_prefix and name.startswith("SGL_") and name not in self.envs:
            name = "SGLANG_" + name[4:]
        return self.renamed.get(name, name)

    def knob(self, name: str) -> Knob | None:
        env = self._env_name(name)
        for n in (name, env):
            f = self.flags.get(self.env_to_flag.get(n, ""))
            if f is not None:
                return Knob(f"flag:{f}", self.fields.get(f))
        if env in self.envs:
            return Knob(env, self.envs[env])
        return None

    def flag(self, name: str) -> Knob | None:
        f = self.flags.get(name.split("=", 1)[0])
        return Knob(f"flag:{f}", self.fields.get(f)) if f is not None else None

    def default(self, knob: Knob) -> str | None:
        return knob.default

    def aliases(self, knob: Knob) -> tuple[str, ...]:
        if knob.name.startswith("flag:"):
            f = knob.name[5:]
            names = [k for k, v in self.flags.items() if v == f]
            names += [e for e, fl in self.env_to_flag.items() if self.flags.get(fl) == f]
        else:
            names = [knob.name] + [o for o in self.renamed if self._env_name(o) == knob.name]
            if self.sgl_prefix and knob.name.startswith("SGLANG_"):
                names.append("SGL_" + knob.name[7:])
        return tuple(dict.fromkeys(names))

    def owns(self, name: str) -> bool:
        return name.startswith(("SGLANG_", "SGL_")) or name.startswith("--")


_ENV_TYPES = re.compile(r"^Env[A-Z]\w*$")
_FLAG_IN_TEXT = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")


def _literal(node: ast.AST) -> str | None:
    """A default as text: a literal's value (True -> "true", None -> None), else None."""
    try:
        v = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _strings(call: ast.Call) -> list[str | None]:
    return [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None for a in call.args]


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return None


def parse_environ(text: str) -> tuple[dict[str, str | None], dict[str, str], dict[str, str], bool]:
    """environ.py -> (variables and defaults, old name -> new, variable -> replacing flag, SGL_ rewrite?)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise UnknownLayout(f"environ.py does not parse: {e.msg} (line {e.lineno})") from None
    envs: dict[str, str | None] = {}
    renamed: dict[str, str] = {}
    to_flag: dict[str, str] = {}
    order = ("old", "new")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Envs":
            for st in node.body:
                if (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                        and isinstance(st.value, ast.Call) and _ENV_TYPES.match(_called(st.value) or "")):
                    envs[st.targets[0].id] = _literal(st.value.args[0]) if st.value.args else None
        if isinstance(node, ast.FunctionDef) and node.name == "_print_deprecated_env":
            names = [a.arg for a in node.args.args[:2]]
            if names == ["new_name", "old_name"]:
                order = ("new", "old")
    if not envs:
        raise UnknownLayout("environ.py has no Envs class with EnvBool/EnvInt/... fields")
    sgl_prefix = False
    for node in ast.walk(tree):
        name = _called(node)
        if not isinstance(node, ast.Call):
            continue
        args = _strings(node)
        if name == "_print_deprecated_env" and len(args) == 2 and None not in args:
            pair = dict(zip(order, args))
            renamed[pair["old"]] = pair["new"]  # type: ignore[index]
        elif name == "_warn_deprecated_env_to_cli_flag" and len(args) == 2 and args[0]:
            m = _FLAG_IN_TEXT.search(args[1] or "")
            if m:
                to_flag[args[0]] = m.group(1)
        elif name == "replace" and args[:2] == ["SGL_", "SGLANG_"]:
            sgl_prefix = True
    return envs, renamed, to_flag, sgl_prefix


def parse_server_args(text: str) -> tuple[dict[str, str], dict[str, str | None]]:
    """server_args.py -> (flag spelling -> ServerArgs field, field -> default text)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise UnknownLayout(f"server_args.py does not parse: {e.msg} (line {e.lineno})") from None
    fields: dict[str, str | None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    fields[st.target.id] = _literal(st.value) if st.value is not None else None
    if not fields:
        raise UnknownLayout("server_args.py has no ServerArgs dataclass")
    flags: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _called(node) == "add_argument"):
            continue
        spellings = [s for s in _strings(node) if s and s.startswith("--")]
        if not spellings:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        dest = kw.get("dest")
        target = dest.value if isinstance(dest, ast.Constant) and isinstance(dest.value, str) else None
        default = kw.get("default")
        if target is None and isinstance(default, ast.Attribute) and isinstance(default.value, ast.Name) \
                and default.value.id == "ServerArgs":
            target = default.attr
        if target is None:
            target = spellings[0][2:].replace("-", "_")
        if target not in fields and default is not None:
            fields[target] = _literal(default)
        fields.setdefault(target, None)
        for s in spellings:
            flags[s] = target
    return flags, fields


def parse_sglang(version: str, environ_text: str, server_args_text: str) -> SglangRegistry:
    """The registry of an installed SGLang, from its two files' text; UnknownLayout when they are not
    shaped as this parser expects."""
    envs, renamed, to_flag, sgl = parse_environ(environ_text)
    flags, fields = parse_server_args(server_args_text)
    return SglangRegistry(version=version, envs=envs, renamed=renamed, env_to_flag=to_flag, flags=flags,
                          fields=fields, sgl_prefix=sgl)


def parse_version(init_text: str, version_text: str = "") -> str | None:
    """``__version__ = "0.5.3"`` from sglang/__init__.py or sglang/version.py."""
    for text in (init_text, version_text):
        try:
            tree = ast.parse(text or "")
        except SyntaxError:
            continue
        for node in tree.body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__"
                                                     for t in node.targets)
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                return node.value.value
    return None
