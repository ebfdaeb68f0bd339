"""Structured watched files (YAML, JSON, TOML) compared per key, and written back per key.

Pure: bytes in, bytes out. `key_changes` diffs the two sides of a file by key path (deepdiff on the
parsed data) and returns one `KeyChange` per key added, removed or changed, or an `Unfaithful` note
when the file must stay one whole-file delta. `render` writes the baseline file with exactly the
chosen key changes made and every other byte as it was: YAML through ruamel.yaml's round-trip mode
and TOML through tomlkit (both keep comments, order and quoting), JSON by re-dumping in the file's
own layout (found by trying, and only when it reproduces both sides' bytes).

A file is compared per key only when that is proven faithful on its own bytes: rendering no change
gives the baseline's bytes exactly, rendering every change gives the current bytes exactly, and each
change alone and each change left out parse back to exactly the data they are meant to be. Anything
else (a parse error on either side, several YAML documents, duplicate keys, anchors or aliases that
differ, a top level that is not a mapping, a change of comments, order or formatting only) leaves
the file one whole-file delta, with the reason as a note. The journal and `restore` never use this:
they write the bytes they recorded.

A key path is a tuple of mapping keys (str) and list indexes (int), shown ``a.b[2]``; a key that is
not a plain word is quoted (``a."x.y"``). A list whose length changed is one change (its whole
value): indexes of a list edited in several places do not compose.
"""
from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:  # ruamel.yaml is imported where YAML is read or written: most runs never do
    from ruamel.yaml import YAML

FORMATS = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".toml": "toml"}
MAX_CHANGES = 64  # beyond this a file is one delta: 2n+2 renders are checked at diff time

Path = tuple[Any, ...]  # str keys and int indexes


@dataclass(frozen=True)
class KeyChange:
    path: Path
    change: str  # added | removed | changed
    old: str | None  # the value as compact JSON text; None when absent
    new: str | None

    @property
    def key(self) -> str:
        return format_path(self.path)


@dataclass(frozen=True)
class Unfaithful:
    """Why a structured file stays one whole-file delta."""

    reason: str


def format_of(path: str) -> str | None:
    """The structured format of a watched file, by its extension; None: compared as a whole file."""
    m = re.search(r"\.[A-Za-z]+$", path)
    return FORMATS.get(m.group(0).lower()) if m else None


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*\Z")


def format_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if _WORD.match(part) else json.dumps(part)
            out += ("." if out else "") + text
    return out


def key_name(text: str) -> str:
    """The last mapping key of a key path text (what a secret masker judges the value by)."""
    try:
        names = [p for p in parse_path(text) if isinstance(p, str)]
    except ValueError:
        return text
    return names[-1] if names else text


def key_secrets(deltas: Iterable[Any]) -> list[tuple[str, str]]:
    """(the last key name, each string value as written in the file) of `key` deltas: what a secret
    masker learns, so a secret in a structured file is masked wherever it turns up again."""
    out = []
    for d in deltas:
        if getattr(d, "kind", None) != "key" or not d.key:
            continue
        for v in (d.old, d.new):
            try:
                value = json.loads(v) if v is not None else None
            except ValueError:
                continue
            if isinstance(value, str):
                out.append((key_name(d.key), value))
    return out


