"""Running untrusted code (a model's program, a tool call) in a subprocess with limits: `run_code`, `python_tool`.

The contract is docs/agent.md, "The sandbox". Floor 1: the standard library, psutil and `backend.procs` only.

How a run goes. `run_code` writes the source into a fresh temporary directory (the child's cwd, HOME and TMPDIR,
removed afterwards) and starts `python -I -S -B -X utf8 -c BOOTSTRAP` as the leader of a new session
(`start_new_session`; the group is ended with `procs.kill_group`), with a minimal environment (PATH, HOME, TMPDIR,
LANG: no project variable, no PYTHONPATH) and stdin from an unlinked temporary file. The bootstrap, a few lines of
standard library, sets up the layers below and then forks the user's program (`python -I -S -B main.py`) and waits
for it, reporting its exit status and CPU time on a private pipe. The layers are set in that bootstrap, not in a
`preexec_fn`: Python code between fork and exec in a threaded parent (the trainer, the reward worker) can
deadlock, which CPython's documentation warns of; the bootstrap is a fresh single-threaded interpreter.

What each layer guarantees (and what it does not):
- **rlimits** (always): RLIMIT_CPU (soft = `cpu_s`, hard one second later; both `cpu_s` in a PID namespace, whose
  init ignores SIGXCPU), RLIMIT_AS (`memory_mb`: an allocation
  beyond it fails, Python raises MemoryError), RLIMIT_FSIZE (`file_mb` per file written), RLIMIT_NOFILE,
  RLIMIT_CORE = 0. RLIMIT_NPROC counts every task (threads too) of the *user*, not of the sandbox, so it is set to
  the user's current task count plus `max_processes`: a fork bomb gets `max_processes` more tasks and then fork
  fails, while the user's other processes (which keep their own, higher limit) are never refused. The kernel
  ignores RLIMIT_NPROC for root, so as root the child first drops to the uid `nobody` (below); where that fails,
  no process limit holds and `sandbox_capabilities().process_limit` says so.
- **wall clock**: the whole group is killed at `wall_s` ("wall timeout"), also when the program sleeps.
- **output**: stdout and stderr are read incrementally; past `max_output_bytes` on either the group is killed
  ("output cap"), so an endless print neither fills memory nor runs to the wall clock.
- **process group**: everything the program forks is killed with it at the end (SIGKILL to the group). A child
  that calls setsid() leaves the group; only the PID namespace (next) catches that one.
- **namespaces** (probed once per process, cached): a new network namespace (only a loopback interface, down:
  connecting anywhere, 127.0.0.1 included, fails) and a new PID namespace (the program is its init; when it exits
  the kernel kills every process left in it, setsid() or not). As root these need nothing more; otherwise they
  need an unprivileged user namespace (CLONE_NEWUSER, the user mapped to itself). Where the kernel refuses,
  the run goes on without them and `SandboxResult.network_isolated` / `sandbox_capabilities()` say so.
- **read-only filesystem and disk quota** (a mount namespace, in the same unshare where the kernel allows it):
  mounts are made private, the work directory becomes a tmpfs of its own (`disk_mb`, `max_files`; nosuid, nodev,
  noexec; the program copied in), so filling it ends in ENOSPC, not a full disk (where tmpfs is refused it is
  bind-mounted onto itself, without a quota, and `sandbox_capabilities().disk_quota` says so), and every other mount (but /proc and /sys) is
  remounted read-only, keeping its nosuid/nodev/noexec/atime flags (a user namespace may not drop them). Writing
  anywhere but the work directory (the project, HOME of the user, /tmp, /dev/shm) then fails with EROFS; device
  nodes such as /dev/null still work. A mount whose remount the kernel refuses is named in `SandboxResult.notes`
  (for /, /tmp, /dev/shm, /home or /var/tmp the layer counts as absent); `sandbox_capabilities()
  .filesystem_readonly` says whether it holds, from the probe.
- **privileges** (as root only): the child runs as `nobody` with no supplementary groups and NO_NEW_PRIVS (a
  setuid binary gains nothing). Without the read-only layer it can then write only where `nobody` may (its
  directory, world-writable places such as /tmp): not the project, not /root. When the interpreter itself is not
  readable by `nobody` (a Python under /root), the child keeps one capability, CAP_DAC_READ_SEARCH (read any file,
  write none), so that it can start; `sandbox_capabilities().reads_restricted` is then False.
- **not prevented**: reading what the child's user may read. /etc, the project and the home directory are not
  hidden (hiding them needs mounts over directories that may hold the interpreter itself, under the home directory
  or the project: left out). Without the read-only layer a non-root sandbox can write wherever its user can, and
  any sandbox can write world-writable places (/tmp, /dev/shm). Without the mount namespace there is no disk quota:
  RLIMIT_FSIZE bounds each file, not their number, so a program can fill the filesystem that holds the temporary
  directory at its disk's speed until its CPU or wall-clock limit ends it. Run untrusted code on a machine, or as
  a user, that holds nothing it must not see; the layers bound the damage to the machine, not the secrecy of files.

Only Python is supported (`language="python"`): the standard library works, site-packages are not on the path.
"""

