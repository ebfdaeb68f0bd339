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
from typing import Any, Mapping, TextIO

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
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)  # NO_COLOR is read from it
    force_terminal: bool | None = None  # style as on a terminal even when the streams are not one (tests)
    quiet: bool = False  # -q: only the result line(s) and errors

    def __post_init__(self) -> None:
        # NO_COLOR (no-color.org): any non-empty value turns colour off; here every style, since
        # bold and dim are ANSI escapes too
        self.color = not self.environ.get("NO_COLOR")
        self.events: "EventStream | None" = None
        self._consoles(human=self.stdout)

    def _consoles(self, human: TextIO) -> None:
        kw: dict[str, Any] = {"width": self.width, "force_terminal": self.force_terminal}
        if not self.color:
            kw["color_system"] = None
        self.out = SafeConsole(self, file=human, **kw)
        self.err = SafeConsole(self, file=self.stderr, **kw)

    def set_color(self, on: bool) -> None:
        """--no-color (after the consoles exist: they are made again without styles)."""
        self.color = on
        self._consoles(human=self.out.file)

    def open_events(self, where: str) -> None:
        """--events FILE|-: a JSON-lines stream of what happens. With -, it owns stdout, and what
        people read moves to stderr, so the stream stays one JSON object a line."""
        if where == "-":
            self.events = EventStream(self.stdout, self)
            self._consoles(human=self.stderr)
        else:
            import errno

            try:  # private (it names hosts, paths and reasons), and never through a symlink
                fd = os.open(where, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                f = os.fdopen(fd, "a", encoding="utf-8")  # noqa: SIM115 - closed by close_events()
            except OSError as e:
                from envbisect.errors import UsageError

                if e.errno == errno.ELOOP:
                    raise UsageError(f"--events {printable(where, keep_newlines=False)}: is a symlink; give the "
                                     "file itself") from None
                raise UsageError(f"--events {printable(where, keep_newlines=False)}: {e.strerror}") from None
            self.events = EventStream(f, self, owned=True)

    def event(self, kind: str, data: Mapping[str, Any] | None = None) -> None:
        if self.events is not None:
            self.events.write(kind, data or {})

    def listener(self, progress: Any) -> Any:
        """An `on_event` callback for the library: the human progress lines, and the event stream."""
        def on_event(kind: str, data: dict) -> None:
            if progress is not None:
                progress(kind, data)
            self.event(kind, data)
        return on_event

    def close_events(self) -> None:
        if self.events is not None:
            self.events.close()
            self.events = None

    @property
    def events_on_stdout(self) -> bool:
        return self.events is not None and self.events.stream is self.stdout

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
        if self.events_on_stdout:
            from envbisect.errors import UsageError

            raise UsageError("--events - and --json both write to stdout: give --events FILE")
        plain = json.loads(json.dumps(doc, default=str))  # dataclasses, paths, ... as the strings they print as
        self.stdout.write(json.dumps(self.masker.redact_obj(plain), indent=2, sort_keys=False) + "\n")

    def write_raw(self, text: str) -> None:
        """Text that is the output itself (a playbook draft for `--out -`, `envbisect log`), already
        redacted; control characters and escape sequences made visible as everywhere else."""
        (self.stderr if self.events_on_stdout else self.stdout).write(printable(text))

    def configure_logging(self, verbose: int) -> None:
        handler = logging.StreamHandler(self.stderr)
        handler.setFormatter(RedactingFormatter(self, "%(levelname)s %(name)s: %(message)s"))
        level = logging.ERROR if self.quiet and not verbose else logging.WARNING - 10 * min(verbose, 2)
        logging.basicConfig(level=level, handlers=[handler], force=True)
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


class EventStream:
    """`--events`: one JSON object a line, each with `event` (the library's event kind: trial-start,
    trial-end, step, warning, verdict, ...) and `time` (UTC, ISO 8601), then the event's data (a
    Trial as its record). Through the same masker as every other output; flushed per line, so a
    reader sees each event as it happens."""

    def __init__(self, stream: TextIO, env: Environment, owned: bool = False):
        self.stream, self.env, self.owned = stream, env, owned

    def write(self, kind: str, data: Mapping[str, Any]) -> None:
        from datetime import datetime, timezone

        rec: dict[str, Any] = {"event": kind, "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds")}
        for k, v in data.items():
            rec[k] = v.to_json() if hasattr(v, "to_json") else v
        plain = json.loads(json.dumps(rec, default=str))
        self.stream.write(json.dumps(self.env.masker.redact_obj(plain), separators=(",", ":")) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.owned:
            self.stream.close()
