#!/usr/bin/env python3
"""Build the cluster tier's container images as OCI archives, with no registry and no Docker.

The cluster tier (scripts/cluster.py, tests/cluster/) has no registry to pull from, so every image
its pods run is made here from files on this machine and imported into containerd:

    pause     the pod sandbox: tools/pause/pause.c, built static
    busybox   a shell and the usual commands: Debian's busybox-static, with one link per applet
    debian    a Debian root (debootstrap, minbase) with Python, FUSE and this package in a venv:
              the agent's image, and the one GPU pods run in
    nvidia    the same Debian root with NVIDIA's Go programs and Node Feature Discovery's
              (scripts/go-tools.txt, built into the cache) in /usr/bin: the image of the device
              plugin, GPU feature discovery, the DRA driver and NFD, as their own images carry them
    nfd       the nvidia image's layers run as nobody (65534), as NFD's own image does: its
              manifests ask for runAsNonRoot

An archive is an OCI image layout (oci-layout, index.json, blobs/sha256/...) in one tar, each
layer an uncompressed tar written in a fixed order with fixed times, so the same inputs give the
same digests. `ctr images import` reads it; the index's `io.containerd.image.name` annotation
names the image.

    scripts/oci_image.py pause OUT.tar [--name mokkafs.local/pause:1]
    scripts/oci_image.py busybox OUT.tar
    scripts/oci_image.py debian OUT.tar --repo .     (root; minutes; cached, see --cache)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("MOKKA_CACHE", Path.home() / ".cache" / "mokkafs"))

# The Debian release the image root comes from: the one this machine runs, so that the package's
# wheels (built here, cp311) and its native shims (built against this glibc) run in it.
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = os.environ.get("MOKKA_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBIAN_PACKAGES = ["python3", "python3-venv", "fuse3", "ca-certificates", "procps", "kmod"]

# The environment every image's processes start with, as Debian's own images set it.
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

NAMES = {
    "pause": "mokkafs.local/pause:1",
    "busybox": "mokkafs.local/busybox:1",
    "debian": "mokkafs.local/debian:1",
    "nvidia": "mokkafs.local/nvidia:1",
    "nfd": "mokkafs.local/nfd:1",
}

# The programs the nvidia image carries (names in scripts/go-tools.txt): NVIDIA's, and Node Feature
# Discovery's, which NVIDIA's charts deploy beside them.
NVIDIA_PROGRAMS = ("nvidia-device-plugin", "gpu-feature-discovery", "nvidia-mig-parted", "nvidia-ctk",
                   "nvidia-cdi-hook", "gpu-kubelet-plugin", "compute-domain-kubelet-plugin",
                   "nfd-master", "nfd-worker", "nfd-gc")


# Files NVIDIA's images carry beside the programs, from the pinned module's own source in the Go
# module cache: the DRA driver's image copies the repository's templates/ to /templates (its
# compute-domain kubelet plugin reads the IMEX daemon's config template from there at prepare).
MODULE_FILES = {"compute-domain-kubelet-plugin": ("templates", "templates")}


class ImageError(Exception):
    pass


def module_source(program: str) -> Path:
    """The source tree, in the Go module cache, of the module that scripts/go-tools.txt builds
    `program` from (at its pinned version)."""
    for line in (REPO / "scripts" / "go-tools.txt").read_text().splitlines():
        f = line.split()
        if f and f[0] == program:
            package, version = f[1].rsplit("@", 1)
            break
    else:
        raise ImageError(f"{program} is not a line of scripts/go-tools.txt")
    mod = CACHE / "go" / "pkg" / "mod"
    # The module is the longest prefix of the package path that the cache holds at this version
    # (upper-case letters are escaped as '!' + lower case there).
    parts = package.split("/")
    for n in range(len(parts), 0, -1):
        escaped = "".join("!" + c.lower() if c.isupper() else c for c in "/".join(parts[:n]))
        d = mod / f"{escaped}@{version}"
        if d.is_dir():
            return d
    raise ImageError(f"the source of {package}@{version} is not in {mod} "
                     f"(scripts/install_go_tools.sh {program})")


# -- layers -----------------------------------------------------------------------------------


def _layer_from_tree(root: Path) -> bytes:
    """One layer: every file under root, sorted, owned by root, with a fixed time. Device nodes,
    FIFOs and sockets are left out: a container's /dev is the runtime's, never the image's."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            if info is None or info.ischr() or info.isblk() or info.isfifo():
                continue  # gettarinfo gives None for a socket
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            info.pax_headers = {}
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def write_archive(out: Path, name: str, layers: list[bytes], config: dict) -> str:
    """An OCI layout with one image in one tar at out; returns the manifest's digest."""
    blobs: dict[str, bytes] = {}
    layer_descs = []
    diff_ids = []
    for layer in layers:
        desc = _blob(blobs, layer)
        layer_descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", **desc})
        diff_ids.append(desc["digest"])  # uncompressed: the layer's digest is its diff id
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "scripts/oci_image.py", "comment": name}],
    }
    config_desc = _blob(blobs, json.dumps(image_config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
        "layers": layer_descs,
    }
    manifest_desc = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **manifest_desc,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
    }
    for digest, data in blobs.items():
        files["blobs/sha256/" + digest.split(":", 1)[1]] = data
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        for dirname in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(dirname)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return manifest_desc["digest"]


