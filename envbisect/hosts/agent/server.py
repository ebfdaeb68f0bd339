"""The persistent agent: one Python process per host and connection that runs the other agent
scripts (collect.py, hostops.py, discover.py) on request, so a host operation costs one message
on an open SSH channel instead of a new channel, a login shell and a Python start-up each.

Protocol, both ways a header (one JSON object on one line) and then the bytes it announces, raw:
  request   {"id": N, "name": "hostops.py", "sha": "...", "source": "..." (only when asked for),
             "stdin": LEN, "argv": [...]}                             then LEN bytes of stdin
  answer    {"id": N, "rc": 0, "stdout": LEN1, "stderr": LEN2}       then LEN1 + LEN2 bytes
            {"id": N, "need_source": true}    (the controller then sends the same request with source)
A script's stdin and stdout (a snapshot: every file, base64, in JSON) go as they are, never quoted
into another JSON document: neither side escapes or parses them twice.

Each script runs as if started with `python3 -c SCRIPT ARGV...`: a fresh module namespace, its
own stdin/stdout/argv, SystemExit taken as its exit status, and the working directory and
environment put back afterwards, so no request sees what an earlier one left. The protocol
keeps file descriptors 0 and 1 for itself: a subprocess a script starts without redirecting its
output cannot write into the protocol stream. End of input (the controller went away, or closed
the channel) ends the process. Stdlib only; never imported by the controller.
"""
import io
import json
import os
import sys
import traceback

MAX_HEADER = 1 << 20  # a request's header line (the controller's: a script's source at most)
MAX_STDIN = 128 << 20  # a request's stdin; a longer one is refused (and skipped, unread into memory)


def main():
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # a stray write of a child process goes to the channel's stderr, never the protocol
    os.close(devnull)
    code_cache = {}
    reader = io.BufferedReader(proto_in, 1 << 16)
    while True:
        req = read_request(reader, proto_out)
        if req is None:
            return
        if not req:
            continue
        rid, sha = req.get("id"), req.get("sha")
        code = code_cache.get(sha)
        if code is None:
            if req.get("source") is None:
                send(proto_out, {"id": rid, "need_source": True})
                continue
            try:
                code = compile(req["source"], "<envbisect %s>" % req.get("name", "agent"), "exec")
            except SyntaxError:
                answer(proto_out, rid, 1, "", traceback.format_exc())
                continue
            code_cache[sha] = code
        rc, out, err = run(code, req["stdin_text"], req.get("argv") or [])
        answer(proto_out, rid, rc, out, err)


def read_request(reader, proto_out):
    """The next request, its stdin read and decoded into "stdin_text"; {} for one refused (and
    answered); None at end of input."""
    line = reader.readline(MAX_HEADER + 1)
    if not line:
        return None
    if len(line) > MAX_HEADER:
        while line and not line.endswith(b"\n"):  # skip the rest of it, unread into memory
            line = reader.readline(1 << 20)
        return refuse(proto_out, None, "a request header over %d MiB" % (MAX_HEADER >> 20))
    try:
        req = json.loads(line.decode("utf-8"))
        size = int(req.get("stdin") or 0)
    except (ValueError, TypeError, AttributeError):
        return refuse(proto_out, None, "a request that is not JSON")
    if size < 0 or size > MAX_STDIN:
        while size > 0:  # skipped, unread into memory
            chunk = reader.read(min(size, 1 << 20))
            if not chunk:
                return None
            size -= len(chunk)
        return refuse(proto_out, req.get("id"), "a request's stdin over %d MiB" % (MAX_STDIN >> 20))
    data = reader.read(size) if size else b""
    if len(data) < size:
        return None
    req["stdin_text"] = data.decode("utf-8", "surrogateescape")
    return req


def refuse(proto_out, rid, what):
    answer(proto_out, rid, 2, "", "envbisect agent: %s: refused" % what)
    return {}


def run(code, stdin, argv):
    out, err = io.StringIO(), io.StringIO()
    saved = (sys.stdin, sys.stdout, sys.stderr, sys.argv)
    cwd, env = os.getcwd(), dict(os.environ)
    sys.stdin, sys.stdout, sys.stderr, sys.argv = io.StringIO(stdin), out, err, ["-c"] + list(argv)
    rc = 0
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if e.code is None:
            rc = 0
        elif isinstance(e.code, int):
            rc = e.code
        else:
            err.write("%s\n" % (e.code,))
            rc = 1
    except BaseException:  # what `python3 -c` would print and exit 1 with
        err.write(traceback.format_exc())
        rc = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr, sys.argv = saved
        try:
            os.chdir(cwd)
        except OSError:
            pass
        if dict(os.environ) != env:
            os.environ.clear()
            os.environ.update(env)
    return rc, out.getvalue(), err.getvalue()


def encoded(text):
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no byte stands for
        return text.encode("utf-8", "backslashreplace")


def answer(proto_out, rid, rc, out, err):
    out, err = encoded(out), encoded(err)
    head = {"id": rid, "rc": rc, "stdout": len(out), "stderr": len(err)}
    send(proto_out, head, out + err)


def send(stream, head, payload=b""):
    data = memoryview((json.dumps(head, separators=(",", ":")) + "\n").encode("utf-8") + payload)
    try:
        while data:
            data = data[stream.write(data):]
    except (BrokenPipeError, OSError):
        sys.exit(0)  # the controller is gone: nothing to answer to


main()
