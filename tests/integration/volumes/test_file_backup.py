"""Backups of file-backed volumes on real files: raw files (sparse), real qcow2 overlays on a base made by
``qemu-img``, QEMU's own image locking (``qemu-io``), and processes killed with SIGKILL midway.

What each test proves is in its name; the volumes are small (tens of MiB) except where a kill needs time to land.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import backup_io as bio
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import file_backup as fb
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.backup_chain import (
    BLOCK_SIZE,
    COMPLETE_FILE,
    DATA_FILE,
    BackupError,
)
from ansible_collections.zjusct.cloud.plugins.module_utils.storage.volume_blocks import Qcow2Source, hold_off_writers

from tests.conftest import require

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _qemu_tools():
    require("qemu-img", shutil.which("qemu-img") is not None and shutil.which("qemu-io") is not None,
            "qemu-img/qemu-io not installed (qemu-utils, hack/install-deps.sh)")


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(MiB), b""):
            h.update(piece)
    return h.hexdigest()


def write_at(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def raw_volume(path, size_mib: int, blocks: dict) -> Path:
    """A sparse raw file of ``size_mib`` MiB with ``blocks`` {4 MiB block index: bytes written at its start}."""
    with open(path, "wb") as f:
        f.truncate(size_mib * MiB)
    for idx, data in blocks.items():
        write_at(path, idx * BLOCK_SIZE, data)
    return Path(path)


def allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def qemu_img(*args: str) -> str:
    return subprocess.run(["qemu-img", *args], check=True, capture_output=True, text=True, timeout=300).stdout


def qemu_io(path, *commands: str, fmt: str = "qcow2", read_only: bool = False) -> subprocess.CompletedProcess:
    argv = ["qemu-io", "-f", fmt, *(["-r"] if read_only else [])]
    for c in commands:
        argv += ["-c", c]
    return subprocess.run([*argv, str(path)], capture_output=True, text=True, timeout=300, check=False)


def as_raw(path, tmp_path, fmt: str) -> str:
    """sha256 of the disk the guest sees (``qemu-img convert`` to raw)."""
    out = tmp_path / f"seen-{time.monotonic_ns()}.raw"
    qemu_img("convert", "-f", fmt, "-O", "raw", str(path), str(out))
    try:
        return sha256(out)
    finally:
        out.unlink()


def test_a_raw_volume_full_then_incremental_stores_only_changed_blocks_and_both_restore_sparse(tmp_path):
    vol = raw_volume(tmp_path / "v.raw", 64, {0: b"boot" * 1024, 5: os.urandom(3 * MiB), 9: b"file one" * 100})
    dest = str(tmp_path / "bk")
    want1 = sha256(vol)
    full = fb.backup_volume(str(vol), "raw", dest, volume="v-root", vm="default/v", owner="alice")
    b1 = full["backup"]
    assert full["plan"]["type"] == "full" and b1["volume"] == {"driver": "file", "name": "v-root"}
    assert b1["dataBytes"] == 3 * BLOCK_SIZE and len(b1["blocks"]) == 16  # only the 3 non-zero blocks stored
    assert os.path.exists(os.path.join(dest, b1["id"], COMPLETE_FILE))
    write_at(vol, 9 * BLOCK_SIZE, b"file TWO" * 100)
    write_at(vol, 12 * BLOCK_SIZE + 17, b"new block")
    write_at(vol, 5 * BLOCK_SIZE, bytes(BLOCK_SIZE))  # block 5 now reads as zero
    want2 = sha256(vol)
    inc = fb.backup_volume(str(vol), "raw", dest, volume="v-root", owner="alice")
    b2 = inc["backup"]
    assert inc["plan"]["type"] == "diff" and b2["chain"] == [b1["id"], b2["id"]]
    assert b2["dataBytes"] == 2 * BLOCK_SIZE  # blocks 9 and 12; block 5 is a zero record
    assert inc["bytes_written"] < 2 * BLOCK_SIZE + 4096
    r1 = fb.restore_volume(dest, str(tmp_path / "r1.raw"), "raw", b1["id"])
    r2 = fb.restore_volume(dest, str(tmp_path / "r2.raw"), "raw")
    assert (r1["verified_blocks"], r2["backup_id"]) == (16, b2["id"])
    assert sha256(tmp_path / "r1.raw") == want1 and sha256(tmp_path / "r2.raw") == want2
    assert allocated(tmp_path / "r2.raw") <= 4 * 64 * 1024  # holes stay holes (64 KiB grain): 3 small writes
    assert os.stat(tmp_path / "r2.raw").st_mode & 0o777 == 0o600
    assert bio.verify_chain(dest, None)[1] == []
    with pytest.raises(BackupError, match="already exists; restore only into a new volume"):
        fb.restore_volume(dest, str(tmp_path / "r2.raw"))


def test_a_qcow2_overlay_is_backed_up_as_the_guest_sees_it_and_restores_as_raw_or_standalone_qcow2(tmp_path):
    base_raw = raw_volume(tmp_path / "base.raw", 48, {1: os.urandom(BLOCK_SIZE), 6: b"base data" * 50})
    base = tmp_path / "base.qcow2"
    qemu_img("convert", "-f", "raw", "-O", "qcow2", str(base_raw), str(base))
    ov = tmp_path / "vm.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(ov))
    assert qemu_io(ov, "write -P 0xab 1M 64k", "write -z 4M 4M", "write -P 0x11 30M 100k").returncode == 0
    want1 = as_raw(ov, tmp_path, "qcow2")
    dest = str(tmp_path / "bk")
    full = fb.backup_volume(str(ov), "qcow2", dest, driver="qcow2", volume="q-root")
    assert full["backup"]["volume"]["driver"] == "qcow2" and full["backup"]["image"]["sizeBytes"] == 48 * MiB
    # blocks 0 (overlay data), 1 was overwritten with zeros by the overlay, 6 (base), 7 (overlay): 3 stored
    assert full["backup"]["dataBytes"] == 3 * BLOCK_SIZE
    assert qemu_io(ov, "write -P 0x22 30M 4k").returncode == 0
    want2 = as_raw(ov, tmp_path, "qcow2")
    inc = fb.backup_volume(str(ov), "qcow2", dest, driver="qcow2", volume="q-root")
    assert inc["plan"]["type"] == "diff" and inc["backup"]["dataBytes"] == BLOCK_SIZE
    raw1 = fb.restore_volume(dest, str(tmp_path / "r1.raw"), "raw", full["backup"]["id"])
    q2 = fb.restore_volume(dest, str(tmp_path / "r2.qcow2"), "qcow2")
    assert raw1["verified_blocks"] == 12 and "convert" in q2["phases"]
    assert sha256(tmp_path / "r1.raw") == want1
    info = json.loads(qemu_img("info", "--output=json", str(tmp_path / "r2.qcow2")))
    assert info["format"] == "qcow2" and "backing-filename" not in info  # standalone: the backup is the disk
    assert as_raw(tmp_path / "r2.qcow2", tmp_path, "qcow2") == want2
    assert qemu_img("check", str(tmp_path / "r2.qcow2")).find("No errors") >= 0


def bitmap_names(path) -> list:
    info = json.loads(qemu_img("info", "-U", "--output=json", str(path)))
    return sorted(b["name"] for b in info["format-specific"]["data"].get("bitmaps", []))


def qcow2_volume(tmp_path, size_mib: int = 64) -> Path:
    vol = tmp_path / "vm.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", str(vol), f"{size_mib}M")
    assert qemu_io(vol, *(f"write -P {i + 1} {i * 8}M 1M" for i in range(size_mib // 8))).returncode == 0
    return vol


def test_a_qcow2_incremental_reads_only_the_blocks_qemus_dirty_bitmap_marks(tmp_path):
    vol = qcow2_volume(tmp_path)
    dest = str(tmp_path / "bk")
    full = fb.backup_volume(str(vol), "qcow2", dest, driver="qcow2")
    assert full["read_blocks"] == 16 and bitmap_names(vol) == [full["backup"]["snapshot"]]
    assert qemu_io(vol, "write -P 0x77 20M 8k", "write -P 0x78 61M 4k").returncode == 0  # blocks 5 and 15
    inc = fb.backup_volume(str(vol), "qcow2", dest, driver="qcow2")
    assert inc["plan"]["type"] == "diff" and "the 2 blocks its qcow2 dirty bitmap marks" in inc["plan"]["reason"]
    assert inc["read_blocks"] == 2 and inc["backup"]["dataBytes"] == 2 * BLOCK_SIZE
    assert inc["removed_snapshots"] == [full["backup"]["snapshot"]]
    assert bitmap_names(vol) == [inc["backup"]["snapshot"]]
    fb.restore_volume(dest, str(tmp_path / "r.raw"))
    assert sha256(tmp_path / "r.raw") == as_raw(vol, tmp_path, "qcow2")


def test_a_bitmap_left_in_use_by_a_killed_qemu_is_not_trusted_and_every_block_is_compared(tmp_path):
    vol = qcow2_volume(tmp_path)
    dest = str(tmp_path / "bk")
    fb.backup_volume(str(vol), "qcow2", dest, driver="qcow2")
    # stdbuf: qemu-io's stdout is a pipe, so without line buffering "wrote" would only come at its exit
    writer = subprocess.Popen(["stdbuf", "-oL", "qemu-io", "-f", "qcow2", "-c", "write -P 0x55 33M 4k", "-c",
                               "sleep 600000", str(vol)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert "wrote 4096/4096" in writer.stdout.readline()
        assert writer.poll() is None
    finally:
        writer.kill()  # a VM killed while running: its bitmap stays in_use, QEMU never stored what it marked
        writer.wait(30)
    inc = fb.backup_volume(str(vol), "qcow2", dest, driver="qcow2")
    assert inc["plan"]["type"] == "diff" and "every block compared" in inc["plan"]["reason"], inc["plan"]
    assert inc["read_blocks"] == 16 and inc["backup"]["dataBytes"] == BLOCK_SIZE  # block 8 changed, found anyway
    assert bitmap_names(vol) == [inc["backup"]["snapshot"]]
    fb.restore_volume(dest, str(tmp_path / "r.raw"))
    assert sha256(tmp_path / "r.raw") == as_raw(vol, tmp_path, "qcow2")


def test_two_destinations_of_a_qcow2_volume_keep_their_own_bitmaps(tmp_path):
    vol = qcow2_volume(tmp_path)
    a = fb.backup_volume(str(vol), "qcow2", str(tmp_path / "a"), driver="qcow2")
    b = fb.backup_volume(str(vol), "qcow2", str(tmp_path / "b"), driver="qcow2")
    assert bitmap_names(vol) == sorted([a["backup"]["snapshot"], b["backup"]["snapshot"]])
    assert qemu_io(vol, "write -P 0x11 2M 4k").returncode == 0
    a2 = fb.backup_volume(str(vol), "qcow2", str(tmp_path / "a"), driver="qcow2")
    assert a2["read_blocks"] == 1 and a2["removed_snapshots"] == [a["backup"]["snapshot"]]
    assert bitmap_names(vol) == sorted([a2["backup"]["snapshot"], b["backup"]["snapshot"]])
    b2 = fb.backup_volume(str(vol), "qcow2", str(tmp_path / "b"), driver="qcow2")
    assert b2["read_blocks"] == 1  # b's bitmap still marks the write since b's backup


def test_a_qcow2_backup_of_a_running_vm_is_refused_and_adds_no_bitmap(tmp_path):
    vol = qcow2_volume(tmp_path)
    writer = subprocess.Popen(["qemu-io", "-f", "qcow2", "-c", "sleep 60000", str(vol)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(os.path.realpath(f"/proc/{writer.pid}/fd/{fd}") == str(vol)
                                                      for fd in os.listdir(f"/proc/{writer.pid}/fd")):
            time.sleep(0.05)
        with pytest.raises(BackupError, match="is in use by"):
            fb.backup_volume(str(vol), "qcow2", str(tmp_path / "bk"), driver="qcow2")
    finally:
        writer.kill()
        writer.wait(30)
    assert bitmap_names(vol) == []


def test_a_compressed_qcow2_is_read_through_a_temporary_raw_conversion(tmp_path):
    src = raw_volume(tmp_path / "s.raw", 16, {0: b"compressed" * 1000, 3: os.urandom(MiB)})
    comp = tmp_path / "c.qcow2"
    qemu_img("convert", "-c", "-f", "raw", "-O", "qcow2", str(src), str(comp))
    reader = Qcow2Source(str(comp))
    try:
        assert reader._raw is not None and reader._tmpdir  # no fixed offset for compressed clusters
    finally:
        reader.close()
    assert not os.path.exists(reader._tmpdir), "the temporary conversion is removed"
    dest = str(tmp_path / "bk")
    fb.backup_volume(str(comp), "qcow2", dest, driver="qcow2")
    fb.restore_volume(dest, str(tmp_path / "r.raw"))
    assert sha256(tmp_path / "r.raw") == sha256(src)


def test_a_damaged_backup_is_refused_naming_the_block_and_nothing_is_left_at_the_target(tmp_path):
    vol = raw_volume(tmp_path / "v.raw", 32, {2: b"precious data" * 300})
    dest = str(tmp_path / "bk")
    b = fb.backup_volume(str(vol), "raw", dest)["backup"]
    data = Path(dest) / b["id"] / DATA_FILE
    blob = bytearray(data.read_bytes())
    pos = bytes(blob).index(b"precious data") + 3
    blob[pos] ^= 0xFF
    data.write_bytes(bytes(blob))
    _chain, problems = bio.verify_chain(dest, None)
    assert [p.index for p in problems if p.where == "image"] == [2]
    with pytest.raises(BackupError, match=r"image block 2 \(offset 8 MiB"):
        fb.restore_volume(dest, str(tmp_path / "r.raw"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bk", "v.raw"]  # no target, no temporary file


def test_a_volume_open_for_writing_is_refused_and_qemu_cannot_start_writing_during_a_backup(tmp_path):
    vol = raw_volume(tmp_path / "v.raw", 16, {0: b"x"})
    writer = subprocess.Popen(["qemu-io", "-f", "raw", "-c", "sleep 60000", str(vol)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until qemu-io has the file open
            if any(os.path.realpath(f"/proc/{writer.pid}/fd/{fd}") == str(vol)
                   for fd in os.listdir(f"/proc/{writer.pid}/fd")):
                break
            time.sleep(0.05)
        with pytest.raises(BackupError, match=rf"is in use by pid {writer.pid} \(qemu-io\); stop the VM"):
            fb.backup_volume(str(vol), "raw", str(tmp_path / "bk"))
    finally:
        writer.kill()
        writer.wait(30)
    assert not (tmp_path / "bk").exists()
    with hold_off_writers(str(vol)):
        refused = qemu_io(vol, "write 0 512", fmt="raw")
        assert refused.returncode != 0 and 'Failed to get "write" lock' in refused.stderr + refused.stdout
        assert qemu_io(vol, "read 0 512", fmt="raw", read_only=True).returncode == 0  # readers are fine
    assert qemu_io(vol, "write 0 512", fmt="raw").returncode == 0  # released afterwards


# -- killed midway ---------------------------------------------------------------------------------------------

KILL_SCRIPT = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.zjusct.cloud.plugins.module_utils.storage import destination_local, file_backup, volume_blocks
where, what = sys.argv[2], sys.argv[3:]

def die(*_args, **_kw):
    os.kill(os.getpid(), signal.SIGKILL)

def after(n, real):
    calls = []
    def hook(self, *args, **kw):
        calls.append(1)
        if len(calls) > n:
            die()
        return real(self, *args, **kw)
    return hook

if where == "reading":  # after 3 blocks read
    real = volume_blocks.RawSource.blocks
    def blocks(self, only=None):
        for i, item in enumerate(real(self, only)):
            if i == 3:
                die()
            yield item
    volume_blocks.RawSource.blocks = blocks
elif where == "writing":  # in the middle of the data file (its 3rd write)
    destination_local.LocalFile.write = after(3, destination_local.LocalFile.write)
elif where == "manifest":  # the manifest is written, the complete marker is not
    destination_local.LocalStaging.commit = die
elif where == "applying":  # a restore, in the middle of writing the new volume
    volume_blocks.RawTarget.write = after(2, volume_blocks.RawTarget.write)
elif where == "linking":  # a restore, verified and about to give the volume its name
    file_backup.os.link = die
if what[0] == "backup":
    file_backup.backup_volume(what[1], "raw", what[2])
else:
    file_backup.restore_volume(what[1], what[2], what[3])
print("not killed")
"""