def file_pairs(path: str, data: bytes | None) -> list[tuple[str, str]]:
    """(the key, the string value) of every string leaf of a structured file (YAML, JSON, TOML by
    its extension): what a secret masker learns from a watched file, so a secret under a secret key
    (`db.password`) is masked wherever it turns up, changed or not. [] when it does not parse."""
    fmt = format_of(path)
    if fmt is None or not data:
        return []
    try:
        doc = plain(_load(fmt, data))
    except (_Bad, RecursionError):
        return []
    out: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        key, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((str(k), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((key, x) for x in v)
        elif isinstance(v, str):  # a block scalar's value ends in a line break that a print drops
            out.extend((key, x) for x in {v, v.strip()} if x)
    return out


def value_at(fmt: str, data: bytes | None, text: str) -> tuple[bool, str | None]:
    """(parsed, the value at key path `text` as compact JSON text, None when absent) of a file's
    bytes; (False, None) when the file does not parse (or is absent)."""
    if data is None:
        return False, None
    try:
        doc = plain(_load(fmt, data))
    except _Bad:
        return False, None
    v = _get(doc, parse_path(text))
    return True, None if v is _MISSING else _text(v)


_TOKEN = re.compile(r'\[(\d+)\]|"((?:[^"\\]|\\.)*)"|([A-Za-z_][A-Za-z0-9_\-]*)')


def parse_path(text: str) -> Path:
    """The inverse of `format_path`."""
    out: list[Any] = []
    pos = 0
    while pos < len(text):
        if out and text[pos] == ".":
            pos += 1
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"not a key path: {text!r}")
        if m.group(1) is not None:
            out.append(int(m.group(1)))
        elif m.group(2) is not None:
            out.append(json.loads(f'"{m.group(2)}"'))
        else:
            out.append(m.group(3))
        pos = m.end()
    return tuple(out)


# --- parsing ------------------------------------------------------------------------------------

class _Bad(Exception):
    pass


_YAML_INDENTS = ((2, 2, 0), (2, 4, 2), (4, 4, 0), (4, 6, 4), (4, 4, 2), (2, 3, 1), (3, 3, 0), (4, 5, 3))


def _yaml(indent: tuple[int, int, int] = (2, 2, 0), explicit_start: bool = False) -> YAML:
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.indent(mapping=indent[0], sequence=indent[1], offset=indent[2])
    y.explicit_start = explicit_start
    y.preserve_quotes = True
    y.allow_duplicate_keys = False
    y.width = 4096  # never re-wrap a long line
    return y


def _yaml_load(data: bytes) -> Any:
    from ruamel.yaml.error import YAMLError

    text = data.decode("utf-8")
    y = _yaml()
    try:
        docs = list(y.load_all(text))
    except YAMLError as e:
        raise _Bad(f"does not parse as YAML ({str(e).splitlines()[0]})") from None
    if len(docs) != 1:
        raise _Bad(f"holds {len(docs)} YAML documents")
    return docs[0]


def _yaml_anchors(data: bytes) -> tuple:
    """The anchor and alias events of a YAML text, in order."""
    from ruamel.yaml import YAML
    from ruamel.yaml.events import AliasEvent

    out = []
    for ev in YAML(typ="rt").parse(data.decode("utf-8")):
        if isinstance(ev, AliasEvent):
            out.append(("*", ev.anchor))
        elif getattr(ev, "anchor", None):
            out.append(("&", ev.anchor))
    return tuple(out)


def _json_load(data: bytes) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict:
        keys = [k for k, _ in items]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        if dup is not None:
            raise _Bad(f"has the key {dup!r} twice in one object")
        return dict(items)

    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=pairs)
    except ValueError as e:
        raise _Bad(f"does not parse as JSON ({e})") from None


def _toml_load(data: bytes) -> Any:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        return tomlkit.parse(data.decode("utf-8"))
    except TOMLKitError as e:
        raise _Bad(f"does not parse as TOML ({e})") from None


def _load(fmt: str, data: bytes) -> Any:
    try:
        return {"yaml": _yaml_load, "json": _json_load, "toml": _toml_load}[fmt](data)
    except UnicodeDecodeError:
        raise _Bad("is not UTF-8 text") from None


