"""The bash scripts the ssh backend runs on the remote host, and what they print.

Each sandbox is a folder `<root>/sbx-<hex>` on the remote host:

- `lease.json`: the marker (labels: owner host:pid and its start time, lease expiry, run,
  task, isolation), written before anything runs, so `clotho sandbox gc` finds what a dead
  owner left;
- `leader`: pid and start time of the process the SSH session runs (its session leader);
- `ids`: with bubblewrap, the sandbox's pid namespace (its init's pid and start time, and
  the namespace's inode), written once the shell answered;
- `app/` the workspace, `xfer/` the transfer folder (seen at `/.clotho` under bubblewrap),
  `priv/` where the host takes a transfer file out of the sandbox's reach, `home/`.

Processes are ended by what the agent cannot leave: with bubblewrap, its pid namespace (the
namespace's init is killed, and the kernel kills everything in it; `--die-with-parent` does
the same when the SSH connection drops). Without bubblewrap there is nothing of the kind to
stand on: the SSH session (sid) and the process tree under it are killed, and a process that
called `setsid` and was reparented escapes that; the sandbox's facts say so.

Everything runs as `bash --noprofile --norc`, whatever the remote user's login shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

XFER_MOUNT = "/.clotho"
CMD_MARK = ".c"  # in xfer/: the pid-namespace's last pid when the running command began
SANDBOX_NAME = re.compile(r"^sbx-[0-9a-f]{16}$")

# /proc/*/stat as "pid ppid sid starttime" lines of live processes (zombies left out: a kill
# cannot end them); the command name may hold anything, so the fields are taken after its
# last ')'; `cat` goes on past processes that vanish meanwhile.
_PROC_TABLE = (
    "cat /proc/[0-9]*/stat 2>/dev/null | awk '{s=$0; i=length(s); "
    'while (i>0 && substr(s,i,1)!=")") i--; n=split(substr(s,i+2),f," "); '
    'if (n>=20 && $1 ~ /^[0-9]+$/ && f[1] != "Z" && f[1] != "X") '
    "print $1, f[2], f[4], f[20]}'"
)
# The descendants of pid r in a "pid ppid ..." table, breadth first (r not included).
_DESCENDANTS = (
    'awk -v r="$r" \'{par[$1]=$2} END {n=1; q[1]=r; '
    "for (i=1;i<=n;i++) for (c in par) if (par[c]==q[i]) q[++n]=c; "
    "for (i=2;i<=n;i++) print q[i]}'"
)


def bash(script: str) -> str:
    """The SSH command that runs `script` with bash, whatever the login shell is."""
    return f"exec bash --noprofile --norc -c {shlex.quote(script)}"


def probe_script() -> str:
    """What the host offers: home, uid, and whether bubblewrap works there (it may exist and
    still fail: no unprivileged user namespaces)."""
    return (
        'printf \'home\\t%s\\nuid\\t%s\\n\' "$HOME" "$(id -u)"\n'
        "if ! command -v bwrap >/dev/null 2>&1; then printf 'bwrap\\tmissing\\n'\n"
        "elif out=$(bwrap --unshare-all --unshare-user --uid 0 --gid 0 --die-with-parent "
        "--cap-drop ALL --ro-bind / / true 2>&1); then printf 'bwrap\\tok\\n'\n"
        'else printf \'bwrap\\tbroken: %s\\n\' "$(printf %s "$out" | head -c 300 | tr '
        "'\\n\\t' '  ')\"; fi\n"
        "for t in tar awk timeout head find; do command -v $t >/dev/null 2>&1 || "
        "printf 'lacks\\t%s\\n' $t; done\n"
    )


def parse_fields(text: str) -> dict[str, str]:
    """`key<TAB>value` lines."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        fields.setdefault(key, value)
    return fields


def prepare_script(folder: str, root: str, marker: str) -> str:
    """Make the sandbox's folder, its marker first (gc knows whose any folder is), before
    anything runs in it."""
    d, r = shlex.quote(folder), shlex.quote(root)
    return (
        f"set -e; umask 077; mkdir -p -- {r}; chmod 700 -- {r}; mkdir -- {d}; "
        f"printf '%s\\n' {shlex.quote(marker)} > {d}/lease.json; "
        f"mkdir -- {d}/app {d}/xfer {d}/priv {d}/home {d}/fs; chmod 755 -- {d}/app {d}/xfer; "
        f"cd -- {d}/fs; mkdir -- {' '.join(KEPT.values())}; chmod 1777 tmp var-tmp"
    )


