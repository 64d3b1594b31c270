"""Python of another CPU on this machine: Debian root filesystems run under qemu-user.

`prepare(arch)` gives a `Rootfs`: Debian stable for that CPU (``arm64``, ``armhf``,
``s390x``) with python3 and Kube32's dependencies from Debian's packages, the CPU's
engine from PyPI (wasmtime for arm64, which has an aarch64 wheel; the pure-Python pwasm
for the others) and a static qemu-user binary inside it.  `Rootfs.python(*args)` is the
command that runs that CPU's ``python3`` here: ``chroot ROOT /usr/local/libexec/kube32/
qemu-CPU /usr/bin/python3 ...``.  qemu is named on the command line, so nothing is
registered with binfmt_misc and nothing outside the cache changes; it follows only the
process it starts, which is enough for a worker (it starts no programs).  The chroot
shares this machine's network, so a worker joins a control plane on 127.0.0.1 and
listens on an address of its own (127.0.0.x) as ``kube32-sim up``'s workers do.

Where things come from (the machine reaches Debian's archive and PyPI only):
- the root filesystem: ``mmdebstrap --variant=extract`` of the suite ``stable`` (the
  name ``trixie`` fails on this mirror with "File has unexpected size").  extract runs
  no maintainer scripts, so the merged-/usr links (/lib, /bin, /sbin) are made here.
  A mirror may lag a point release for one CPU (this one's ``stable`` index named
  s390x .debs of 13.x its pool did not hold: 404): when stable's build fails on a
  missing file, the CPU's root filesystem is ``oldstable`` (Python 3.11, the oldest
  Kube32 runs on) with aiohttp and its dependencies from PyPI's wheels for that CPU
  (oldstable's python3-aiohttp is older than Kube32 needs); the facts say which;
- qemu-user: the static binaries of Debian stable's ``qemu-user`` (10.x; bookworm's 7.2
  runs Python about 7x slower), fetched with ``apt-get download`` through a private apt
  state in the cache: the host's sources and installed packages are never touched;
- wheels: this machine's pip, ``--target`` the root filesystem with that CPU's platform
  and Python version (no pip runs under emulation); wasmtime at the version of this
  machine's environment, pwasm at the version pinned in pyproject.toml.

Cache ($KUBE32_CROSS_CACHE, else /var/cache/kube32-cross as root, else
~/.cache/kube32-cross): ``qemu-user-<version>/`` and ``rootfs-<arch>-<key>/``, the key a
hash of everything that goes in, so a change of package list or pin builds anew.  A
build happens in a temporary directory renamed into place when complete (an interrupted
build leaves nothing that looks finished), under a lock so two runs do not build one
thing twice.  `install_source` copies the code under test into the root filesystem,
content-addressed, so the workers of one arch share one copy and its bytecode.

Run as a program it prepares the root filesystems and prints how long it took:
``python -m tests.cross.rootfs [ARCH ...]``.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]
SUITE = "stable"
# When SUITE's mirror lacks a file for a CPU: this suite, with WHEELS_FALLBACK from PyPI.
SUITE_FALLBACK = "oldstable"
WHEELS_FALLBACK = ("aiohttp>=3.9",)
MIRROR = os.environ.get("KUBE32_CROSS_MIRROR", "http://deb.debian.org/debian")
DEBIAN_PACKAGES = ("python3", "python3-aiohttp", "python3-yaml", "python3-rich", "python3-cryptography")
QEMU_DIR = PurePosixPath("/usr/local/libexec/kube32")   # inside a root filesystem
SITE_DIR = PurePosixPath("/opt/kube32/site")            # the engine's wheel, inside
SOURCE_DIR = PurePosixPath("/opt/kube32")               # src-<hash>/ copies of the code under test
RUN_DIR = PurePosixPath("/run/kube32")                  # one workspace per test run
FORMAT = 1  # bump when the build steps change in a way the key does not show


@dataclass(frozen=True)
class Arch:
    name: str          # Debian's name
    qemu: str          # qemu-user's name
    machine: str       # platform.machine() inside
    kube_arch: str     # the Node's nodeInfo.architecture (Kubernetes' name)
    byteorder: str
    pointer_bits: int
    engine: str        # the engine a worker of this CPU uses
    wheel_platform: str  # PyPI's name of this CPU's wheels (binary engine, fallback wheels)


ARCHES = {a.name: a for a in (
    Arch("arm64", "aarch64", "aarch64", "arm64", "little", 64, "wasmtime", "manylinux2014_aarch64"),
    Arch("armhf", "arm", "armv7l", "arm", "little", 32, "pwasm", "manylinux_2_17_armv7l"),
    Arch("s390x", "s390x", "s390x", "s390x", "big", 64, "pwasm", "manylinux2014_s390x"),
)}


class CrossUnavailable(RuntimeError):
    """This machine cannot run other CPUs' Python; the message says what is missing."""


