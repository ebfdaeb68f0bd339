"""What the deployed engine says about its knobs: its env-var registry and server flags, read from the
installed package's source text with `ast` (never imported), as a small `KnobRegistry`.

SGLang first (`parse_sglang_files`), every layout it has shipped:

- the version: ``sglang/_version.py`` (written by the build's VCS versioning, 0.5.8 on), else
  ``sglang/version.py`` or ``sglang/__init__.py`` (``__version__ = "0.4.10"``).
- env vars: ``sglang/srt/environ.py`` (0.5.x) declares each variable as a class attribute of ``Envs``
  (``SGLANG_X = EnvInt(4)``: name, type, default; ``EnvBoolWithAlias(True, deprecated_name="OLD")``
  and its ``EnvInt``/``EnvStr`` siblings: a renamed variable whose old name is still read). Renames
  and variables that gave way to a flag are declared by calls (``_print_deprecated_env(...)`` pairs,
  whose argument order differs between versions and is read from the function's own parameter
  names; ``_warn_deprecated_env_to_cli_flag(ENV, "use '--flag'")``) up to 0.5.13, and by the
  ``_DEPRECATED_ENVS`` table (``"OLD": _DeprecatedEnv(replacement="NEW")``, or a ``note`` naming the
  flag) from 0.5.18; the blanket ``SGL_`` -> ``SGLANG_`` rewrite throughout. 0.4.x has no environ.py:
  its variables are read ad hoc across the package, so no registry of them exists to read.
- flags: the ``ServerArgs`` fields (a dataclass in ``sglang/srt/server_args.py``; from 0.5.23
  ``msgspec.Struct`` namespaces in ``sglang/srt/arg_groups/fields/*.py``, listed in
  ``_INPUT_NAMESPACES``) with their defaults; a field annotated ``A[T, "help"]`` or
  ``A[T, Arg(aliases=[...], cli_name=..., no_cli=...)]`` is a flag ``--field-name`` (0.5.18 on), and
  the hand-written ``parser.add_argument("--k", "--alias", default=ServerArgs.k)`` calls the rest.

A layout none of these describe raises `UnknownLayout`: a registry read wrong would mark live knobs
as typos. A knob has one canonical name: the env var's current name, or ``flag:FIELD`` for a server
flag and for a variable that gave way to one. Deltas of the same knob are linked by
`state.deltas.same_change` whatever their spelling. Pure: text in, registry out.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Protocol

# The package files the reader needs, relative to the ``sglang`` package directory (the host reads these,
# the compatibility test's cache keeps only these).
SGLANG_FILES = ("__init__.py", "version.py", "_version.py", "srt/environ.py", "srt/server_args.py")
SGLANG_FIELD_DIR = "srt/arg_groups/fields"  # every *.py in it


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
    env_registry: bool = True  # False: no srt/environ.py (0.4.x), env vars are read ad hoc
    retired_envs: tuple[str, ...] = ()  # deprecated without a replacement: warned about, not read
    retired_flags: tuple[str, ...] = ()  # refused with an error ("no longer supported")

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
        if name.startswith("--"):
            return True
        # without an env registry nobody can say that a variable is not read
        return self.env_registry and name.startswith(("SGLANG_", "SGL_"))


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


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _strings(call: ast.Call) -> list[str | None]:
    return [_str(a) for a in call.args]


def _kw(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _name(node: ast.AST | None) -> str | None:
    """``X`` of a name ``X`` or an attribute ``a.X``."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _called(node: ast.AST) -> str | None:
    return _name(node.func) if isinstance(node, ast.Call) else None