from __future__ import annotations

import functools
import json
import math
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import psutil

from backend.procs import kill_group
from backend.project import PROJECT_ROOT

NOBODY = 65534
# the interpreter itself, not a virtual environment's link to it: with -I -S the environment adds nothing, and the
# link may sit in a directory the child's user cannot enter
PYTHON = os.path.realpath(sys.executable)
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWNS = 0x10000000, 0x40000000, 0x20000000, 0x00020000

# The bootstrap: argv[1] is its JSON config. It tries each namespace set in order (the first that unshare accepts
# wins), drops privileges when asked, sets the rlimits, then forks the program and reports on `status_fd`.
_BOOTSTRAP = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
rep = {"net": False, "pid": False, "uid": os.getuid(), "read_cap": False, "errors": []}
uid, gid = os.getuid(), os.getgid()
for flags in cfg["unshare"]:
    if libc.unshare(ctypes.c_int(flags)) == 0:
        if flags & 0x10000000:
            for f, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{f}", "w") as fh:
                    fh.write(text)
        rep["net"], rep["pid"], rep["flags"] = bool(flags & 0x40000000), bool(flags & 0x20000000), flags
        break
    rep["errors"].append(f"unshare {flags:#x}: {os.strerror(ctypes.get_errno())}")
rep["readonly"] = False
if rep.get("flags", 0) & 0x00020000:  # a mount namespace: every mount read-only but the work directory
    def mount(src, target, flags, fstype=None, data=None):
        if libc.mount(src, target.encode(), fstype, ctypes.c_ulong(flags), data) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target}: {os.strerror(ctypes.get_errno())}")
    try:
        mount(b"none", "/", (1 << 14) | (1 << 18))  # MS_REC | MS_PRIVATE: nothing propagates out
        work = os.path.dirname(cfg["main"])
        with open(cfg["main"], "rb") as fh:
            program = fh.read()
        owner = (cfg["drop_uid"], cfg["drop_uid"]) if cfg["drop_uid"] is not None else (uid, gid)
        try:  # the work directory as a tmpfs of its own: the disk quota (size and inodes), nosuid, nodev, noexec
            opts = f"size={cfg['disk_mb']}m,nr_inodes={cfg['inodes']},mode=0700,uid={owner[0]},gid={owner[1]}"
            mount(b"sandbox", work, 2 | 4 | 8, b"tmpfs", opts.encode())
            with open(cfg["main"], "wb") as fh:
                fh.write(program)
            rep["disk_quota"] = True
        except OSError as e:
            rep["errors"].append(f"disk quota (tmpfs): {e}")
            mount(work.encode(), work, 4096)  # MS_BIND: the work directory, a mount of its own, stays writable
        os.chdir(work)  # the cwd still named the directory under the new mount
        with open("/proc/self/mountinfo") as fh:
            table = [line.split() for line in fh]
        bits = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
        for row in table:
            point = row[4].encode().decode("unicode_escape")
            if point == work or point.startswith(("/proc", "/sys")) or "ro" in row[5].split(","):
                continue
            opts = row[5].split(",")
            flags = 32 | 4096 | 1 | sum(bits.get(o, 0) for o in opts)  # MS_REMOUNT | MS_BIND | MS_RDONLY
            if not any(o in opts for o in ("noatime", "relatime")):
                flags |= 1 << 24  # MS_STRICTATIME: a user namespace may not change the atime rule
            try:
                mount(None, point, flags)
            except (OSError, ValueError) as e:
                if point in ("/", "/tmp", "/dev/shm", "/home", "/var/tmp"):
                    raise
                rep["errors"].append(str(e))
        rep["readonly"] = True
    except (OSError, ValueError) as e:
        rep["errors"].append(f"read-only mounts: {e}")
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
if cfg["drop_uid"] is not None:
    try:
        keep = cfg["read_cap"]
        if keep and libc.prctl(8, 1, 0, 0, 0) != 0:  # PR_SET_KEEPCAPS
            raise OSError(ctypes.get_errno(), "keepcaps")
        os.setgroups([])
        os.setresgid(cfg["drop_uid"], cfg["drop_uid"], cfg["drop_uid"])
        os.setresuid(cfg["drop_uid"], cfg["drop_uid"], cfg["drop_uid"])
        if keep:
            class Hdr(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
            class Data(ctypes.Structure):
                _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
            data = (Data * 2)()
            data[0].effective = data[0].permitted = data[0].inheritable = 1 << 2  # CAP_DAC_READ_SEARCH
            if libc.capset(ctypes.byref(Hdr(0x20080522, 0)), data) != 0:
                raise OSError(ctypes.get_errno(), "capset")
            if libc.prctl(47, 2, 2, 0, 0) != 0:  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH
                raise OSError(ctypes.get_errno(), "ambient")
            rep["read_cap"] = True
        rep["uid"] = os.getuid()
    except OSError as e:
        rep["errors"].append(f"drop privileges: {e}")
        if os.getuid() == 0:
            os.write(cfg["status_fd"], json.dumps(rep).encode())
            os._exit(125)
for name, soft, hard in cfg["rlimits"]:
    try:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    except (ValueError, OSError) as e:
        rep["errors"].append(f"{name}: {e}")
try:
    pid = os.fork()
except OSError as e:
    rep["errors"].append(f"fork: {e}")
    os.write(cfg["status_fd"], json.dumps(rep).encode())
    os._exit(125)
if pid == 0:
    os.close(cfg["status_fd"])
    os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", "-X", "utf8", cfg["main"]])
_, status, usage = os.wait4(pid, 0)
rep["cpu"] = usage.ru_utime + usage.ru_stime
rep["exit"] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
os.write(cfg["status_fd"], json.dumps(rep).encode())
os._exit(0)
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. cpu_s is rounded up to whole seconds (RLIMIT_CPU's unit)."""
    cpu_s: float = 5.0
    wall_s: float = 10.0
    memory_mb: int = 512
    file_mb: int = 16
    disk_mb: int = 64  # the work directory's size (a tmpfs, where the mount namespace allows: RAM, not disk)
    max_files: int = 4096  # files and directories it may hold
    max_processes: int = 32
    max_open_files: int = 64
    max_output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_mb", "file_mb", "disk_mb", "max_files", "max_processes",
                     "max_open_files", "max_output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, not {getattr(self, name)!r}")


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # negative: killed by that signal; None: no status (the group was killed first)
    timed_out: bool
    killed_reason: str | None  # "cpu time limit", "memory limit", "process limit", "output cap", "wall timeout"
    seconds: float
    network_isolated: bool
    notes: tuple[str, ...] = ()  # layers that could not be set up for this run

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_reason is None


@dataclass(frozen=True)
class SandboxCapabilities:
    """What this machine's sandbox enforces (probed once per process)."""
    network_isolated: bool
    pid_namespace: bool
    process_limit: bool  # RLIMIT_NPROC binds (not root, or root that dropped to `nobody`)
    privileges_dropped: bool  # root ran the child as `nobody`
    # the child is unprivileged (no root, no CAP_DAC_READ_SEARCH): it reads what its user may, which still includes
    # /etc, a world-readable project and a non-root user's own files (nothing is hidden)
    reads_restricted: bool
    writes_restricted: bool  # the probe's child could not write the project directory
    filesystem_readonly: bool  # every mount but the work directory (and /proc, /sys) read-only in the child
    disk_quota: bool = False  # the work directory is a tmpfs of disk_mb / max_files (SandboxLimits)
    notes: tuple[str, ...] = field(default_factory=tuple)


def _world_readable_interpreter() -> bool:
    """Whether `nobody` could start this interpreter: every directory on the way o+x, the binary and the
    standard library o+r."""
    paths = [PYTHON, os.path.realpath(os.path.dirname(os.__file__))]
    for p in paths:
        d = p
        while d not in ("/", ""):
            try:
                mode = os.stat(d).st_mode
            except OSError:
                return False
            if not mode & 0o001 or (d == p and not mode & 0o004):
                return False
            d = os.path.dirname(d)
    return True


@dataclass(frozen=True)
class _Plan:
    unshare: tuple[int, ...]
    drop_uid: int | None
    read_cap: bool


def _plan() -> _Plan:
    root = os.geteuid() == 0
    base = CLONE_NEWNET | CLONE_NEWPID
    tries = (base | CLONE_NEWNS, base, CLONE_NEWNET, CLONE_NEWPID)
    if not root:
        tries = tuple(CLONE_NEWUSER | f for f in tries)
    return _Plan(tries, NOBODY if root else None, root and not _world_readable_interpreter())


def _tasks_of(uid: int) -> int:
    """Tasks (threads included: RLIMIT_NPROC counts them) of `uid` now."""
    n = 0
    for p in psutil.process_iter(["uids", "num_threads"]):
        try:
            if p.info["uids"] is not None and p.info["uids"].real == uid:
                n += p.info["num_threads"] or 1
        except (psutil.Error, AttributeError):
            continue
    return n


def _rmtree(path: str) -> None:
    def unlock(func, p, _exc):  # a child may chmod 000 what it wrote
        try:
            os.chmod(p, 0o700)
            parent = os.path.dirname(p)
            os.chmod(parent, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=unlock)


def _launch(source: str, limits: SandboxLimits, stdin: str, plan: _Plan) -> tuple[SandboxResult, dict]:
    start = time.monotonic()
    plan_net = bool(plan.unshare and plan.unshare[0] & CLONE_NEWNET)  # a killed bootstrap reports nothing
    # a PID namespace's init ignores SIGXCPU (it has no handler), so the soft limit would only cost a second more
    pid_ns = bool(plan.unshare and plan.unshare[0] & CLONE_NEWPID)
    tmp = tempfile.mkdtemp(prefix="sandbox-")
    status_r, status_w = os.pipe()
    proc = None
    try:
        main = os.path.join(tmp, "main.py")
        with open(main, "w", encoding="utf-8") as f:
            f.write(source)
        if plan.drop_uid is not None:
            os.chown(tmp, plan.drop_uid, plan.drop_uid)
            os.chown(main, plan.drop_uid, plan.drop_uid)
        nproc_uid = plan.drop_uid if plan.drop_uid is not None else os.getuid()
        nproc = _tasks_of(nproc_uid) + limits.max_processes + 1  # + 1: the bootstrap itself
        cpu = max(1, math.ceil(limits.cpu_s))
        mem, fsize = limits.memory_mb << 20, limits.file_mb << 20
        cfg = {"unshare": list(plan.unshare), "drop_uid": plan.drop_uid, "read_cap": plan.read_cap,
               "status_fd": status_w, "main": main, "disk_mb": limits.disk_mb, "inodes": limits.max_files,
               "rlimits": [("RLIMIT_CORE", 0, 0), ("RLIMIT_CPU", cpu, cpu if pid_ns else cpu + 1), ("RLIMIT_AS", mem, mem),
                           ("RLIMIT_FSIZE", fsize, fsize), ("RLIMIT_NOFILE", limits.max_open_files, limits.max_open_files),
                           ("RLIMIT_NPROC", nproc, nproc)]}
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"}
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode("utf-8", errors="replace"))
            stdin_file.seek(0)
            proc = subprocess.Popen([PYTHON, "-I", "-S", "-B", "-c", _BOOTSTRAP, json.dumps(cfg)], cwd=tmp, env=env,
                                    stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=(status_w,), start_new_session=True)
        os.close(status_w)
        status_w = -1
        out, err, reason, timed_out = _collect(proc, limits, start)
        kill_group(proc, grace_s=0)
        report = _read_status(status_r)
    finally:
        if proc is not None and proc.poll() is None:
            kill_group(proc, grace_s=0)
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        _rmtree(tmp)
    exit_code = report["exit"] if "exit" in report else proc.returncode if reason is None else None
    stderr_text = err.decode("utf-8", errors="replace")
    if reason is None:
        reason = _reason(exit_code, float(report.get("cpu", 0.0)), cpu, stderr_text)
    result = SandboxResult(out.decode("utf-8", errors="replace"), stderr_text, exit_code, timed_out, reason,
                           time.monotonic() - start, bool(report.get("net", plan_net)), tuple(report.get("errors", ())))
    return result, report