# Where the sandbox keeps what it writes outside its workspace: folders of its own on the
# remote host (`fs/<name>`), bound in the agent's bubblewrap and in every fresh one, so
# verification sees what the agent left there. /usr and the rest are the host's, read-only.
KEPT = {"/tmp": "tmp", "/root": "root", "/home": "home", "/opt": "opt", "/var/tmp": "var-tmp",
        "/tests": "tests", "/logs": "logs", "/solution": "solution"}  # fmt: skip


def _bwrap_args(workdir: str, network: bool) -> list[str]:
    """Bash lines that fill the array `a` with bubblewrap's arguments (`d`: the folder)."""
    kept = " ".join(f'--bind "$d/fs/{name}" {place}' for place, name in KEPT.items())
    return [
        "a=(--unshare-all --unshare-user --uid 0 --gid 0 --die-with-parent --new-session "
        "--cap-drop ALL --hostname clotho)",
        *(["a+=(--share-net)"] if network else []),
        "a+=(--ro-bind /usr /usr)",
        "for x in bin sbin lib lib32 lib64 libx32; do "
        'if [ -L "/$x" ]; then a+=(--symlink "$(readlink "/$x")" "/$x"); '
        'elif [ -d "/$x" ]; then a+=(--ro-bind "/$x" "/$x"); fi; done',
        # The files programs need from /etc, nothing an administrator wrote about the host.
        "a+=(--dir /etc)",
        "for x in passwd group hosts nsswitch.conf resolv.conf host.conf ld.so.cache ld.so.conf "
        "ld.so.conf.d alternatives ssl ca-certificates localtime bash.bashrc inputrc "
        "mime.types protocols services; do "
        '[ -e "/etc/$x" ] && a+=(--ro-bind "/etc/$x" "/etc/$x"); done',
        f"a+=(--dev /dev --proc /proc --tmpfs /run --dir /var {kept})",
        f'a+=(--bind "$d/app" {shlex.quote(workdir)} --bind "$d/xfer" {XFER_MOUNT})',
    ]


def _head(folder: str, limits: Mapping[str, int]) -> list[str]:
    lines = [f"d={shlex.quote(folder)}", 'cd -- "$d" || exit 1']
    ulimit = {"memory_kb": "-v", "processes": "-u", "file_kb": "-f"}
    for key, value in limits.items():  # bash's -f counts 1024-byte blocks
        lines.append(f"ulimit -S -H {ulimit[key]} {int(value)} || exit 1")
    return lines


def launcher(
    folder: str,
    *,
    bwrap: bool,
    workdir: str,
    env: Mapping[str, str],
    network: bool,
    limits: Mapping[str, int],
) -> str:
    """The session's script: note the leader, set the limits, and become the sandbox's shell
    (inside bubblewrap, or plain bash in the sandbox's folder)."""
    lines = [
        *_head(folder, limits),
        "read -ra f < /proc/$$/stat",
        'printf "%s %s\\n" "$$" "${f[21]}" > leader',
    ]
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    if not bwrap:
        lines.append(f'cd -- "$d/app" && exec env -i {assignments} bash --noprofile --norc')
        return "\n".join(lines) + "\n"
    lines += [
        *_bwrap_args(workdir, network),
        f'exec 3>"$d/info"; exec env -i {assignments} bwrap --info-fd 3 "${{a[@]}}" '
        f"--chdir {shlex.quote(workdir)} -- bash --noprofile --norc",
    ]
    return "\n".join(lines) + "\n"


