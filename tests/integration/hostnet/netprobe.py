"""Hand-made frames and a frame capture, for the network isolation tests (Python 3 standard library only).

Runs as a script: inside a guest (``ssh ... python3 - <command> ...`` with this file on stdin), in a
namespace standing in for a guest, or in the cloud's namespace (``ip netns exec <ns> python3 netprobe.py``).

Commands (each prints one JSON document):

* ``udp``: Ethernet + IPv4 + UDP frames with any source MAC/IP, sent through an AF_PACKET socket.
* ``arp``: ARP requests or replies with any sender hardware/protocol address.
* ``routed``: ordinary sockets to one address: ICMP echo (raw socket), UDP and a TCP connect, each
  carrying or preceded by a marker, for traffic that the guest's routing table sends.
* ``capture``: record frames on interfaces that carry a marker or an IPv4 source/destination pair,
  until a control marker is seen (or a timeout); ``ready`` is written to stdout once the sockets are
  bound, then the JSON result at the end.
* ``listen``: a TCP and a UDP listener on one port; reports every peer/datagram until the control
  datagram arrives (or a timeout; ``--once``: until the first TCP connection).
* ``ping``: one ICMP echo request; reports whether the reply came.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import sys
import time

ETH_P_ALL, ETH_P_IP, ETH_P_ARP = 0x0003, 0x0800, 0x0806


def mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def iface_for(mac: str) -> str:
    """The interface that has MAC ``mac`` (or the first non-loopback one when ``mac`` is empty)."""
    for name in sorted(os.listdir("/sys/class/net")):
        if name == "lo":
            continue
        with open(f"/sys/class/net/{name}/address", encoding="ascii") as fh:
            if not mac or fh.read().strip() == mac.lower():
                return name
    raise SystemExit(f"no interface with MAC {mac}")


def own_mac(iface: str) -> str:
    with open(f"/sys/class/net/{iface}/address", encoding="ascii") as fh:
        return fh.read().strip()


def udp_frame(src_mac: str, dst_mac: str, src_ip: str, dst_ip: str, dport: int, payload: bytes) -> bytes:
    udp = struct.pack("!HHHH", 40000, dport, 8 + len(payload), 0) + payload
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                         socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
    header = header[:10] + struct.pack("!H", checksum(header)) + header[12:]
    return mac_bytes(dst_mac) + mac_bytes(src_mac) + struct.pack("!H", ETH_P_IP) + header + udp


def arp_frame(op: int, src_mac: str, dst_mac: str, sha: str, spa: str, tha: str, tpa: str) -> bytes:
    body = struct.pack("!HHBBH6s4s6s4s", 1, ETH_P_IP, 6, 4, op, mac_bytes(sha), socket.inet_aton(spa),
                       mac_bytes(tha), socket.inet_aton(tpa))
    return mac_bytes(dst_mac) + mac_bytes(src_mac) + struct.pack("!H", ETH_P_ARP) + body


def send_frames(iface: str, frames: list, count: int, interval: float) -> int:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind((iface, 0))
    sent = 0
    for i in range(count):
        for frame in frames:
            sock.send(frame)
            sent += 1
        if i + 1 < count:
            time.sleep(interval)
    return sent


def cmd_udp(args: argparse.Namespace) -> dict:
    iface = iface_for(args.own_mac)
    src_mac = args.src_mac or own_mac(iface)
    frame = udp_frame(src_mac, args.dst_mac, args.src_ip, args.dst_ip, args.dport, args.marker.encode())
    return {"iface": iface, "sent": send_frames(iface, [frame], args.count, args.interval)}


def cmd_arp(args: argparse.Namespace) -> dict:
    iface = iface_for(args.own_mac)
    src_mac = args.src_mac or own_mac(iface)
    frames = []
    for op in args.op:  # 1 = request (who-has tpa, tell spa), 2 = reply (spa is-at sha)
        frames.append(arp_frame(op, src_mac, "ff:ff:ff:ff:ff:ff", args.sha or src_mac, args.spa,
                                "00:00:00:00:00:00" if op == 1 else "ff:ff:ff:ff:ff:ff", args.tpa))
    return {"iface": iface, "sent": send_frames(iface, frames, args.count, args.interval)}


def cmd_routed(args: argparse.Namespace) -> dict:
    marker = args.marker.encode()
    result: dict = {}
    for i in range(args.count):
        icmp = struct.pack("!BBHHH", 8, 0, 0, 0x7A7A, i) + marker
        icmp = icmp[:2] + struct.pack("!H", checksum(icmp)) + icmp[4:]
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as raw:
            raw.sendto(icmp, (args.dst_ip, 0))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(marker, (args.dst_ip, args.dport))
        time.sleep(args.interval)
    try:
        with socket.create_connection((args.dst_ip, args.tcp_port), timeout=args.tcp_timeout) as conn:
            result["tcp"] = conn.recv(64).decode(errors="replace")
    except OSError as exc:
        result["tcp_error"] = str(exc)
    return result


def cmd_ping(args: argparse.Namespace) -> dict:
    """One ICMP echo request (raw socket); waits for the matching reply until the timeout."""
    ident = os.getpid() & 0xFFFF
    icmp = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"zjusct-ping"
    icmp = icmp[:2] + struct.pack("!H", checksum(icmp)) + icmp[4:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as raw:
        raw.sendto(icmp, (args.dst_ip, 0))
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            readable, _, _ = select.select([raw], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                break
            packet, peer = raw.recvfrom(2048)
            body = packet[(packet[0] & 0x0F) * 4:]
            if peer[0] == args.dst_ip and body[0] == 0 and struct.unpack("!H", body[4:6])[0] == ident:
                return {"reply": True}
    return {"reply": False}


def frame_matches(frame: bytes, markers: list, pairs: list, arp: bool) -> list:
    hits = [m for m in markers if m.encode() in frame]
    if len(frame) >= 34 and frame[12:14] == b"\x08\x00":
        src, dst = socket.inet_ntoa(frame[26:30]), socket.inet_ntoa(frame[30:34])
        hits += [f"{s}>{d}" for s, d in pairs if (s, d) == (src, dst)]
    if arp and len(frame) >= 42 and frame[12:14] == b"\x08\x06":
        sha = ":".join(f"{b:02x}" for b in frame[22:28])
        hits.append(f"arp {socket.inet_ntoa(frame[28:32])} {sha}")
    return hits


def cmd_capture(args: argparse.Namespace) -> dict:
    socks = {}
    for iface in args.iface:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.bind((iface, 0))
        socks[sock] = iface
    pairs = [tuple(p.split(">", 1)) for p in args.pair]
    seen: dict = {}
    until_seen = False
    print("ready", flush=True)
    deadline = time.monotonic() + args.timeout
    while not until_seen and time.monotonic() < deadline:
        readable, _, _ = select.select(list(socks), [], [], max(0.0, deadline - time.monotonic()))
        for sock in readable:
            frame = sock.recv(65535)
            iface = socks[sock]
            if args.until and args.until.encode() in frame:
                until_seen = True
            for hit in frame_matches(frame, args.marker, pairs, args.arp):
                seen.setdefault(hit, {}).setdefault(iface, 0)
                seen[hit][iface] += 1
    return {"seen": seen, "until_seen": until_seen}


def cmd_listen(args: argparse.Namespace) -> dict:
    tcp = socket.create_server((args.host, args.port))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((args.host, args.port))
    print("ready", flush=True)
    peers: list = []
    datagrams: list = []
    deadline = time.monotonic() + args.timeout
    done = False
    while not done and time.monotonic() < deadline:
        readable, _, _ = select.select([tcp, udp], [], [], max(0.0, deadline - time.monotonic()))
        for sock in readable:
            if sock is tcp:
                conn, peer = tcp.accept()
                peers.append(peer[0])
                conn.sendall(b"hello")
                conn.close()
                done = done or args.once
            else:
                data, peer = udp.recvfrom(2048)
                if data == args.until.encode():
                    done = True
                else:
                    datagrams.append([peer[0], data.decode(errors="replace")])
    return {"tcp_peers": peers, "datagrams": datagrams, "until_seen": done}


def main(argv: list) -> None:
    parser = argparse.ArgumentParser(prog="netprobe")
    sub = parser.add_subparsers(dest="command", required=True)
    udp = sub.add_parser("udp")
    arp = sub.add_parser("arp")
    for p in (udp, arp):
        p.add_argument("--own-mac", default="", help="pick the interface by its MAC (default: first)")
        p.add_argument("--src-mac", default="", help="Ethernet source (default: the interface's own)")
        p.add_argument("--count", type=int, default=3)
        p.add_argument("--interval", type=float, default=0.5)
    udp.add_argument("--dst-mac", required=True)
    udp.add_argument("--src-ip", required=True)
    udp.add_argument("--dst-ip", required=True)
    udp.add_argument("--dport", type=int, default=9)
    udp.add_argument("--marker", required=True)
    arp.add_argument("--op", type=int, action="append", required=True)
    arp.add_argument("--sha", default="")
    arp.add_argument("--spa", required=True)
    arp.add_argument("--tpa", required=True)
    routed = sub.add_parser("routed")
    routed.add_argument("--dst-ip", required=True)
    routed.add_argument("--dport", type=int, default=9)
    routed.add_argument("--tcp-port", type=int, default=22)
    routed.add_argument("--tcp-timeout", type=float, default=3)
    routed.add_argument("--marker", required=True)
    routed.add_argument("--count", type=int, default=3)
    routed.add_argument("--interval", type=float, default=0.3)
    capture = sub.add_parser("capture")
    capture.add_argument("--iface", action="append", required=True)
    capture.add_argument("--marker", action="append", default=[])
    capture.add_argument("--pair", action="append", default=[], help="SRC>DST IPv4 pair to record")
    capture.add_argument("--until", default="")
    capture.add_argument("--timeout", type=float, default=30)
    capture.add_argument("--arp", action="store_true", help="record ARP frames as 'arp SPA SHA'")
    listen = sub.add_parser("listen")
    listen.add_argument("--host", required=True)
    listen.add_argument("--port", type=int, required=True)
    listen.add_argument("--until", required=True)
    listen.add_argument("--timeout", type=float, default=30)
    listen.add_argument("--once", action="store_true", help="stop after the first TCP connection")
    ping = sub.add_parser("ping")
    ping.add_argument("--dst-ip", required=True)
    ping.add_argument("--timeout", type=float, default=5)
    args = parser.parse_args(argv)
    handler = {"udp": cmd_udp, "arp": cmd_arp, "routed": cmd_routed, "capture": cmd_capture,
               "listen": cmd_listen, "ping": cmd_ping}[args.command]
    print(json.dumps(handler(args)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