def cache_dir() -> Path:
    if env := os.environ.get("KUBE32_CROSS_CACHE"):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/kube32-cross")
    return Path.home() / ".cache" / "kube32-cross"


def check_host() -> None:
    """Raise CrossUnavailable naming what keeps this machine from running them."""
    if sys.platform != "linux":
        raise CrossUnavailable(f"qemu-user runs on Linux only (this is {sys.platform})")
    if os.geteuid() != 0:
        raise CrossUnavailable("chroot into the root filesystems needs root")


def _check_build_tools() -> None:
    for tool, package in (("mmdebstrap", "mmdebstrap"), ("apt-get", "apt"), ("dpkg-deb", "dpkg")):
        if shutil.which(tool) is None:
            raise CrossUnavailable(f"{tool} is missing (apt-get install {package})")


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    cp = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if cp.returncode != 0:
        raise CrossUnavailable(f"{what} failed ({cp.returncode}): {' '.join(cmd)}\n{cp.stdout[-3000:]}"
                               f"\n{cp.stderr[-3000:]}")
    return cp


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _clean_env(**extra: str) -> list[str]:
    """``env -i`` and the few variables a Python inside needs: nothing of this
    machine's environment (its PYTHONPATH, PYTHONDONTWRITEBYTECODE, ...) leaks in."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "PYTHONUNBUFFERED": "1", **extra}
    return ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items())]


# --- qemu-user ----------------------------------------------------------------

def _apt(private: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """apt-get with a state of its own under ``private``: Debian stable's packages for
    this machine's CPU, without reading or changing the host's sources or status."""
    host_arch = _run(["dpkg", "--print-architecture"], "dpkg").stdout.strip()
    (private / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (private / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (private / "preferences.d").mkdir(exist_ok=True)
    sources = private / "sources.list"
    sources.write_text(f"deb [arch={host_arch}] {MIRROR} {SUITE} main\n")
    opts = {"Dir::Etc::SourceList": sources, "Dir::Etc::SourceParts": private / "sources.list.d",
            "Dir::Etc::Preferences": private / "preferences", "Dir::Etc::PreferencesParts": private / "preferences.d",
            "Dir::State::Lists": private / "lists", "Dir::Cache": private / "cache",
            "Dir::State::status": private / "status", "APT::Architecture": host_arch,
            "APT::Architectures": host_arch, "Debug::NoLocking": "1", "APT::Sandbox::User": "root"}
    (private / "status").touch()
    return _run(["apt-get", "-q", *(x for k, v in opts.items() for x in ("-o", f"{k}={v}")), *args],
                f"apt-get {args[0]}", cwd=cwd)


def qemu_binaries(cache: Path | None = None) -> Path:
    """The directory of static qemu-user binaries (qemu-aarch64, qemu-arm, qemu-s390x)
    from Debian stable, fetched once into the cache."""
    cache = cache or cache_dir()
    wanted = sorted(f"qemu-{a.qemu}" for a in ARCHES.values())

    def done() -> Path | None:
        found = sorted((d for d in cache.glob("qemu-user-*") if (d / ".complete").exists()),
                       key=lambda d: d.stat().st_mtime)
        return found[-1] if found else None
    if have := done():
        return have
    with _locked(cache / ".lock-qemu"):
        if have := done():
            return have
        _check_build_tools()
        with tempfile.TemporaryDirectory(dir=cache, prefix=".qemu-") as tmp:
            work = Path(tmp)
            _apt(cache / "apt", "update")
            _apt(cache / "apt", "download", "qemu-user", cwd=work)
            deb = next(work.glob("qemu-user_*.deb"))
            version = deb.name.split("_")[1].replace("%3a", ":")
            out = work / "x"
            out.mkdir()
            tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
            _run(["tar", "-x", "-C", str(out), *(f"./usr/bin/{q}" for q in wanted)], "tar", stdin=tar.stdout)
            if tar.wait() != 0:
                raise CrossUnavailable(f"dpkg-deb could not read {deb.name}")
            final = cache / f"qemu-user-{re.sub(r'[^A-Za-z0-9.+-]', '_', version)}"
            shutil.rmtree(final, ignore_errors=True)
            (out / "usr" / "bin").rename(final)
            (final / ".complete").write_text(version + "\n")
        shutil.rmtree(cache / "apt", ignore_errors=True)  # its package lists served this download only
        return final


# --- root filesystems ---------------------------------------------------------

def _pins(arch: Arch) -> list[str]:
    """The engine's wheel for this CPU, pinned."""
    if arch.engine == "wasmtime":
        return [f"wasmtime=={metadata.version('wasmtime')}"]
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = [d for d in deps if re.match(rf"{arch.engine}\s*==", d)]
    if not pin:
        raise CrossUnavailable(f"pyproject.toml pins no {arch.engine} (its dependencies: {deps})")
    return [pin[0].replace(" ", "")]