def _parse(text: str, what: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as e:
        raise UnknownLayout(f"{what} does not parse: {e.msg} (line {e.lineno})") from None


class EnvironTable(NamedTuple):
    envs: dict[str, str | None]  # variable -> default text
    renamed: dict[str, str]  # old name -> new name
    env_to_flag: dict[str, str]  # variable -> the flag that replaces it
    sgl_prefix: bool  # the SGL_ -> SGLANG_ rewrite
    retired: tuple[str, ...]  # deprecated without a replacement


def _env_fields(cls: ast.ClassDef, envs: dict[str, str | None], renamed: dict[str, str]) -> None:
    for st in cls.body:
        target = st.targets[0] if isinstance(st, ast.Assign) and len(st.targets) == 1 else \
            st.target if isinstance(st, ast.AnnAssign) else None
        call = st.value if isinstance(st, (ast.Assign, ast.AnnAssign)) else None
        if not (isinstance(target, ast.Name) and isinstance(call, ast.Call) and _ENV_TYPES.match(_called(call) or "")):
            continue
        kw = _kw(call)
        default = call.args[0] if call.args else kw.get("default")
        envs[target.id] = _literal(default) if default is not None else None
        old = _str(kw.get("deprecated_name"))
        if old:  # EnvBoolWithAlias(default, deprecated_name="OLD"): the old name is still read
            renamed[old] = target.id


def _deprecation_table(node: ast.AST, table: EnvironTable, retired: list[str]) -> None:
    """``_DEPRECATED_ENVS = {"OLD": _DeprecatedEnv(replacement="NEW" | note="use '--flag'")}``."""
    value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
        else []
    if not (isinstance(value, ast.Dict) and any(isinstance(t, ast.Name) and t.id == "_DEPRECATED_ENVS"
                                                for t in targets)):
        return
    for k, v in zip(value.keys, value.values):
        old = _str(k)
        if old is None or not isinstance(v, ast.Call):
            continue
        kw = _kw(v)
        new = _str(kw.get("replacement")) or (_str(v.args[0]) if v.args else None)
        m = _FLAG_IN_TEXT.search(_str(kw.get("note")) or "")
        if new:
            table.renamed[old] = new
        elif m:
            table.env_to_flag[old] = m.group(1)
        else:
            retired.append(old)


def parse_environ(text: str) -> EnvironTable:
    """environ.py -> its variables and defaults, renames, variables replaced by a flag, SGL_ rewrite."""
    tree = _parse(text, "environ.py")
    table = EnvironTable({}, {}, {}, False, ())
    retired: list[str] = []
    order = ("old", "new")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Envs":
            _env_fields(node, table.envs, table.renamed)
        if isinstance(node, ast.FunctionDef) and node.name == "_print_deprecated_env":
            if [a.arg for a in node.args.args[:2]] == ["new_name", "old_name"]:
                order = ("new", "old")
        _deprecation_table(node, table, retired)
    if not table.envs:
        raise UnknownLayout("environ.py has no Envs class with EnvBool/EnvInt/... fields")
    sgl_prefix = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name, args = _called(node), _strings(node)
        if name == "_print_deprecated_env" and len(args) == 2 and None not in args:
            pair = dict(zip(order, args))
            table.renamed[pair["old"]] = pair["new"]  # type: ignore[index]
        elif name == "_print_deprecated_env" and len(args) == 1 and args[0] and order[0] == "old":
            retired.append(args[0])  # _print_deprecated_env(old_name, new_name=None): no replacement
        elif name == "_warn_deprecated_env_to_cli_flag" and len(args) == 2 and args[0]:
            m = _FLAG_IN_TEXT.search(args[1] or "")
            if m:
                table.env_to_flag[args[0]] = m.group(1)
        elif name == "replace" and args[:2] == ["SGL_", "SGLANG_"]:
            sgl_prefix = True
    return table._replace(sgl_prefix=sgl_prefix, retired=tuple(dict.fromkeys(retired)))


class ServerArgsTable(NamedTuple):
    flags: dict[str, str]  # flag spelling -> ServerArgs field
    fields: dict[str, str | None]  # field -> default text
    retired: tuple[str, ...]  # flags refused with an error


def _annotated_flags(name: str, ann: ast.expr) -> tuple[list[str] | None, ast.expr | None]:
    """The spellings of a field annotated ``A[T, "help"]`` / ``A[T, Arg(...)]`` (``[]``: ``no_cli``;
    None: no CLI metadata, a plain field registered by hand if at all), and its ``Arg(fallback=...)``
    (the value an unset field answers with, 0.5.23 on)."""
    if not (isinstance(ann, ast.Subscript) and _name(ann.value) in ("A", "Annotated")):
        return None, None
    meta = ann.slice.elts[1:] if isinstance(ann.slice, ast.Tuple) else []
    for m in meta:  # the first help string or Arg(...) is the CLI metadata, as arg_utils reads it
        if _str(m) is not None:
            return ["--" + name.replace("_", "-")], None
        if isinstance(m, ast.Call) and _called(m) == "Arg":
            kw = _kw(m)
            if "no_cli" in kw and _literal(kw["no_cli"]) == "true":
                return [], kw.get("fallback")
            aliases = kw.get("aliases")
            extra = [s for s in map(_str, aliases.elts) if s] if isinstance(aliases, (ast.List, ast.Tuple)) else []
            return [_str(kw.get("cli_name")) or "--" + name.replace("_", "-")] + extra, kw.get("fallback")
    return None, None


def _class_fields(cls: ast.ClassDef, table: ServerArgsTable) -> None:
    for st in cls.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and not st.target.id.startswith("_"):
            name = st.target.id
            spellings, fallback = _annotated_flags(name, st.annotation)
            default = _literal(st.value) if st.value is not None else None
            table.fields[name] = _literal(fallback) if default is None and fallback is not None else default
            for s in spellings or ():
                table.flags[s] = name


def _namespace_classes(namespaces: Mapping[str, str]) -> dict[str, ast.ClassDef]:
    """The ``msgspec.Struct`` classes with a ``_NS_PATH`` in arg_groups/fields/*.py, by class name."""
    out: dict[str, ast.ClassDef] = {}
    for fname, text in sorted(namespaces.items()):
        for node in _parse(text, f"arg_groups/fields/{fname}").body:
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(st, ast.Assign) and any(getattr(t, "id", "") == "_NS_PATH" for t in st.targets)
                    for st in node.body):
                out[node.name] = node
    return out


