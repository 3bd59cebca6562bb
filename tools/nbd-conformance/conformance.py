#!/usr/bin/python3
"""NBD conformance cases for a server, driven by libnbd (an NBD client
written apart from nvraid), modelled on the case list of the NBD project's
own tester (nbd-tester-client): handshake, list, read, write, flush,
integrity, read-only writes, plus the cases nvraid's issue tracker asked
for (requests of no particular alignment from a client that negotiated no
block sizes, oversized and out-of-range requests, multi-conn flushes).

    tools/nbd-conformance/conformance.py URI [--read-only] [--cases a,b,...]
        [--marker-write | --marker-check]

URI is an NBD URI (nbd://HOST:PORT/ or nbd+unix:///?socket=PATH). Every
case prints PASS or FAIL with its reason; the exit status is 1 if any
failed. --marker-write writes and flushes a pattern at a fixed place and
exits; --marker-check reads it back (for a test that kills the server in
between). Needs Debian's python3-libnbd (run with /usr/bin/python3).
"""
import argparse
import errno
import os
import random
import sys

import nbd

KIB = 1024
MIB = 1024 * KIB
MARKER_OFFSET = 3 * MIB + 12 * KIB
MARKER = bytes(random.Random(20261125).getrandbits(8) for _ in range(64 * KIB))


class Failure(Exception):
    pass


def expect(condition, why):
    if not condition:
        raise Failure(why)


def handle():
    h = nbd.NBD()
    # An nbds:// URI may name the client's certificates directory.
    h.set_uri_allow_local_file(True)
    return h


def connect(uri, structured=True, block_sizes=True, strict=True):
    h = handle()
    h.set_request_structured_replies(structured)
    h.set_request_block_size(block_sizes)
    if not strict:
        # Send what the server must refuse (or serve) itself, instead of
        # libnbd refusing it before it leaves the client.
        h.set_strict_mode(0)
    h.connect_uri(uri)
    return h


def errno_of(call):
    """Run `call`; the errno of the NBD error it raised, or None."""
    try:
        call()
    except nbd.Error as e:
        return e.errnum
    return None


class Model:
    """What the export should hold where this run wrote."""

    def __init__(self, h):
        self.h = h
        self.known = {}  # offset of a 4 KiB block -> bytes

    def write(self, offset, data, flags=0):
        self.h.pwrite(data, offset, flags)
        for at in range(0, len(data), 4 * KIB):
            self.known[offset + at] = data[at:at + 4 * KIB]

    def check(self, offset, data, what):
        for at in range(0, len(data), 4 * KIB):
            want = self.known.get(offset + at)
            if want is not None and data[at:at + 4 * KIB] != want:
                raise Failure(f"{what}: bytes at {offset + at} differ from what was written")


def case_handshake(a, uri):
    h = handle()
    h.set_opt_mode(True)
    h.connect_uri(uri)
    h.opt_info()
    size = h.get_size()
    expect(size > 0, "export size is 0")
    minimum = h.get_block_size(nbd.SIZE_MINIMUM)
    preferred = h.get_block_size(nbd.SIZE_PREFERRED)
    maximum = h.get_block_size(nbd.SIZE_MAXIMUM)
    # Block sizes are optional (0: not advertised), but all or none.
    if (minimum, preferred, maximum) != (0, 0, 0):
        expect(minimum in (1, 512, 4096), f"minimum block size {minimum}")
        expect(preferred >= minimum and preferred & (preferred - 1) == 0,
               f"preferred block size {preferred}")
        expect(maximum >= MIB, f"maximum block size {maximum}")
    h.opt_go()
    expect(h.get_size() == size, "size changed between NBD_OPT_INFO and NBD_OPT_GO")
    expect(h.can_flush() and h.can_fua(), "FLUSH and FUA are not offered")
    expect(h.can_multi_conn(), "CAN_MULTI_CONN is not offered")
    expect(h.is_read_only() == a.read_only,
           f"read-only flag is {h.is_read_only()}, expected {a.read_only}")
    if not a.read_only:
        expect(h.can_trim() and h.can_zero(), "TRIM and WRITE_ZEROES are not offered")
    h.shutdown()
    # A client that asks for no structured replies and no block sizes.
    h = connect(uri, structured=False, block_sizes=False)
    expect(not h.get_structured_replies_negotiated(), "structured replies were forced")
    expect(len(h.pread(4 * KIB, 0)) == 4 * KIB, "short read with simple replies")
    h.shutdown()
    return f"size {size}, blocks {minimum}/{preferred}/{maximum}"