def _key(arch: Arch) -> str:
    spec = {"format": FORMAT, "arch": arch.name, "suite": SUITE, "mirror": MIRROR,
            "packages": sorted(DEBIAN_PACKAGES), "wheels": _pins(arch),
            "fallback": [SUITE_FALLBACK, *WHEELS_FALLBACK]}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Rootfs:
    arch: Arch
    path: Path
    facts: dict  # what the Python inside reported when it was built

    def host_path(self, inside: PurePosixPath | str) -> Path:
        return self.path / str(inside).lstrip("/")

    def python(self, *args: str, pythonpath: list[PurePosixPath | str] = (), **env: str) -> list[str]:
        """The command that runs this CPU's python3 with ``args`` (paths as seen inside)."""
        path = ":".join(str(p) for p in [*pythonpath, SITE_DIR])
        return [*_clean_env(PYTHONPATH=path, **env), "/usr/sbin/chroot", str(self.path),
                str(QEMU_DIR / f"qemu-{self.arch.qemu}"), "/usr/bin/python3", *args]


_PROBE = ("import json, platform, struct, sys, aiohttp, yaml, rich, cryptography, asyncio, ssl, sqlite3, {engine}; "
          "print(json.dumps({{'machine': platform.machine(), 'byteorder': sys.byteorder, "
          "'pointer_bits': struct.calcsize('P') * 8, 'python': platform.python_version(), "
          "'aiohttp': aiohttp.__version__}}))")


