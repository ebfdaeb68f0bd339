"""The persistent agent: one Python process per host and connection that runs the other agent
scripts (collect.py, hostops.py, discover.py) on request, so a host operation costs one message
on an open SSH channel instead of a new channel, a login shell and a Python start-up each.

Protocol (one JSON object per line, both ways):
  request   {"id": N, "name": "hostops.py", "sha": "...", "source": "..." (only when asked for),
             "stdin": "...", "argv": [...]}
  answer    {"id": N, "rc": 0, "stdout": "...", "stderr": "..."}
            {"id": N, "need_source": true}    (the controller then sends the same request with source)

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

MAX_LINE = 128 << 20  # a request line (the controller's: its scripts and stdin); longer ones are refused


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
        line = reader.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE:
            while line and not line.endswith(b"\n"):  # skip the rest of it, unread into memory
                line = reader.readline(1 << 20)
            send(proto_out, {"id": None, "rc": 2, "stdout": "",
                             "stderr": "envbisect agent: a request line over %d MiB: refused" % (MAX_LINE >> 20)})
            continue
        try:
            req = json.loads(line.decode("utf-8"))
        except ValueError:
            send(proto_out, {"id": None, "rc": 2, "stdout": "", "stderr": "envbisect agent: a request that is not JSON"})
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
                send(proto_out, {"id": rid, "rc": 1, "stdout": "", "stderr": traceback.format_exc()})
                continue
            code_cache[sha] = code
        send(proto_out, dict(run(code, req.get("name", "agent"), req.get("stdin") or "", req.get("argv") or []), id=rid))


def run(code, name, stdin, argv):
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
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def send(stream, doc):
    data = (json.dumps(doc) + "\n").encode("utf-8")
    try:
        stream.write(data)
    except (BrokenPipeError, OSError):
        sys.exit(0)  # the controller is gone: nothing to answer to


main()