def case_list(a, uri):
    h = handle()
    h.set_opt_mode(True)
    h.connect_uri(uri)
    names = []
    h.opt_list(lambda name, description: names.append(name) or 0)
    expect(h.get_export_name() in names, f"the export is not listed: {names}")
    h.opt_abort()
    return f"exports {names}"


def case_read(a, uri):
    for structured in (True, False):
        h = connect(uri, structured=structured)
        size = h.get_size()
        for offset, length in [(0, 4 * KIB), (size - 4 * KIB, 4 * KIB), (60 * KIB, 8 * KIB),
                               (size // 2, 512 * KIB), (MIB, 3 * MIB)]:
            data = h.pread(length, offset)
            expect(len(data) == length, f"read of {length} at {offset} returned {len(data)}")
            again = h.pread(length, offset)
            expect(data == again, f"two reads at {offset} differ")
        h.shutdown()
    return "reads at the start, the end, across chunks, longer than a server slot"


def case_write(a, uri):
    h = connect(uri)
    model = Model(h)
    rng = random.Random(1)
    for offset, length in [(0, 4 * KIB), (64 * KIB - 4 * KIB, 8 * KIB), (5 * MIB, MIB),
                           (7 * MIB, 3 * MIB), (h.get_size() - 8 * KIB, 8 * KIB)]:
        model.write(offset, rng.randbytes(length))
        model.check(offset, h.pread(length, offset), f"write of {length} at {offset}")
    h.shutdown()
    return "writes of 4 KiB to 3 MiB read back"


def case_flush(a, uri):
    h = connect(uri)
    rng = random.Random(2)
    h.pwrite(rng.randbytes(128 * KIB), 11 * MIB)
    h.flush()
    h.pwrite(rng.randbytes(64 * KIB), 12 * MIB, nbd.CMD_FLAG_FUA)
    # Multi-conn: a flush on one connection covers a write completed on
    # another.
    other = connect(uri)
    data = rng.randbytes(64 * KIB)
    h.pwrite(data, 13 * MIB)
    other.flush()
    expect(other.pread(len(data), 13 * MIB) == data, "another connection reads other data")
    other.shutdown()
    h.shutdown()
    return "FLUSH, FUA, a flush on a second connection"


def case_integrity(a, uri):
    """Many requests in flight at once, mixed, each read checked."""
    h = connect(uri)
    rng = random.Random(3)
    area = 32 * MIB
    base = 16 * MIB
    blocks = area // (4 * KIB)
    model = {}  # block -> bytes
    in_flight = {}  # cookie -> (kind, first block, count, buffer)
    # Blocks with a request in flight: a new request never overlaps one
    # (a read racing a write to the same block may see either).
    busy = set()
    done = 0
    reads = 0
    ops = 3000
    issued = 0
    while done < ops:
        while issued < ops and len(in_flight) < 32:
            count = rng.choice([1, 1, 2, 4, 16, 64])
            first = rng.randrange(0, blocks - count)
            span = set(range(first, first + count))
            if span & busy:
                break
            offset = base + first * 4 * KIB
            if rng.random() < 0.5:
                data = rng.randbytes(count * 4 * KIB)
                cookie = h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(data)), offset)
                in_flight[cookie] = ("w", first, count, data)
            else:
                buf = nbd.Buffer(count * 4 * KIB)
                cookie = h.aio_pread(buf, offset)
                in_flight[cookie] = ("r", first, count, buf)
            busy |= span
            issued += 1
        h.poll(-1)
        for cookie in list(in_flight):
            if not h.aio_command_completed(cookie):
                continue
            kind, first, count, payload = in_flight.pop(cookie)
            done += 1
            busy -= set(range(first, first + count))
            if kind == "w":
                for i in range(count):
                    model[first + i] = payload[i * 4 * KIB:(i + 1) * 4 * KIB]
            else:
                reads += 1
                got = payload.to_bytearray()
                for i in range(count):
                    want = model.get(first + i)
                    if want is not None and got[i * 4 * KIB:(i + 1) * 4 * KIB] != want:
                        raise Failure(f"read of block {first + i} in flight returned other data")
    # Every block written, read back at the end.
    for block, want in model.items():
        got = h.pread(4 * KIB, base + block * 4 * KIB)
        expect(got == want, f"block {block} differs at the end")
    h.shutdown()
    return f"{ops} requests, 32 in flight, {reads} reads checked, {len(model)} blocks verified"


