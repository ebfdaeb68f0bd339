"""Where the command line's output goes, and through what: an injectable `Environment` (httpie's
model), so a command runs in-process against any streams, and a test reads what a user would see.

Every byte written to the terminal (stdout, stderr, logs) goes through `Environment.shown()` -- the
masker, then `masking.printable` -- and every `--json` document through the same masker
(`Environment.emit_json`). The masker starts with the built-in rules and becomes the deployment's
once a playbook is loaded (it learns the raw secret values the deployment knows). See docs/safety.md.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from envbisect.inputs.masking import SecretMasker, printable


class SafeConsole(Console):
    """A console that cannot be injected into or leak: markup and emoji codes are off (a value such
    as ``[/x]`` or ``:x:`` is text, never style, and cannot crash the renderer), and every string and
    `Text` it renders -- messages, table cells, progress lines -- goes through `env.shown()`."""

    def __init__(self, env: "Environment", **kw: Any):
        self._env = env
        super().__init__(markup=False, emoji=False, highlight=False, soft_wrap=True, **kw)

    def render_str(self, text: str, **kw: Any) -> Text:  # every str: print() arguments, table cells
        return super().render_str(self._env.shown(text), **kw)

    def render(self, renderable: Any, options: Any = None) -> Any:  # every Text, however nested
        if isinstance(renderable, Text):
            renderable = self._env.shown_text(renderable)
        return super().render(renderable, options)


class RedactingFormatter(logging.Formatter):
    """Log records (every verbosity, paramiko's too, tracebacks included) through `shown()`."""

    def __init__(self, env: "Environment", fmt: str):
        super().__init__(fmt)
        self._env = env

    def format(self, record: logging.LogRecord) -> str:
        return self._env.shown(super().format(record))


@dataclass
class Environment:
    """The streams a command writes to and reads from, and the masker between them and the data."""

    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    stdin: TextIO = field(default_factory=lambda: sys.stdin)
    masker: SecretMasker = field(default_factory=SecretMasker)
    store: Path | None = None  # where the crash log goes
    traceback: bool = False  # --traceback
    width: int | None = None  # the consoles' width (None: the terminal's); tests pin it

    def __post_init__(self) -> None:
        self.out = SafeConsole(self, file=self.stdout, width=self.width)
        self.err = SafeConsole(self, file=self.stderr, width=self.width)

    @property
    def stdin_isatty(self) -> bool:
        try:
            return self.stdin.isatty()
        except (AttributeError, ValueError):
            return False

    # --- what passes between data and a terminal ---------------------------------------------
    def shown(self, text: Any, *, one_line: bool = False) -> str:
        """Secrets masked, escape sequences and control characters made visible. ``one_line``:
        newlines too, for a value shown inside a line (a value must not be able to fake the next line)."""
        return printable(self.masker.redact_text("" if text is None else str(text)), keep_newlines=not one_line)

    def shown_text(self, t: Text) -> Text:
        """A rich `Text` through `shown()`, keeping its styles where the redaction allows."""
        plain = t.plain
        want = self.shown(plain)
        if want == plain:
            return t
        cuts = sorted({sp.start for sp in t.spans} | {sp.end for sp in t.spans})
        new = t.blank_copy()
        for part in t.divide(cuts):
            start = len(new)
            new.append(self.shown(part.plain))
            for sp in part.spans:
                new.stylize(sp.style, start, len(new))
        if new.plain != want:  # a secret across two styles: correctness over colour
            new = t.blank_copy(want)
        return new

    def emit_json(self, doc: Any) -> None:
        """`--json` output: the document through the same masker as everything else (ASCII JSON, so
        no control character reaches the terminal raw)."""
        plain = json.loads(json.dumps(doc, default=str))  # dataclasses, paths, ... as the strings they print as
        self.stdout.write(json.dumps(self.masker.redact_obj(plain), indent=2, sort_keys=False) + "\n")

    def write_raw(self, text: str) -> None:
        """Text that is the output itself (a playbook draft for `--out -`), already redacted."""
        self.stdout.write(text)

    def configure_logging(self, verbose: int) -> None:
        handler = logging.StreamHandler(self.stderr)
        handler.setFormatter(RedactingFormatter(self, "%(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2), handlers=[handler], force=True)
        if verbose < 2:
            logging.getLogger("paramiko").setLevel(logging.WARNING)

    # --- the last resort ---------------------------------------------------------------------
    def crash_log(self, text: str) -> Path | None:
        """Write a traceback (already masked) to a private file: STORE/crash/ (0700), else a 0700
        folder in the temp dir. None when neither can be written."""
        import tempfile
        import time

        from envbisect.state.store import write_private

        name = f"crash-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        dirs = [Path(self.store) / "crash"] if self.store else []
        dirs.append(Path(tempfile.gettempdir()) / f"envbisect-crash-{os.getuid()}")
        for d in dirs:
            try:
                write_private(d / name, text.encode("utf-8", "backslashreplace"))
                return d / name
            except OSError:
                continue
        return None

    def masked_traceback(self, exc: BaseException) -> str:
        import traceback

        return self.masker.redact_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