def fresh(
    folder: str,
    cmd: str,
    *,
    bwrap: bool,
    workdir: str,
    cwd: str,
    env: Mapping[str, str],
    network: bool,
    limits: Mapping[str, int],
    timeout: float,
) -> str:
    """A fresh process on the sandbox's files, sharing nothing else with the agent: a new
    bubblewrap (its own pid namespace) over the same folders, or a new bash in the folder;
    killed with everything it started after `timeout` seconds (bubblewrap's namespace dies
    with it)."""
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    script = shlex.quote(f"cd -- {shlex.quote(cwd)} || exit 126\n{cmd}")
    limit = f"timeout -s KILL {max(1, int(timeout + 0.999))}"
    lines = _head(folder, limits)
    if not bwrap:
        lines.append(
            f'cd -- "$d/app" && exec {limit} env -i {assignments} bash --noprofile --norc '
            f"-c {script}"
        )
        return "\n".join(lines) + "\n"
    lines += [
        *_bwrap_args(workdir, network),
        f'exec {limit} env -i {assignments} bwrap "${{a[@]}}" -- '
        f"bash --noprofile --norc -c {script}",
    ]
    return "\n".join(lines) + "\n"


def ids_script(folder: str, *, bwrap: bool) -> str:
    """Once the shell answered: the process everything of the sandbox descends from (`top`:
    bubblewrap's namespace init, from its --info-fd file, else the session's leader) and,
    under bubblewrap, the pid namespace's inode; kept in `ids` for gc."""
    d = shlex.quote(folder)
    head = f'd={d}; read -r lp ls < "$d/leader"\n'
    if not bwrap:
        return head + 'printf "top\\t%s\\n" "$lp"\n'
    return head + (
        'ip=$(tr -d " \\n" < "$d/info" | sed -n \'s/.*"child-pid":\\([0-9]*\\).*/\\1/p\')\n'
        '[ -n "$ip" ] || { echo "bubblewrap said no child pid" >&2; exit 1; }\n'
        'read -ra f < "/proc/$ip/stat"; is=${f[21]}\n'
        'ns=$(readlink "/proc/$ip/ns/pid"); ns=${ns#pid:[}; ns=${ns%]}\n'
        'printf "%s %s %s\\n" "$ip" "$is" "$ns" > "$d/ids"\n'
        'printf "top\\t%s\\nns\\t%s\\n" "$ip" "$ns"\n'
    )


def mark_prefix(xfer: str) -> bytes:
    """Sent before each command (builtins only, no fork): the last pid handed out in the
    sandbox's pid namespace as the command begins, so a timeout kills only what came after.
    `xfer` is the transfer folder as the shell sees it. The agent can rewrite the file; it
    then only spoils its own command's timeout."""
    return (
        "builtin read -r __clotho_p </proc/sys/kernel/ns_last_pid 2>/dev/null; "
        f'builtin printf %s "$__clotho_p" >{shlex.quote(xfer)}/{CMD_MARK} 2>/dev/null\n'
    ).encode()


def _main_shell(ns: str | None) -> str:
    """Shell: `m`, the bash that reads our commands: the namespace init's first child under
    bubblewrap (orphans reparented to the init come later), else the leader itself."""
    if not ns:
        return 'm="$top"'
    return (
        'm=$(printf "%s\\n" "$t" | awk -v p="$top" \'$2==p {print $4, $1}\' | sort -n | '
        "head -1 | cut -d' ' -f2)"
    )


def kill_command_script(folder: str, *, top: int, session: bool, ns: str | None) -> str:
    """Kill the running command's processes: descendants of the session shell (session mode)
    or of the main shell, begun after the command's mark, in the sandbox's namespace."""
    d = shlex.quote(folder)
    pick_root = (
        'r=$(printf "%s\\n" "$t" | awk -v m="$m" \'$2==m {print $1}\' | sort -n | head -1)'
        if session
        else 'r="$m"'
    )
    return (
        f"d={d}; top={int(top)}; ns={shlex.quote(ns or '')}\n"
        f'p=$(timeout 2 head -c 24 -- "$d/xfer/{CMD_MARK}" 2>/dev/null)\n'
        'case "$p" in ""|*[!0-9]*) p=0;; esac\n'
        f"t=$({_PROC_TABLE})\n"
        f"{_main_shell(ns)}\n"
        '[ -n "$m" ] || exit 0\n'
        f"{pick_root}\n"
        '[ -n "$r" ] || exit 0\n'
        f'for c in $(printf "%s\\n" "$t" | {_DESCENDANTS}); do\n'
        '  if [ -n "$ns" ]; then [ "$(readlink "/proc/$c/ns/pid" 2>/dev/null)" = "pid:[$ns]" ] '
        "|| continue; fi\n"
        "  np=$(awk '/^NSpid:/ {print $NF}' \"/proc/$c/status\" 2>/dev/null)\n"
        '  [ -n "$np" ] && [ "$np" -gt "$p" ] && kill -KILL "$c" 2>/dev/null\n'
        "done\nexit 0\n"
    )