def _build(arch: Arch, final: Path, cache: Path) -> None:
    _check_build_tools()
    qemu = qemu_binaries(cache) / f"qemu-{arch.qemu}"
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".rootfs-{arch.name}-") as tmp:
        root = Path(tmp) / "root"
        suite, wheels = _extract(arch, root)
        for link in ("bin", "sbin", "lib"):  # merged /usr: extract runs no maintainer scripts
            if not (root / link).exists():
                (root / link).symlink_to(f"usr/{link}")
        pythons = sorted(p.name for p in (root / "usr" / "bin").glob("python3.*") if re.fullmatch(r"python3\.\d+", p.name))
        if not pythons:
            raise CrossUnavailable(f"the {arch.name} root filesystem has no python3.X")
        pyver = pythons[-1].removeprefix("python")
        site = root / str(SITE_DIR).lstrip("/")
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--target", str(site), "--only-binary=:all:",
               "--platform", arch.wheel_platform, "--python-version", pyver, "--implementation", "cp"]
        _run([*pip, *_pins(arch)], f"pip install {' '.join(_pins(arch))} for {arch.name}")
        if wheels:  # with their dependencies, as wheels for this CPU (no build under emulation)
            _run([*(a for a in pip if a != "--no-deps"), *wheels], f"pip install {' '.join(wheels)} for {arch.name}")
        inside = root / str(QEMU_DIR).lstrip("/")
        inside.mkdir(parents=True)
        shutil.copy2(qemu, inside / qemu.name)
        (root / str(RUN_DIR).lstrip("/")).mkdir(parents=True, exist_ok=True)
        # The first run compiles the bytecode of everything a worker imports (so later
        # runs start faster) and says what CPU it is.
        probe = Rootfs(arch, root, {}).python("-c", _PROBE.format(engine=arch.engine))
        facts = json.loads(_run(probe, f"python3 under qemu-{arch.qemu}", timeout=900).stdout.strip().splitlines()[-1])
        want = {"machine": arch.machine, "byteorder": arch.byteorder, "pointer_bits": arch.pointer_bits}
        if {k: facts[k] for k in want} != want:
            raise CrossUnavailable(f"the {arch.name} python reports {facts}, expected {want}")
        (root / ".kube32-rootfs.json").write_text(json.dumps({**facts, "arch": arch.name, "qemu": str(qemu),
                                                              "suite": suite,
                                                              "wheels": [*_pins(arch), *wheels]}) + "\n")
        root.rename(final)


def _extract(arch: Arch, root: Path) -> tuple[str, tuple[str, ...]]:
    """Debian's packages for ``arch`` into ``root``: the suite used, and the wheels that
    must come from PyPI besides (SUITE_FALLBACK's, when SUITE's mirror lacks a file)."""
    def mmdebstrap(suite: str, packages: tuple[str, ...]) -> None:
        shutil.rmtree(root, ignore_errors=True)
        _run(["mmdebstrap", f"--arch={arch.name}", "--variant=extract", "--quiet",
              f"--include={','.join(packages)}", suite, str(root), MIRROR], f"mmdebstrap {suite} ({arch.name})")
    try:
        mmdebstrap(SUITE, DEBIAN_PACKAGES)
        return SUITE, ()
    except CrossUnavailable as e:
        if not _missing_on_mirror(str(e)):
            raise
        print(f"{arch.name}: {MIRROR} lacks a file of {SUITE} for this CPU; building {SUITE_FALLBACK} "
              f"with {', '.join(WHEELS_FALLBACK)} from PyPI", file=sys.stderr, flush=True)
    mmdebstrap(SUITE_FALLBACK, tuple(p for p in DEBIAN_PACKAGES if p != "python3-aiohttp"))
    return SUITE_FALLBACK, WHEELS_FALLBACK


def _missing_on_mirror(output: str) -> bool:
    """apt's words for a file the index names and the mirror does not hold (with
    ``--quiet`` mmdebstrap says only that the download failed)."""
    return bool(re.search(r"\b404\b|apt download failed|File has unexpected size|Hash Sum mismatch", output))


def prepare(name: str, cache: Path | None = None) -> Rootfs:
    """The root filesystem of ``name`` (built on first use, then from the cache)."""
    check_host()
    if name not in ARCHES:
        raise ValueError(f"unknown arch {name!r} (known: {', '.join(ARCHES)})")
    arch = ARCHES[name]
    cache = cache or cache_dir()
    final = cache / f"rootfs-{name}-{_key(arch)}"
    stamp = final / ".kube32-rootfs.json"
    if not stamp.exists():
        with _locked(cache / f".lock-{name}"):
            if not stamp.exists():
                shutil.rmtree(final, ignore_errors=True)
                _build(arch, final, cache)
                _prune_cache(cache, name, keep=final)
    os.utime(stamp)  # in use: kept by _prune_cache
    return Rootfs(arch, final, json.loads(stamp.read_text()))


