#!/bin/busybox sh
# zjusct.cloud guest initrd /init (busybox-static).
# Loads the virtio (PCI for QEMU q35, MMIO for Firecracker), virtio-blk/net and ext4 module chain listed in
# /etc/initrd-modules (dependency order, computed at build time from modules.dep), waits for the root device
# named by root= on the kernel command line, mounts it and switch_roots to its init.
# Any failure exits, which panics the kernel: with panic=-1 and a VMM that exits on reboot, the VM stops
# instead of hanging.
/bin/busybox mkdir -p /proc /sys /dev /newroot
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
/bin/busybox --install -s /bin
export PATH=/bin

log() { echo "zjusct-initrd: $*" > /dev/kmsg 2>/dev/null || echo "zjusct-initrd: $*"; }

while read -r ko; do
    [ -n "$ko" ] || continue
    insmod "/lib/modules/$ko" 2>/dev/null || log "insmod $ko failed (continuing)"
done < /etc/initrd-modules

root=""
rootflags="ro"
rootfstype="ext4"
init="/sbin/init"
wait_s=30
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        root=*) root="${arg#root=}" ;;
        rootfstype=*) rootfstype="${arg#rootfstype=}" ;;
        rootwait=*) wait_s="${arg#rootwait=}" ;;
        init=*) init="${arg#init=}" ;;
        rw) rootflags="rw" ;;
        ro) rootflags="ro" ;;
    esac
done
[ -n "$root" ] || { log "no root= on the kernel command line"; exit 1; }

i=0
dev=""
while [ "$i" -lt $((wait_s * 10)) ]; do
    case "$root" in
        LABEL=*|UUID=*) dev="$(findfs "$root" 2>/dev/null)" ;;
        *) dev="$root" ;;
    esac
    [ -n "$dev" ] && [ -b "$dev" ] && break
    dev=""
    sleep 0.1
    i=$((i + 1))
done
[ -n "$dev" ] || { log "root device $root did not appear within ${wait_s}s"; exit 1; }

mount -t "$rootfstype" -o "$rootflags" "$dev" /newroot || { log "mount $dev on / failed"; exit 1; }
[ -x "/newroot$init" ] || [ -L "/newroot$init" ] || { log "$init not found on $dev"; exit 1; }
mount --move /dev /newroot/dev 2>/dev/null || umount /dev
umount /sys
umount /proc
exec switch_root /newroot "$init"
