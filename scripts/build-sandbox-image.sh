#!/usr/bin/env bash
# Builds the default Docker sandbox image locally, with no registry: a root filesystem made of the
# files of this host's installed Debian packages for python3 (and their dependency closure), a shell
# and coreutils, imported with `docker import`. Usage: scripts/build-sandbox-image.sh [TAG [EXTRA_PACKAGE ...]]
# (`make sandbox-image-pytest` adds python3-pytest, for code items whose tests pytest runs).
set -euo pipefail

TAG="${1:-${FLYWHEEL_SANDBOX_IMAGE:-flywheel-sandbox:latest}}"
ROOTS=(python3-minimal python3.11-minimal libpython3.11-minimal libpython3.11-stdlib python3.11 dash coreutils "${@:2}")
# Packages that only configure a system (maintainer scripts, debconf) and that a sandbox never needs.
SKIP=" debconf perl-base dpkg tzdata media-types readline-common libc-bin install-info "

export DOCKER_HOST="${FLYWHEEL_SANDBOX_DOCKER_HOST:-${DOCKER_HOST:-unix:///var/run/docker.sock}}"
docker version >/dev/null 2>&1 || { echo "no Docker engine answers: run make sandbox-deps first" >&2; exit 1; }

installed() { dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null | grep -qx installed; }

declare -A seen=()
queue=("${ROOTS[@]}")
while [ ${#queue[@]} -gt 0 ]; do
  pkg="${queue[0]}"; queue=("${queue[@]:1}")
  [ -n "${seen[$pkg]:-}" ] && continue
  case "$SKIP" in *" $pkg "*) continue ;; esac
  installed "$pkg" || { echo "required package $pkg is not installed on this host" >&2; exit 1; }
  seen[$pkg]=1
  deps="$(dpkg-query -W -f='${Pre-Depends}, ${Depends}' "$pkg")"
  IFS=',' read -ra groups <<< "$deps"
  for group in "${groups[@]}"; do
    # An alternative "a | b": take the first one that is installed.
    IFS='|' read -ra alts <<< "$group"
    for alt in "${alts[@]}"; do
      name="$(echo "$alt" | sed -E 's/\(.*\)//; s/:any//; s/[[:space:]]//g')"
      [ -z "$name" ] && continue
      if installed "$name"; then queue+=("$name"); break; fi
    done
  done
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
stage="$work/rootfs"
mkdir -p "$stage"/{usr/bin,usr/sbin,usr/lib,usr/lib64,etc,tmp,workspace,proc,dev,sys}
for link in bin sbin lib lib64; do ln -s "usr/$link" "$stage/$link"; done
chmod 1777 "$stage/tmp"

# Every non-directory path the packages own, with the merged-/usr aliases resolved to /usr.
for pkg in "${!seen[@]}"; do dpkg -L "$pkg"; done \
  | sed -E 's#^/(bin|sbin|lib|lib64)/#/usr/\1/#' | sort -u \
  | while read -r path; do
      if [ -L "$path" ] || [ -f "$path" ]; then echo "${path#/}"; fi
    done > "$work/files"
tar -C / -cf - --no-recursion -T "$work/files" | tar -C "$stage" -xf -
cp /etc/ld.so.cache "$stage/etc/ld.so.cache"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:65534:65534:sandbox:/workspace:/usr/sbin/nologin\n' \
  > "$stage/etc/passwd"
printf 'root:x:0:\nsandbox:x:65534:\n' > "$stage/etc/group"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
# Byte-compile the standard library with the staged interpreter (Debian does it at install time; a
# copied package has no .pyc). Without them every sandbox server compiles its imports from source:
# slower to start, and a heap twice the size, which every fork of the server then copies.
for python in "$stage"/usr/bin/python3.[0-9]*; do
  case "$python" in *-config) continue ;; esac
  version="${python##*/python}"
  "$python" -I -m compileall -q -j 0 -s "$stage" -p / "$stage/usr/lib/python$version" >/dev/null \
    || echo "some modules of python$version did not byte-compile; they compile when imported" >&2
done

tar -C "$stage" --numeric-owner -cf "$work/rootfs.tar" .
docker import \
  --change 'USER 65534:65534' \
  --change 'WORKDIR /workspace' \
  --change 'ENV PATH=/usr/bin:/bin LANG=C.UTF-8' \
  --change "LABEL org.flywheel.sandbox.packages=${#seen[@]}" \
  "$work/rootfs.tar" "$TAG" >/dev/null
echo "built $TAG from ${#seen[@]} Debian packages ($(du -sh "$work/rootfs.tar" | cut -f1))"