def _collect(proc: subprocess.Popen[bytes], limits: SandboxLimits, start: float) -> tuple[bytes, bytes, str | None, bool]:
    """Read stdout and stderr until both close, the cap is passed or the wall clock runs out."""
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    deadline = start + limits.wall_s
    reason, timed_out, exited_at = None, False, None
    try:
        while sel.get_map() and reason is None:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now  # something it left behind may hold the pipes: read what is there, then stop
            if exited_at is not None and now - exited_at > 0.5:
                break
            if now >= deadline:
                reason, timed_out = "wall timeout", True
                break
            for key, _ in sel.select(timeout=min(deadline - now, 0.1)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                room = limits.max_output_bytes - len(buf)
                buf += chunk[:room]
                if len(chunk) > room:
                    reason = "output cap"
                    break
        if reason is None and exited_at is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                reason, timed_out = "wall timeout", True
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), reason, timed_out


def _read_status(fd: int) -> dict:
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    try:
        report = json.loads(data) if data else {}
    except ValueError:
        report = {}
    return report if isinstance(report, dict) else {}


def _reason(exit_code: int | None, cpu_used: float, cpu_limit: int, stderr: str) -> str | None:
    """Why a run that ended by itself failed, when a limit explains it."""
    if exit_code is None or exit_code == 0:
        return None
    if exit_code < 0 and cpu_used >= cpu_limit - 0.05:
        return "cpu time limit"  # SIGXCPU at the soft limit, or SIGKILL at the hard one (a PID namespace's init)
    tail = stderr[-2000:]
    if "MemoryError" in tail:
        return "memory limit"
    if "BlockingIOError" in tail and "Resource temporarily unavailable" in tail:
        return "process limit"
    if "File too large" in tail:
        return "file size limit"
    return None