def _prune_cache(cache: Path, name: str, keep: Path, unused_for: float = 7 * 86400) -> None:
    """Root filesystems of ``name`` under other keys (older package lists or pins) go
    once unused for a week (another checkout may still want one), and what a killed
    build left behind once a day old."""
    now = time.time()
    for d in cache.glob(f"rootfs-{name}-*"):
        stamp = d / ".kube32-rootfs.json"
        if d != keep and now - (stamp.stat().st_mtime if stamp.exists() else d.stat().st_mtime) > unused_for:
            shutil.rmtree(d, ignore_errors=True)
    for d in [*cache.glob(f".rootfs-{name}-*"), *cache.glob(".qemu-*")]:
        if now - d.stat().st_mtime > 86400:
            shutil.rmtree(d, ignore_errors=True)


# --- the code under test, and a workspace per run --------------------------------

SOURCE_GLOBS = ("kube32/**/*.py", "tests/__init__.py", "tests/cross/*.py", "examples/pods/*.wasm")


def install_source(rootfs: Rootfs) -> PurePosixPath:
    """A copy of this worktree's code (the Kube32 package, this directory, the example
    pods) inside ``rootfs``, named by its content: the directory to put on PYTHONPATH."""
    files = sorted({p for g in SOURCE_GLOBS for p in ROOT.glob(g) if p.is_file() and "__pycache__" not in p.parts})
    digest = hashlib.sha256()
    for p in files:
        digest.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    inside = SOURCE_DIR / f"src-{digest.hexdigest()[:16]}"
    final = rootfs.host_path(inside)
    if final.exists():
        return inside
    tmp = final.with_name(f".{final.name}-{uuid.uuid4().hex[:8]}")
    for p in files:
        dest = tmp / p.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dest)
    try:
        tmp.rename(final)
    except OSError:  # another run put the same content there first
        shutil.rmtree(tmp, ignore_errors=True)
    _prune_sources(rootfs, keep=final)
    return inside


def _prune_sources(rootfs: Rootfs, keep: Path, older_than: float = 86400) -> None:
    """Copies of other code not used for a day go (a run in progress touches its own)."""
    now = time.time()
    for d in rootfs.host_path(SOURCE_DIR).glob("src-*"):
        if d != keep and now - d.stat().st_mtime > older_than:
            shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def workspace(rootfs: Rootfs) -> Iterator[PurePosixPath]:
    """A fresh directory inside ``rootfs`` for one run's files (kubeconfigs, node data),
    removed afterwards; yields its path as seen inside."""
    inside = RUN_DIR / uuid.uuid4().hex[:12]
    host = rootfs.host_path(inside)
    host.mkdir(parents=True)
    try:
        yield inside
    finally:
        shutil.rmtree(host, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.cross.rootfs", description=__doc__.split("\n\n")[0])
    p.add_argument("arches", nargs="*", metavar="ARCH",
                   help=f"{', '.join(ARCHES)} (default: all)")
    args = p.parse_args(argv)
    args.arches = args.arches or list(ARCHES)
    if unknown := [a for a in args.arches if a not in ARCHES]:
        p.error(f"unknown ARCH {', '.join(unknown)} (choose from {', '.join(ARCHES)})")
    t0 = time.monotonic()

    def one(name: str) -> tuple[bool, str]:
        try:
            fs = prepare(name)
        except CrossUnavailable as e:
            return False, f"cross: {name}: {e}"
        return True, (f"cross: {name}: {fs.path} ({fs.facts['machine']}, {fs.facts['byteorder']}-endian, "
                      f"{fs.facts['pointer_bits']}-bit, Python {fs.facts['python']}, {fs.arch.engine}) "
                      f"ready after {time.monotonic() - t0:.1f} s")
    # Side by side: a build is mostly downloads and one emulated Python's first start.
    with ThreadPoolExecutor(len(args.arches) or 1) as pool:
        results = list(pool.map(one, args.arches))
    for ok, line in results:
        print(line, flush=True, file=sys.stdout if ok else sys.stderr)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
