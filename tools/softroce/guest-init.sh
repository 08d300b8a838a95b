#!/bin/sh
# PID 1 of the Soft-RoCE guest (busybox sh, copied into the initramfs as
# /init by prepare.sh; editing this file makes prepare.sh rebuild the
# initramfs). run.sh boots the guest with these 9p shares:
#
#   tag        host path          guest mount                     cache
#   hostroot   /                  /newroot (read-only)            loose
#   results    a per-run folder   /results = /run/softroce        none
#   shareN     $SOFTROCE_SHARES   /newroot<same absolute path>    mmap
#
# and reads /results/config.sh (written by run.sh) for SOFTROCE_SHARES and
# SOFTROCE_MSIZE. Sequence:
#
#   load modules (/modules/order) -> mount shares -> chroot tree ready
#   -> veth v0/v1, 10.0.0.1/24 on v0, rxe0 on v0, wait for PORT_ACTIVE
#   -> run /run/softroce/cmd.sh in the chroot, output to output.log
#   -> write `status` (the exit code) -> power off
#
# Anything that fails before the command runs writes `setup_error` (when
# the results share is up) and powers off: no `status` file means failure
# to run.sh, which then points at the console log.

PATH=/bin
/bin/busybox mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys

say() { echo "softroce-guest: [$(cut -d' ' -f1 /proc/uptime)] $*"; }
results_up=0
fail() {
  say "setup failed: $*"
  [ "$results_up" = 1 ] && echo "$*" >/results/setup_error
  sync
  poweroff -f
  sleep 10
}
uptime_s() { cut -d' ' -f1 /proc/uptime; }

# ---- modules, in the order prepare.sh resolved ----------------------------
while read -r m; do
  optional=0
  case "$m" in \?*)
    optional=1
    m="${m#?}"
    ;;
  esac
  if ! insmod "/modules/$m.ko" 2>/tmp/insmod.err; then
    if [ "$optional" = 1 ]; then
      say "optional module $m not loaded: $(cat /tmp/insmod.err)"
    else
      fail "insmod $m: $(cat /tmp/insmod.err)"
    fi
  fi
done </modules/order
say "modules loaded"

# ---- file systems ---------------------------------------------------------
ninep="trans=virtio,version=9p2000.L"
mount -t 9p -o "$ninep" results /results || fail "cannot mount the results share"
results_up=1
[ -r /results/config.sh ] || fail "no /results/config.sh"
. /results/config.sh
ninep="$ninep,msize=${SOFTROCE_MSIZE:-262144}"

# The guest only reads the host tree, and what it runs from there was built
# before the run: let it cache freely (cache=loose).
mount -t 9p -o "ro,$ninep,cache=loose" hostroot /newroot || fail "cannot mount the host root share"
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs shm /newroot/dev/shm
for d in /tmp /run /var/tmp /root; do
  [ -d "/newroot$d" ] && mount -t tmpfs tmpfs "/newroot$d"
done
i=0
for s in $SOFTROCE_SHARES; do
  # A share under /tmp, /run, /var/tmp or /root sits below the guest's own
  # tmpfs mounted above: make its mount point there (elsewhere it exists).
  [ -d "/newroot$s" ] || mkdir -p "/newroot$s" || fail "cannot create mount point $s"
  # cache=mmap: shared writable mappings work, writes reach the host now.
  mount -t 9p -o "$ninep,cache=mmap" "share$i" "/newroot$s" || fail "cannot mount share $s"
  i=$((i + 1))
done
mkdir -p /newroot/run/softroce
mount --bind /results /newroot/run/softroce
say "file systems mounted"

# ---- network and rxe: host tools (iproute2, rdma) inside the chroot --------
# One veth end carries one rxe device; server and client both use 10.0.0.1
# and rxe loops the traffic back through its full requester/responder path.
# (rxe on lo: rdma_cm gives ENODEV; rxe on both veth ends: address
# resolution times out. See softroce.md.) MTU 9000 on the veth gives rxe
# an active MTU of 4096: one packet per 4 KiB page instead of four.
# One shell in the chroot and one `ip -batch`: each exec of a host binary
# over 9p costs about 0.3 s under emulation.
in_root() { chroot /newroot /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
# shellcheck disable=SC2016  # expanded by the shell in the chroot
in_root /bin/sh -c '
  ip -batch - <<EOF || exit 1
link set lo up
link add v0 type veth peer name v1
link set v0 mtu 9000
link set v1 mtu 9000
addr add 10.0.0.1/24 dev v0
link set v1 up
link set v0 up
EOF
  rdma link add rxe0 type rxe netdev v0 || exit 1
  tries=0
  until rdma link show rxe0/1 | grep -q "state ACTIVE"; do
    tries=$((tries + 1))
    [ "$tries" -gt 100 ] && { echo "rxe0 port 1 not ACTIVE after 10 s: $(rdma link show 2>&1)"; exit 1; }
    sleep 0.1
  done
' >/tmp/net.log 2>&1 || fail "veth/rxe set-up: $(cat /tmp/net.log)"
uptime_s >/results/ready
say "rxe0 ready"

# ---- the command ----------------------------------------------------------
# busybox ash knows -l and -n.
# shellcheck disable=SC3045
ulimit -l unlimited -n 65536
chroot /newroot /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root TERM=dumb LANG=C.UTF-8 SOFTROCE_GUEST=1 \
  /bin/bash /run/softroce/cmd.sh </dev/null >/results/output.log 2>&1
rc=$?
uptime_s >/results/done
echo "$rc" >/results/status.tmp && mv /results/status.tmp /results/status
say "command exited $rc"
sync
poweroff -f
sleep 10
