#!/usr/bin/env bash
# Builds, or finds in the cache, everything the Soft-RoCE guest boots from:
# Debian's own kernel (downloaded with apt-get download and unpacked, never
# installed) and a small busybox initramfs holding the guest init and the
# kernel modules for virtio-9p, veth and rdma_rxe. See
# /work/shared/softroce.md (and docs next to it) for why it is built this way.
#
#   tools/softroce/prepare.sh            # prints the guest directory, e.g.
#   .cache/softroce/6.1.0-57-amd64       #   (vmlinux + initramfs.cpio inside)
#
# Options:
#   --no-install   never apt-get install; skip when a package is missing
# Environment:
#   FARMEM_SOFTROCE_CACHE    cache root (default <repo>/.cache/softroce)
#   FARMEM_SOFTROCE_KERNEL   kernel package to use (default: the one that
#                            `apt-cache depends linux-image-amd64` names)
#
# Cache layout, keyed on the kernel version (reused whenever present):
#   <cache>/<kver>/linux-image-<kver>_<ver>_amd64.deb   what was downloaded
#   <cache>/<kver>/vmlinux              uncompressed ELF, boots through PVH
#   <cache>/<kver>/initramfs-<hash>.cpio  hash of guest-init.sh + this file,
#                                       so editing either rebuilds only it
#   <cache>/<kver>/initramfs.cpio       -> the current initramfs-<hash>.cpio
#   <cache>/current                     -> <kver>, the fallback when offline
#
# Exit status: 0 ready (the directory is the only line on stdout); 77 this
# machine cannot host the guest ("SKIP: <reason>" printed); 1 harness error.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Everything the guest uses from the host tree (it chroots into the host's
# /), plus what this script needs to build the guest. seabios: the pc
# machine's firmware, a Recommends of qemu-system-x86 and so easily missed.
PACKAGES=(qemu-system-x86 seabios busybox-static rdma-core ibverbs-providers ibverbs-utils
  rdmacm-utils perftest iproute2 kmod cpio xz-utils)

# Modules the guest init loads, by name; their dependencies are resolved
# from modules.dep. crc32_generic must come before rdma_rxe: rxe asks the
# crypto API for "crc32" at link creation, which modules.dep cannot express
# (without it `rdma link add` fails with ENOENT). A leading '?' marks a
# module whose load may fail (crc32-pclmul needs a CPU feature).
MODULES=(virtio_pci 9pnet_virtio 9p veth crc32_generic ?crc32-pclmul rdma_rxe ib_uverbs rdma_ucm)

install_packages=1
while (($#)); do
  case "$1" in
    --no-install) install_packages=0 ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *) softroce_die "unknown option '$1' (see --help)" ;;
  esac
  shift
done

start=$(softroce_now)

# ---- 1. The host can host a guest at all --------------------------------
[[ "$(uname -s)/$(uname -m)" == Linux/x86_64 ]] ||
  softroce_skip "the Soft-RoCE guest needs an x86_64 Linux host; this is $(uname -s)/$(uname -m)"
softroce_have dpkg-query ||
  softroce_skip "not a Debian-family host (no dpkg-query): install qemu-system-x86, busybox-static, rdma-core and perftest by hand and port prepare.sh"

