# Sent WITH the agent scripts that evaluate an env file in bash (collect.py, hostops.py; stdlib only):
# each imports from it in one line, which agent_source (hosts/session.py) replaces with this file's
# text, so the snapshot and the post-write check scrub with the one definition.
#
# The start environment is the service user's to choose. What would run code in bash or in a program it
# starts is kept out of bash's environment (sudo's env_reset list, glibc's loader and tunables, the
# interpreters' start-up hooks): bash gets it back as plain, unexported shell variables before it sources
# the file, so the file reads the same values, and the dump counts them as exported, as `env` would have.
# SHELLOPTS and BASHOPTS switch on bash options at start-up (xtrace runs PS4) and IFS is ignored by bash:
# those three are dropped. The dump uses builtins only: no `env` looked up on the service's PATH.
EVAL_DONE = b"\0ENVBISECT_EVAL_DONE=1\0"
EVAL_UNREADABLE = b"\0ENVBISECT_EVAL_UNREADABLE\0"
EVAL_UNREACHABLE = b"\0ENVBISECT_EVAL_UNREACHABLE\0"  # a folder on the way keeps the user out
BASH = "/bin/bash"
HELD_ENV = frozenset((
    "BASH_ENV", "ENV", "PS4", "GLOBIGNORE", "CDPATH", "FPATH", "NULLCMD", "READNULLCMD", "ZDOTDIR", "TMPPREFIX",
    "LOCALDOMAIN", "RES_OPTIONS", "HOSTALIASES", "NLSPATH", "PATH_LOCALE", "LOCPATH", "GCONV_PATH",
    "GLIBC_TUNABLES", "MALLOC_TRACE", "TERMINFO", "TERMINFO_DIRS", "TERMPATH", "TERMCAP", "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS", "PERLIO_DEBUG", "PERLLIB", "PERL5LIB", "PERL5OPT", "PERL5DB", "PYTHONHOME", "PYTHONPATH",
    "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONBREAKPOINT", "RUBYLIB", "RUBYOPT", "NODE_OPTIONS",
    "GIT_EXEC_PATH", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_CONFIG_GLOBAL", "PROMPT_COMMAND"))
DROPPED_ENV = frozenset(("SHELLOPTS", "BASHOPTS", "IFS"))
EVAL_SCRIPT = r"""__envbisect_f=$1; shift; __envbisect_held=()
while [ "$#" -gt 0 ]; do builtin printf -v "$1" %s "$2"; __envbisect_held+=("$1"); shift 2; done
set -- "$__envbisect_f"; unset __envbisect_f
[ -r "$1" ] || { [ -x "${1%/*}/" ] && builtin printf '\0ENVBISECT_EVAL_UNREADABLE\0' ||
  builtin printf '\0ENVBISECT_EVAL_UNREACHABLE\0'; exit 0; }
set -a; . "$1" >&2 </dev/null
IFS=$' \t\n'
for __envbisect_k in $(builtin compgen -e) "${__envbisect_held[@]}"; do
  [[ -n ${!__envbisect_k+x} ]] && builtin printf '%s=%s\0' "$__envbisect_k" "${!__envbisect_k}"
done
builtin printf '\0ENVBISECT_EVAL_DONE=1\0'"""


def held(key):
    return key in HELD_ENV or key.startswith(("LD_", "_RLD", "DYLD_"))


def scrub(env):
    """(bash's environment, [name, value, ...] given back to it as plain shell variables)."""
    import re  # here: hostops.py imports re only for the ops that need it
    keep, back = {}, []
    for k, v in sorted(env.items()):
        if k in DROPPED_ENV or not re.match(r"[A-Za-z_][A-Za-z0-9_]*\Z", k):
            continue
        if held(k):
            back += [k, v]
        else:
            keep[k] = v
    return keep, back