@functools.cache
def _probe() -> tuple[_Plan, dict]:
    """One run of a tiny program with every layer asked for: which layers the kernel gave (the bootstrap's report)
    and whether the child could write the project directory. Cached: later runs ask only for what worked."""
    full = _plan()
    source = f"import os\nprint(os.access({str(PROJECT_ROOT)!r}, os.W_OK))\n"
    # fall back layer by layer: no namespaces, then (as root, if dropping privileges is what fails) no drop either
    failed: list[str] = []
    for plan in (full, _Plan((), full.drop_uid, full.read_cap), _Plan((), None, False)):
        result, report = _launch(source, SandboxLimits(cpu_s=5, wall_s=20), "", plan)
        if "exit" in report:
            break
        failed += [*report.get("errors", ()), f"probe failed: {result.stderr.strip()[-300:]}"]
    report = {**report, "errors": [*failed, *report.get("errors", ())]}
    chosen = (report["flags"],) if "flags" in report else ()
    report = {**report, "project_writable": result.stdout.strip() != "False"}
    return _Plan(chosen, plan.drop_uid, plan.read_cap), report


def sandbox_capabilities() -> SandboxCapabilities:
    """What the sandbox enforces on this machine, from one probe run (cached)."""
    _, report = _probe()
    uid = report.get("uid", os.getuid())
    dropped = os.geteuid() == 0 and uid != 0
    notes = list(report.get("errors", ()))
    if not report.get("net"):
        notes.append("network isolation is unavailable on this kernel (no network namespace without root)")
    if not report.get("pid"):
        notes.append("no PID namespace: a child that calls setsid() can outlive the run")
    if uid == 0:
        notes.append("the child runs as root: RLIMIT_NPROC does not bind, no process limit")
    if not report.get("readonly"):
        notes.append("no read-only mounts (no mount namespace): the child writes wherever its user may")
    if report.get("project_writable"):
        notes.append("the child can write the project directory (it runs as a user who may)")
    if not report.get("disk_quota"):
        notes.append("no disk quota: the work directory is not a tmpfs of its own (RLIMIT_FSIZE bounds each file)")
    return SandboxCapabilities(network_isolated=bool(report.get("net")), pid_namespace=bool(report.get("pid")),
                               process_limit=uid != 0, privileges_dropped=dropped,
                               reads_restricted=uid != 0 and not report.get("read_cap"),
                               writes_restricted=not report.get("project_writable"),
                               filesystem_readonly=bool(report.get("readonly")),
                               disk_quota=bool(report.get("disk_quota")), notes=tuple(notes))