def _input_namespaces(tree: ast.Module) -> list[str] | None:
    """The class names of ``_INPUT_NAMESPACES = [Model, ...]`` in server_args.py, or None."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(_name(t) == "_INPUT_NAMESPACES" for t in node.targets):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                return [getattr(e, "id", "?") for e in node.value.elts]
    return None


def _manual_flags(tree: ast.Module, table: ServerArgsTable, retired: list[str]) -> None:
    """``parser.add_argument("--k", "--alias", dest=..., default=ServerArgs.k)`` calls."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _called(node) == "add_argument"):
            continue
        spellings = [s for s in _strings(node) if s and s.startswith("--")]
        if not spellings:
            continue
        kw = _kw(node)
        target, default = _str(kw.get("dest")), kw.get("default")
        if target is None and _name(kw.get("action")) == "DeprecatedAction":
            retired.extend(spellings)  # raises "no longer supported": not a knob any more
            continue
        if target is None and isinstance(default, ast.Attribute) and getattr(default.value, "id", "") == "ServerArgs":
            target = default.attr
        if target is None:
            target = spellings[0][2:].replace("-", "_")
        if target not in table.fields and default is not None:
            table.fields[target] = _literal(default)
        table.fields.setdefault(target, None)
        for s in spellings:
            table.flags[s] = target


def parse_server_args(text: str, namespaces: Mapping[str, str] | None = None) -> ServerArgsTable:
    """server_args.py (and the arg_groups/fields/*.py texts by file name) -> flag spelling -> field,
    field -> default text, and the flags that are refused."""
    tree = _parse(text, "server_args.py")
    table = ServerArgsTable({}, {}, ())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            _class_fields(node, table)
    listed = _input_namespaces(tree)
    if listed is not None:
        found = _namespace_classes(namespaces or {})
        missing = [n for n in listed if n not in found]
        if missing:
            raise UnknownLayout(f"ServerArgs is assembled from namespaces not found in {SGLANG_FIELD_DIR}/: "
                                + ", ".join(missing))
        for n in listed:
            _class_fields(found[n], table)
    if not table.fields:
        raise UnknownLayout("server_args.py has no ServerArgs dataclass (nor namespaces it is assembled from)")
    if "add_cli_args_from_dataclass" in text and not table.flags:
        raise UnknownLayout("ServerArgs flags come from annotated fields, and none is annotated as this parser "
                            "knows (A[T, \"help\"] / A[T, Arg(...)])")
    retired: list[str] = []
    _manual_flags(tree, table, retired)
    return table._replace(retired=tuple(dict.fromkeys(retired)))


def parse_sglang(version: str, environ_text: str | None, server_args_text: str,
                 namespaces: Mapping[str, str] | None = None) -> SglangRegistry:
    """The registry of an installed SGLang, from its files' text (`environ_text` None: a release without
    srt/environ.py; `namespaces`: the texts of srt/arg_groups/fields/*.py by file name); UnknownLayout
    when they are not shaped as this parser expects."""
    env = parse_environ(environ_text) if environ_text is not None else EnvironTable({}, {}, {}, False, ())
    sa: ServerArgsTable = parse_server_args(server_args_text, namespaces or {})
    return SglangRegistry(version=version, envs=env.envs, renamed=env.renamed, env_to_flag=env.env_to_flag,
                          flags=sa.flags, fields=sa.fields, sgl_prefix=env.sgl_prefix,
                          env_registry=environ_text is not None, retired_envs=env.retired,
                          retired_flags=sa.retired)


def parse_sglang_files(files: Mapping[str, str]) -> SglangRegistry:
    """The registry from the package's files by path relative to the ``sglang`` directory (those of
    `SGLANG_FILES` and `SGLANG_FIELD_DIR` that exist)."""
    if "srt/server_args.py" not in files:
        raise UnknownLayout("no srt/server_args.py")
    version = parse_version(files.get("_version.py", ""), files.get("version.py", ""), files.get("__init__.py", ""))
    prefix = SGLANG_FIELD_DIR + "/"
    namespaces = {p[len(prefix):]: t for p, t in files.items() if p.startswith(prefix) and p.endswith(".py")}
    return parse_sglang(version or "unknown", files.get("srt/environ.py"), files["srt/server_args.py"], namespaces)


def no_env_registry_note(reg: SglangRegistry) -> str | None:
    """What a registry without env vars means for the diff, or None."""
    if reg.env_registry:
        return None
    return (f"sglang {reg.version} has no srt/environ.py: it reads its SGLANG_*/SGL_* variables ad hoc, so "
            "they are linked by their names only, without defaults; its flags are read")


def parse_version(*texts: str) -> str | None:
    """``__version__ = "0.5.3"`` (or ``__version__ = version = '0.5.23'``) from the first of `texts`
    (sglang/_version.py, sglang/version.py, sglang/__init__.py) that assigns it a literal."""
    for text in texts:
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