def plain(doc: Any) -> Any:
    """A parsed document as plain Python data (dict, list, str, int, float, bool, None, ...)."""
    if hasattr(doc, "unwrap"):  # tomlkit
        return doc.unwrap()
    if isinstance(doc, dict):
        return {plain(k): plain(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [plain(v) for v in doc]
    if isinstance(doc, bool) or doc is None:
        return doc
    for t in (int, float, str):
        if isinstance(doc, t):
            return t(doc)
    return doc


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=False, default=str, ensure_ascii=False)


# --- the diff -----------------------------------------------------------------------------------

_MISSING = object()


def _get(data: Any, path: Path) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return data


def _changed_paths(old: Any, new: Any) -> list[Path]:
    """The key paths where two plain documents differ (deepdiff), a list whose length changed as
    one path, each path once, in document order."""
    from deepdiff import DeepDiff

    tree = DeepDiff(old, new, view="tree", ignore_order=False, verbose_level=2)
    paths: set[Path] = set()
    for report, levels in tree.items():
        for level in levels:
            p = tuple(level.path(output_format="list"))
            if report.startswith("iterable_item_"):
                p = p[:-1]  # the list as a whole: its indexes shifted
            paths.add(p)
    # a path inside another reported path is covered by it
    kept = [p for p in paths if not any(q != p and p[:len(q)] == q for q in paths)]
    order = {p: i for i, p in enumerate(_walk_order(new, ()))}
    order_old = {p: i for i, p in enumerate(_walk_order(old, ()))}
    return sorted(kept, key=lambda p: (order.get(p, order_old.get(p, 1 << 30)), format_path(p)))


def _walk_order(data: Any, prefix: Path) -> Iterable[Path]:
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _walk_order(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _walk_order(v, (*prefix, i))


def key_changes(fmt: str, old: bytes, new: bytes) -> tuple[KeyChange, ...] | Unfaithful:
    """The per-key changes from `old` to `new` (both bytes of a `fmt` file), or why the file cannot
    be compared per key faithfully."""
    try:
        old_doc, new_doc = _load(fmt, old), _load(fmt, new)
    except _Bad as e:
        return Unfaithful(f"one side {e}")
    for doc in (old_doc, new_doc):
        if not isinstance(doc, dict):
            return Unfaithful(f"its top level is a {type(plain(doc)).__name__}, not a mapping")
    if fmt == "yaml" and _yaml_anchors(old) != _yaml_anchors(new):
        return Unfaithful("its YAML anchors or aliases changed")
    old_p, new_p = plain(old_doc), plain(new_doc)
    paths = _changed_paths(old_p, new_p)
    if not paths:
        return Unfaithful("no key's value changed (comments, order, quoting or layout only)")
    if len(paths) > MAX_CHANGES:
        return Unfaithful(f"{len(paths)} keys changed (more than {MAX_CHANGES})")
    if any(p == () for p in paths):
        return Unfaithful("its top level changed type")
    changes = []
    for p in paths:
        o, n = _get(old_p, p), _get(new_p, p)
        change = "added" if o is _MISSING else "removed" if n is _MISSING else "changed"
        changes.append(KeyChange(p, change, None if o is _MISSING else _text(o), None if n is _MISSING else _text(n)))
    out = tuple(changes)
    why = _unfaithful_renders(fmt, old, new, out)
    return Unfaithful(why) if why else out


def _unfaithful_renders(fmt: str, old: bytes, new: bytes, changes: Sequence[KeyChange]) -> str | None:
    """Why rendering these changes is not faithful, or None: no change gives `old` byte for byte,
    every change gives `new`, and each change alone and each change left out parse back to exactly
    the data intended."""
    everything = [c.key for c in changes]
    try:
        if render(fmt, old, new, changes, []) != old:
            return "re-writing it with no change does not give its bytes back"
        if render(fmt, old, new, changes, everything) != new:
            return "more than key values changed (comments, order, quoting or layout) or a change cannot be made alone"
        if len(changes) > 1:
            for c in changes:
                render(fmt, old, new, changes, [c.key])
                render(fmt, old, new, changes, [k for k in everything if k != c.key])
    except RenderError as e:
        return str(e)
    return None


# --- writing ------------------------------------------------------------------------------------

class RenderError(Exception):
    """A target file that does not parse back to the data intended."""


def intended(old_p: Any, new_p: Any, changes: Sequence[KeyChange], applied: Iterable[str]) -> Any:
    """The plain data of the baseline with the `applied` changes (by key path text) made."""
    import copy

    data = copy.deepcopy(old_p)
    applied = set(applied)
    for c in changes:
        if c.key in applied:
            _set(data, new_p, c.path)
    return data


def _set(target: Any, source: Any, path: Path, copy_comment: bool = False) -> None:
    """Make `path` in `target` what it is in `source` (absent there: deleted), in place. A key
    added to a mapping is put where the source has it, after the same preceding key."""
    parent = target
    src_parent = source
    for part in path[:-1]:
        parent, src_parent = parent[part], src_parent[part]
    last = path[-1]
    present = (last in src_parent) if isinstance(src_parent, dict) else last < len(src_parent)
    if not present:
        if copy_comment and isinstance(parent, dict) and last in parent:
            keys = list(parent)
            if keys.index(last):  # what trailed the removed key (a blank line, a comment) trails the one before
                _copy_key_comment(parent, src_parent, keys[keys.index(last) - 1])
        del parent[last]
        return
    value = src_parent[last]
    if isinstance(parent, dict) and last not in parent:
        keys = list(src_parent)
        before = [k for k in keys[:keys.index(last)] if k in parent]
        pos = list(parent).index(before[-1]) + 1 if before else 0
        if hasattr(parent, "insert") and pos < len(parent):
            parent.insert(pos, last, value)
        else:
            parent[last] = value
        if copy_comment and before:  # what trailed the key before it now trails the added one
            _copy_key_comment(parent, src_parent, before[-1])
    else:
        parent[last] = value
    if copy_comment:
        ca_src = getattr(src_parent, "ca", None)
        ca_dst = getattr(parent, "ca", None)
        if ca_src is not None and ca_dst is not None:
            if last in ca_src.items:
                ca_dst.items[last] = ca_src.items[last]
            else:
                ca_dst.items.pop(last, None)


def _copy_key_comment(target: Any, source: Any, key: Any) -> None:
    """The comment that follows `key` in `source` (ruamel.yaml keeps a blank line or comment after a
    key as that key's), onto `key` in `target`; none there: none here."""
    ca_src, ca_dst = getattr(source, "ca", None), getattr(target, "ca", None)
    if ca_src is None or ca_dst is None or key not in source:
        return
    if key in ca_src.items:
        ca_dst.items[key] = ca_src.items[key]
    else:
        ca_dst.items.pop(key, None)


def render(fmt: str, old: bytes, new: bytes, changes: Sequence[KeyChange], applied: Iterable[str]) -> bytes:
    """The baseline file (`old`) with exactly the `applied` changes (by key path text) made, each
    value taken as the current file (`new`) writes it. Raises `RenderError` when the result does not
    parse back to exactly the data intended."""
    applied = set(applied)
    chosen = [c for c in changes if c.key in applied]
    out = _build(fmt, old, new, chosen)  # from the baseline's document always: the check at both ends means it
    want = intended(plain(_load_ok(fmt, old)), plain(_load_ok(fmt, new)), changes, applied)
    try:
        got = plain(_load(fmt, out))
    except _Bad as e:
        raise RenderError(f"the file written with {', '.join(sorted(applied)) or 'no change'} {e}") from None
    if got != want:
        raise RenderError(f"the file written with {', '.join(sorted(applied)) or 'no change'} does not parse back "
                          "to the data intended")
    return out


def _load_ok(fmt: str, data: bytes) -> Any:
    try:
        return _load(fmt, data)
    except _Bad as e:
        raise RenderError(f"a side {e}") from None


def _build(fmt: str, old: bytes, new: bytes, chosen: Sequence[KeyChange]) -> bytes:
    doc, src = _load_ok(fmt, old), _load_ok(fmt, new)
    if fmt == "json":
        doc, src = plain(doc), plain(src)
    for c in chosen:
        try:
            _set(doc, src, c.path, copy_comment=fmt == "yaml")
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise RenderError(f"{c.key}: cannot be made alone ({e})") from None
    return _dump(fmt, doc, old)


def _dump(fmt: str, doc: Any, like: bytes) -> bytes:
    """`doc` written out; JSON in the layout of `like` (its indentation, separators, escaping and
    final newline), when one of the usual layouts reproduces it."""
    if fmt == "yaml":
        # the indentation of `like`'s block sequences and mappings: the first that writes it back
        # (and its `---` document start, when it has one)
        like_doc = _load_ok(fmt, like)
        start = like.lstrip().startswith(b"---")
        first = _YAML_INDENTS[0]
        for indent in _YAML_INDENTS:
            buf = io.StringIO()
            _yaml(indent, start).dump(like_doc, buf)
            if buf.getvalue().encode("utf-8") == like:
                first = indent
                break
        buf = io.StringIO()
        _yaml(first, start).dump(doc, buf)
        return buf.getvalue().encode("utf-8")
    if fmt == "toml":
        import tomlkit

        return tomlkit.dumps(doc).encode("utf-8")
    style = _json_style(like)
    if style is None:
        raise RenderError("its JSON layout is not one envbisect can write back byte for byte")
    indent, ascii_only, end = style
    return (json.dumps(doc, indent=indent, ensure_ascii=ascii_only) + end).encode("utf-8")


def _json_style(data: bytes) -> tuple[Any, bool, str] | None:
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    for indent in (2, 4, None, "\t", 1, 3, 8):
        for ascii_only in (False, True):
            for end in ("\n", ""):
                if (json.dumps(doc, indent=indent, ensure_ascii=ascii_only) + end).encode("utf-8") == data:
                    return indent, ascii_only, end
    return None