def killed(where: str, *what: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(REPO / ".collections"), where, *what],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == -signal.SIGKILL, (where, proc.returncode, proc.stdout, proc.stderr[-2000:])
    return proc


@pytest.mark.parametrize("where", ["reading", "writing", "manifest"])
def test_a_backup_killed_midway_leaves_nothing_complete_and_the_volume_untouched_and_writable(tmp_path, where):
    vol = raw_volume(tmp_path / "v.raw", 40, {i: os.urandom(BLOCK_SIZE) for i in range(0, 10, 2)})
    dest = tmp_path / "bk"
    first = fb.backup_volume(str(vol), "raw", str(dest))["backup"]["id"]
    write_at(vol, 0, b"changed since the first backup")
    before = sha256(vol)
    killed(where, "backup", str(vol), str(dest))
    complete, partial, _bad = bio.scan(str(dest))
    assert [m.id for m in complete] == [first] and len(partial) == 1, (complete, partial)
    assert not (dest / partial[0] / COMPLETE_FILE).exists()
    assert sha256(vol) == before
    # the killed run left no lock behind: a VM (QEMU) can open the volume for writing
    assert qemu_io(vol, "write -P 0x5a 0 512", fmt="raw").returncode == 0
    after = fb.backup_volume(str(vol), "raw", str(dest))
    assert after["removed_partials"] == partial and after["plan"]["type"] == "diff"
    fb.restore_volume(str(dest), str(tmp_path / "r.raw"))
    assert sha256(tmp_path / "r.raw") == sha256(vol)


@pytest.mark.parametrize("where", ["applying", "linking"])
def test_a_restore_killed_midway_leaves_no_volume_and_the_next_restore_cleans_up(tmp_path, where):
    vol = raw_volume(tmp_path / "v.raw", 40, {i: os.urandom(BLOCK_SIZE) for i in range(0, 10, 2)})
    dest = tmp_path / "bk"
    fb.backup_volume(str(vol), "raw", str(dest))
    target = tmp_path / "vols" / "r.raw"
    killed(where, "restore", str(dest), str(target), "raw")
    assert not target.exists()
    leftovers = sorted(p.name for p in target.parent.iterdir())
    assert len(leftovers) == 1 and leftovers[0].startswith("r.raw.restoring-"), leftovers
    done = fb.restore_volume(str(dest), str(target))
    assert done["removed_leftovers"] == leftovers
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.raw"] and sha256(target) == sha256(vol)