# -- the images -------------------------------------------------------------------------------


def _run(cmd: list[str], **kw) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise ImageError(f"{' '.join(cmd[:3])}... exited {proc.returncode}: " + " | ".join(tail))


def build_pause(out: Path, name: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp, "root")
        root.mkdir()
        _run(["gcc", "-static", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(root / "pause"),
              str(REPO / "tools" / "pause" / "pause.c")])
        return write_archive(out, name, [_layer_from_tree(root)],
                             {"Entrypoint": ["/pause"], "User": "65535:65535"})


def build_busybox(out: Path, name: str) -> str:
    busybox = shutil.which("busybox")
    if busybox is None:
        raise ImageError("no busybox on PATH (Debian's busybox-static; scripts/setup.sh installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp, "root")
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev"):
            (root / d).mkdir(parents=True)
        shutil.copy2(busybox, root / "bin" / "busybox")
        applets = subprocess.run([busybox, "--list"], capture_output=True, text=True,
                                 check=True).stdout.split()
        for applet in applets:
            if applet != "busybox" and not (root / "bin" / applet).exists():
                (root / "bin" / applet).symlink_to("busybox")
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                             "nobody:x:65534:65534:nobody:/:/bin/false\n")
        (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        (root / "tmp").chmod(0o1777)
        return write_archive(out, name, [_layer_from_tree(root)],
                             {"Cmd": ["/bin/sh"], "Env": [PATH_ENV]})


def _debian_root(cache: Path) -> Path:
    """A minimal Debian root with Python and FUSE, made once by debootstrap and kept in cache."""
    root = cache / f"debian-{DEBIAN_SUITE}-root"
    stamp = root.with_name(root.name + ".done")
    if stamp.exists() and stamp.read_text() == " ".join(DEBIAN_PACKAGES):
        return root
    if os.geteuid() != 0:
        raise ImageError("making the Debian root needs root (debootstrap)")
    if shutil.which("debootstrap") is None:
        raise ImageError("no debootstrap (Debian's debootstrap; scripts/setup.sh installs it)")
    shutil.rmtree(root, ignore_errors=True)
    stamp.unlink(missing_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    _run(["debootstrap", "--variant=minbase", "--include=" + ",".join(DEBIAN_PACKAGES),
          DEBIAN_SUITE, str(root), DEBIAN_MIRROR])
    # A container's /dev is the runtime's: debootstrap's device nodes go (a copy of the tree
    # would otherwise read /dev/zero without end).
    for p in (root / "dev").iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (root / junk).glob("*"):
            if p.is_file():
                p.unlink()
    stamp.write_text(" ".join(DEBIAN_PACKAGES))
    return root


def _base_layer(cache: Path) -> bytes:
    """The Debian root as a layer, written once beside the root: the debian, nvidia and nfd
    images share it, and each is built by a run of its own."""
    root = _debian_root(cache)
    layer = root.with_name(root.name + ".layer.tar")
    stamp = root.with_name(root.name + ".done")
    if not layer.exists() or layer.stat().st_mtime < stamp.stat().st_mtime:
        tmp = layer.with_name(layer.name + ".tmp")
        tmp.write_bytes(_layer_from_tree(root))
        tmp.replace(layer)
    return layer.read_bytes()


def _special_files(directory: str, names: list[str]) -> list[str]:
    """copytree's ignore: device nodes, FIFOs and sockets are never copied (nor read)."""
    out = []
    for name in names:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            out.append(name)
    return out


def build_debian(out: Path, name: str, repo: Path, cache: Path) -> str:
    """The Debian root as one layer, and the package (with its wheels built here) as another."""
    base = _debian_root(cache)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp, "wheels")
        # The package and its dependencies as wheels, built by this machine's Python (the same
        # minor version as the image's: cp311) and against this machine's libfuse3 (bookworm's).
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels), str(repo)])
        work = Path(tmp, "root")
        shutil.copytree(base, work, symlinks=True, ignore=_special_files)
        shutil.copytree(wheels, work / "tmp" / "wheels")
        # The install runs in the image's root, with this machine's /dev (pip and venv open
        # /dev/null), unmounted before anything of the root is read into a layer.
        _run(["mount", "--rbind", "/dev", str(work / "dev")])
        try:
            _run(["chroot", str(work), "python3", "-m", "venv", "/opt/mokkafs"])
            _run(["chroot", str(work), "/opt/mokkafs/bin/pip", "install", "-q", "--no-index",
                  "--no-cache-dir", "--find-links", "/tmp/wheels", "mokkafs"])
        finally:
            subprocess.run(["umount", "-R", str(work / "dev")], capture_output=True)
        shutil.rmtree(work / "tmp" / "wheels")
        (work / "usr" / "local" / "bin" / "mokka").symlink_to("/opt/mokkafs/bin/mokka")
        # Only what the install added goes in the second layer.
        added = Path(tmp, "added")
        for rel in ("opt", "usr/local/bin"):
            shutil.copytree(work / rel, added / rel, symlinks=True)
        return write_archive(out, name, [_base_layer(cache), _layer_from_tree(added)],
                             {"Cmd": ["/bin/bash"], "Env": [PATH_ENV]})