def kill_session_shell_script(*, top: int, ns: str | None) -> str:
    """Kill the session shell (a command that is the shell itself: a builtin loop); the
    wrapper loop starts another and says so."""
    return (
        f"top={int(top)}; ns={shlex.quote(ns or '')}; t=$({_PROC_TABLE})\n"
        f"{_main_shell(ns)}\n"
        '[ -n "$m" ] || exit 0\n'
        'r=$(printf "%s\\n" "$t" | awk -v m="$m" \'$2==m {print $1}\' | sort -n | head -1)\n'
        '[ -n "$r" ] || exit 0\n'
        'if [ -n "$ns" ]; then [ "$(readlink "/proc/$r/ns/pid")" = "pid:[$ns]" ] || exit 0; fi\n'
        'kill -KILL "$r" 2>/dev/null; exit 0\n'
    )


def end_script(folder: str, *, remove: bool) -> str:
    """Kill every process of the sandbox and (with `remove`) delete its folder. Quiet when
    they are already gone; the leader and init are killed only if their start time still
    matches (a pid the kernel gave to someone else is left alone)."""
    d = shlex.quote(folder)
    script = (
        f"d={d}\n"
        'start() { local f; read -ra f < "/proc/$1/stat" 2>/dev/null && echo "${f[21]}"; }\n'
        'lp=; ls=; [ -f "$d/leader" ] && read -r lp ls < "$d/leader"\n'
        'ip=; is=; ns=; [ -f "$d/ids" ] && read -r ip is ns < "$d/ids"\n'
        'case "$lp$ls$ip$is$ns" in *[!0-9]*) lp=; ip=; ns=;; esac\n'
        'if [ -n "$ns" ]; then\n'
        '  [ -n "$ip" ] && [ "$(start "$ip")" = "$is" ] && kill -KILL "$ip" 2>/dev/null\n'
        '  [ -n "$lp" ] && [ "$(start "$lp")" = "$ls" ] && kill -KILL "$lp" 2>/dev/null\n'
        "  for i in $(seq 50); do\n"
        '    left=$(find /proc/[0-9]*/ns/pid -maxdepth 0 -lname "pid:?$ns?" 2>/dev/null '
        "| cut -d/ -f3)\n"
        '    [ -z "$left" ] && break; kill -KILL $left 2>/dev/null; sleep 0.02\n'
        "  done\n"
        'elif [ -n "$lp" ]; then\n'
        "  for i in $(seq 50); do\n"
        f"    t=$({_PROC_TABLE}); r=$lp\n"
        '    left=$( { printf "%s\\n" "$t" | awk -v l="$lp" -v s="$ls" '
        "'$3==l && $4>=s {print $1}'; "
        '[ "$(start "$lp")" = "$ls" ] && { echo "$lp"; '
        f'printf "%s\\n" "$t" | {_DESCENDANTS}; }}; }} | sort -u)\n'
        '    [ -z "$left" ] && break; kill -KILL $left 2>/dev/null; sleep 0.02\n'
        "  done\n"
        "fi\n"
    )
    if remove:
        script += 'chmod -R u+rwX -- "$d" 2>/dev/null; rm -rf -- "$d"\n'
    return script


def list_script(root: str) -> str:
    """One line per sandbox folder: its name, a tab, its marker (newlines flattened)."""
    return (
        f"cd -- {shlex.quote(root)} 2>/dev/null || exit 0\n"
        'for x in sbx-*; do [ -d "$x" ] || continue; printf "%s\\t" "$x"; '
        '[ -f "$x/lease.json" ] && head -c 65536 -- "$x/lease.json" | tr "\\n\\t" "  "; '
        "printf '\\n'; done\n"
    )