def case_zero(a, uri):
    h = connect(uri)
    rng = random.Random(4)
    h.pwrite(rng.randbytes(MIB), 20 * MIB)
    h.zero(256 * KIB, 20 * MIB + 128 * KIB)
    got = h.pread(MIB, 20 * MIB)
    expect(got[128 * KIB:384 * KIB] == bytes(256 * KIB), "WRITE_ZEROES left data")
    h.trim(64 * KIB, 21 * MIB)
    h.shutdown()
    return "WRITE_ZEROES reads back zeros; TRIM accepted"


def case_unaligned(a, uri):
    """A client that negotiated no block sizes may send any alignment; the
    server should serve it (proto.md), as nbdkit and nbd-server do."""
    h = connect(uri, structured=False, block_sizes=False, strict=False)
    model = bytearray(h.pread(64 * KIB, 24 * MIB))
    rng = random.Random(5)
    for _ in range(64):
        offset = rng.randrange(0, 60 * KIB)
        length = rng.choice([1, 100, 511, 512, 1000, 1024, 4097])
        data = rng.randbytes(length)
        h.pwrite(data, 24 * MIB + offset)
        model[offset:offset + length] = data
        back = h.pread(length, 24 * MIB + offset)
        expect(back == data, f"unaligned write of {length} at +{offset} read back other data")
    expect(h.pread(64 * KIB, 24 * MIB) == bytes(model), "bytes around unaligned writes changed")
    h.shutdown()
    return "64 writes of 1 byte to 4097 bytes at any offset"


def case_bad_requests(a, uri):
    h = connect(uri, strict=False)
    size = h.get_size()
    maximum = h.get_block_size(nbd.SIZE_MAXIMUM)
    got = errno_of(lambda: h.pread(4 * KIB, size))
    expect(got is not None, "a read past the end succeeded")
    if maximum:
        got = errno_of(lambda: h.pread(maximum + 4 * KIB, 0))
        expect(got is not None, "a read longer than the maximum block size succeeded")
    expect(len(h.pread(4 * KIB, 0)) == 4 * KIB, "the connection broke after refused requests")
    h.shutdown()
    return "past the end and oversized requests refused; the connection goes on"


def case_read_only_writes(a, uri):
    h = connect(uri, strict=False)
    expect(h.is_read_only(), "the export is not read-only")
    for what, call in [("write", lambda: h.pwrite(bytes(4 * KIB), 0)),
                       ("trim", lambda: h.trim(4 * KIB, 0)),
                       ("write-zeroes", lambda: h.zero(4 * KIB, 0))]:
        got = errno_of(call)
        expect(got == errno.EPERM, f"{what} on a read-only export: errno {got}, expected EPERM")
    expect(len(h.pread(4 * KIB, 0)) == 4 * KIB, "reads fail after refused writes")
    h.shutdown()
    return "write, trim and write-zeroes refused with EPERM; reads go on"


WRITABLE = ["handshake", "list", "read", "write", "flush", "integrity", "zero", "unaligned",
            "bad_requests"]
READ_ONLY = ["handshake", "list", "read", "bad_requests", "read_only_writes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("uri")
    ap.add_argument("--read-only", action="store_true", help="the export is read-only")
    ap.add_argument("--cases", help="comma-separated subset")
    ap.add_argument("--marker-write", action="store_true")
    ap.add_argument("--marker-check", action="store_true")
    a = ap.parse_args()
    if a.marker_write:
        h = connect(a.uri)
        h.pwrite(MARKER, MARKER_OFFSET)
        h.flush()
        print("marker written and flushed")
        return 0
    if a.marker_check:
        h = connect(a.uri)
        if h.pread(len(MARKER), MARKER_OFFSET) != MARKER:
            print("FAIL marker: a flushed write was lost")
            return 1
        print("PASS marker: the flushed write is there")
        return 0
    cases = a.cases.split(",") if a.cases else (READ_ONLY if a.read_only else WRITABLE)
    failed = 0
    for name in cases:
        try:
            detail = globals()[f"case_{name}"](a, a.uri)
            print(f"PASS {name}: {detail}", flush=True)
        except (Failure, nbd.Error) as e:
            failed += 1
            print(f"FAIL {name}: {e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