def build_nvidia(out: Path, name: str, cache: Path, user: str | None = None) -> str:
    go_bin = CACHE / "go" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        added = Path(tmp, "added")
        (added / "usr" / "bin").mkdir(parents=True)
        for program in NVIDIA_PROGRAMS:
            src = go_bin / program
            if not src.is_file():
                raise ImageError(f"{src} is missing (scripts/install_go_tools.sh {program})")
            shutil.copy2(src, added / "usr" / "bin" / program)
        for program, (source, target) in MODULE_FILES.items():
            shutil.copytree(module_source(program) / source, added / target)
        return write_archive(out, name, [_base_layer(cache), _layer_from_tree(added)],
                             # NVIDIA's images ask the NVIDIA runtime for every GPU, as this does.
                             {"Cmd": ["/bin/bash"], "Env": [PATH_ENV, "NVIDIA_VISIBLE_DEVICES=all",
                                                          "NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
                              **({"User": user} if user else {})})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("image", choices=sorted(NAMES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--name", help="the image's name (default: mokkafs.local/IMAGE:1)")
    ap.add_argument("--repo", type=Path, default=REPO)
    ap.add_argument("--cache", type=Path, default=CACHE / "images")
    args = ap.parse_args(argv)
    name = args.name or NAMES[args.image]
    try:
        if args.image == "pause":
            digest = build_pause(args.out, name)
        elif args.image == "busybox":
            digest = build_busybox(args.out, name)
        elif args.image == "nvidia":
            digest = build_nvidia(args.out, name, args.cache)
        elif args.image == "nfd":
            digest = build_nvidia(args.out, name, args.cache, user="65534:65534")
        else:
            digest = build_debian(args.out, name, args.repo, args.cache)
    except (ImageError, OSError) as e:
        print(f"oci_image: {args.image}: {e}", file=sys.stderr)
        return 1
    print(f"{name} {digest} {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