def run_code(source: str, language: str = "python", limits: SandboxLimits | None = None, stdin: str = "") -> SandboxResult:
    """Run `source` in the sandbox (the module docstring says what each layer guarantees) and return its output,
    exit code and, when a limit ended it, why."""
    if language != "python":
        raise ValueError(f"the sandbox runs python only, not {language!r}")
    plan, _ = _probe()
    result, _ = _launch(source, limits or SandboxLimits(), stdin, plan)
    return result


TOOL_LIMITS = SandboxLimits(cpu_s=10, wall_s=15, memory_mb=1024, max_output_bytes=64 << 10)
TOOL_MAX_CHARS = 8000


def python_tool(code: str) -> str:
    """Run Python code in a sandbox and return what it prints.

    The standard library is available, third-party packages and the network are not. Each call starts a fresh
    interpreter in an empty directory: nothing persists between calls. Print the values you want to see.

    Args:
        code: The Python source code to run.
    """
    r = run_code(code, limits=TOOL_LIMITS)
    parts = [r.stdout]
    if r.stderr:
        parts.append(("\n" if r.stdout and not r.stdout.endswith("\n") else "") + "stderr:\n" + r.stderr)
    if r.killed_reason:
        parts.append(f"\n[stopped: {r.killed_reason}]")
    elif r.exit_code not in (0, None):
        parts.append(f"\n[exit code {r.exit_code}]")
    text = "".join(parts) or "(no output)"
    if len(text) > TOOL_MAX_CHARS:
        text = text[:TOOL_MAX_CHARS] + f"\n... (cut: {len(text) - TOOL_MAX_CHARS} more characters)"
    return text


python_tool.__name__ = "python"  # the name the model calls it by (get_json_schema reads __name__)
python_tool.__qualname__ = "python"