# ---- 2. Packages -------------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
  [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" == "ii "* ]] || missing+=("$p")
done
apt_updated=0
apt_update() {
  ((apt_updated)) && return 0
  apt_updated=1
  apt-get update -qq >&2
}
if ((${#missing[@]})); then
  ((install_packages)) ||
    softroce_skip "packages missing and --no-install given: ${missing[*]}"
  [[ $EUID -eq 0 ]] ||
    softroce_skip "packages missing (${missing[*]}); run as root so that apt-get can install them, or install them"
  softroce_log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
    apt_update || true
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
      softroce_skip "apt-get install ${missing[*]} failed (no package mirror reachable?)"
  fi
fi

# ---- 3. Which kernel ----------------------------------------------------------
kernel_pkg_from_apt() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}
mkdir -p "$SOFTROCE_CACHE"
kpkg="${FARMEM_SOFTROCE_KERNEL:-}"
if [[ -z "$kpkg" ]]; then
  kpkg="$(kernel_pkg_from_apt)"
  if [[ -z "$kpkg" && $EUID -eq 0 ]]; then
    apt_update || true
    kpkg="$(kernel_pkg_from_apt)"
  fi
fi
if [[ -z "$kpkg" ]]; then
  [[ -e "$SOFTROCE_CACHE/current/vmlinux" ]] ||
    softroce_skip "apt-cache does not name a kernel for linux-image-amd64 (run apt-get update) and nothing is cached in $SOFTROCE_CACHE"
  kpkg="linux-image-$(readlink "$SOFTROCE_CACHE/current")"
  softroce_log "apt names no kernel; using the cached $kpkg"
fi
kver="${kpkg#linux-image-}"
[[ "$kver" =~ ^[0-9][A-Za-z0-9.+~-]*$ ]] || softroce_die "odd kernel package name '$kpkg'"
dir="$SOFTROCE_CACHE/$kver"
mkdir -p "$dir"

# One builder at a time per cache; a second caller waits, then reuses.
exec 9>"$SOFTROCE_CACHE/.lock"
flock -w 600 9 || softroce_die "waited 10 min for $SOFTROCE_CACHE/.lock; is another prepare.sh stuck?"

tmp=""
cleanup() { [[ -n "$tmp" ]] && rm -rf "$tmp"; }
trap cleanup EXIT
tmp="$(mktemp -d "$SOFTROCE_CACHE/.build.XXXXXX")"
chmod 755 "$tmp"

# ---- 4. Download the kernel package (once per version) ------------------------
deb="$(compgen -G "$dir/${kpkg}_*.deb" | head -n1 || true)"
if [[ -z "$deb" ]]; then
  softroce_log "downloading $kpkg"
  mkdir "$tmp/dl"
  # apt-get download drops privileges to _apt when it can write the folder.
  if id _apt >/dev/null 2>&1; then chown _apt "$tmp/dl" 2>/dev/null || true; fi
  if ! (cd "$tmp/dl" && apt-get download -qq "$kpkg" >&2); then
    rmdir "$dir" 2>/dev/null || true
    # Offline with a newer kernel named: the cached one (its .deb too, so
    # that the initramfs can still be rebuilt) keeps the harness working.
    fallback="$(readlink "$SOFTROCE_CACHE/current" 2>/dev/null || true)"
    deb="$(compgen -G "$SOFTROCE_CACHE/$fallback/linux-image-${fallback}_*.deb" | head -n1 || true)"
    [[ -n "$fallback" && -n "$deb" ]] ||
      softroce_skip "apt-get download $kpkg failed (no package mirror reachable?) and no kernel is cached"
    softroce_log "apt-get download $kpkg failed; using the cached kernel $fallback"
    kver="$fallback"
    kpkg="linux-image-$kver"
    dir="$SOFTROCE_CACHE/$kver"
  else
    deb="$(compgen -G "$tmp/dl/${kpkg}_*.deb" | head -n1 || true)"
    [[ -n "$deb" ]] || softroce_die "apt-get download $kpkg left no .deb in $tmp/dl"
    mv "$deb" "$dir/"
    deb="$dir/$(basename "$deb")"
  fi
fi

# ---- 5. vmlinux and the initramfs (each only when missing) ---------------------
hash="$(cat "$SOFTROCE_TOOLS_DIR/guest-init.sh" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
initramfs="$dir/initramfs-$hash.cpio"

# The bzImage decompresses itself in about 6 s under emulation. The ELF
# inside boots through the PVH entry point straight away: find the
# compressed payload by its magic, as the kernel's scripts/extract-vmlinux
# does, and keep the first candidate that decompresses to an ELF file.
extract_vmlinux() {
  local bz="$1" out="$2" magic tool off
  for pair in 'fd377a585a00:xz' '28b52ffd:zstd' '1f8b0800:gzip'; do
    magic="${pair%%:*}" tool="${pair#*:}"
    softroce_have "$tool" || continue
    local pattern
    # shellcheck disable=SC2001  # every byte pair, not one substitution
    pattern="$(sed 's/../\\x&/g' <<<"$magic")"
    while IFS=: read -r off _; do
      # Trailing bytes after the stream make the decompressor complain;
      # the ELF check below is what decides.
      tail -c +"$((off + 1))" "$bz" | "$tool" -dc 2>/dev/null >"$out" || true
      if [[ "$(head -c4 "$out" | od -An -tx1 | tr -d ' \n')" == 7f454c46 ]]; then
        return 0
      fi
    done < <(LC_ALL=C grep -aboP "$pattern" "$bz" || true)
  done
  return 1
}

# Resolves MODULES against modules.dep into load order (dependencies first)
# and copies them, uncompressed, into $1/modules with an `order` file.
declare -A MODPATH=() MODDEPS=() SEEN=() OPTIONAL=()
ORDER=()
# Sets NORM to the module name of a path or name: dashes become
# underscores as the kernel does. No subshell: it runs for every line of
# modules.dep.
normalize() {
  NORM="${1##*/}"
  NORM="${NORM%%.ko*}"
  NORM="${NORM//-/_}"
}
resolve_module() {
  local n
  normalize "$1"
  n="$NORM"
  [[ -n "${SEEN[$n]:-}" ]] && return 0
  SEEN[$n]=1
  if [[ -z "${MODPATH[$n]:-}" ]]; then
    grep -q "/$n.ko\$\|/${n//_/-}.ko\$" "$moddir/modules.builtin" && return 0
    softroce_die "kernel $kver has no module '$n' (names change between versions: update MODULES in prepare.sh)"
  fi
  # modules.dep lists the whole closure, most basic last: load from the end.
  local -a deps
  read -r -a deps <<<"${MODDEPS[$n]}"
  local i
  for ((i = ${#deps[@]} - 1; i >= 0; i--)); do resolve_module "${deps[i]}"; done
  ORDER+=("$n")
}
copy_modules() {
  local dest="$1" n src
  mkdir -p "$dest"
  : >"$dest/order"
  for n in "${ORDER[@]}"; do
    src="$moddir/${MODPATH[$n]}"
    case "$src" in
      *.ko) cp "$src" "$dest/$n.ko" ;;
      *.ko.xz) xz -dc "$src" >"$dest/$n.ko" ;;
      *.ko.zst) zstd -qdc "$src" >"$dest/$n.ko" ;;
      *.ko.gz) gzip -dc "$src" >"$dest/$n.ko" ;;
      *) softroce_die "unknown module format: $src" ;;
    esac
    printf '%s%s\n' "${OPTIONAL[$n]:+?}" "$n" >>"$dest/order"
  done
}

if [[ ! -s "$dir/vmlinux" || ! -s "$initramfs" ]]; then
  softroce_log "unpacking $(basename "$deb")"
  dpkg -x "$deb" "$tmp/root"
  moddir="$tmp/root/lib/modules/$kver"
  [[ -d "$moddir" ]] || softroce_die "$(basename "$deb") has no lib/modules/$kver"
  # The package ships no modules.dep; depmod writes it for this tree only.
  depmod -b "$tmp/root" "$kver"

  if [[ ! -s "$dir/vmlinux" ]]; then
    softroce_log "extracting vmlinux"
    bz="$tmp/root/boot/vmlinuz-$kver"
    if grep -q '^CONFIG_PVH=y' "$tmp/root/boot/config-$kver" && extract_vmlinux "$bz" "$tmp/vmlinux"; then
      mv "$tmp/vmlinux" "$dir/vmlinux"
    else
      # Without a PVH entry qemu cannot load the ELF; the bzImage boots too,
      # about 6 s slower under emulation.
      softroce_log "no PVH-capable vmlinux in $kver; booting the bzImage instead"
      cp "$bz" "$dir/vmlinux"
    fi
    cp "$tmp/root/boot/config-$kver" "$dir/config"
  fi

  if [[ ! -s "$initramfs" ]]; then
    softroce_log "building the initramfs ($hash)"
    while IFS= read -r line; do
      path="${line%%:*}"
      normalize "$path"
      MODPATH[$NORM]="$path"
      MODDEPS[$NORM]="${line#*:}"
    done <"$moddir/modules.dep"
    for m in "${MODULES[@]}"; do
      if [[ "$m" == \?* ]]; then
        m="${m#\?}"
        normalize "$m"
        OPTIONAL[$NORM]=1
      fi
      resolve_module "$m"
    done
    ir="$tmp/initramfs"
    mkdir -p "$ir"/{bin,dev,proc,sys,newroot,results,tmp}
    cp /bin/busybox "$ir/bin/busybox"
    ln -s busybox "$ir/bin/sh"
    cp "$SOFTROCE_TOOLS_DIR/guest-init.sh" "$ir/init"
    chmod 755 "$ir/init"
    copy_modules "$ir/modules"
    # Uncompressed: under emulation, decompressing costs more than reading.
    (cd "$ir" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) >"$tmp/initramfs.cpio"
    mv "$tmp/initramfs.cpio" "$initramfs"
    softroce_log "modules: $(tr '\n' ' ' <"$ir/modules/order")"
  fi
fi

# Older initramfs builds of this kernel are dead weight.
for f in "$dir"/initramfs-*.cpio; do
  [[ "$f" == "$initramfs" ]] || rm -f "$f"
done
ln -sfn "$(basename "$initramfs")" "$dir/initramfs.cpio"
printf 'package=%s\ndeb=%s\ninitramfs=%s\n' "$kpkg" "$(basename "$deb")" "$(basename "$initramfs")" >"$dir/info"
ln -sfn "$kver" "$SOFTROCE_CACHE/current"
# Kernels that apt no longer names are 140 MB each of dead weight.
for old in "$SOFTROCE_CACHE"/*/vmlinux; do
  old="$(dirname "$old")"
  [[ -L "$old" || "$old" == "$dir" ]] || { softroce_log "removing the old kernel $(basename "$old")"; rm -rf "$old"; }
done
softroce_log "guest ready in $(softroce_elapsed "$start") s: $dir"
printf '%s\n' "$dir"
