#!/usr/bin/env python3
"""Builds the fuzz targets' seed corpus from the Go test vectors in tests/go-vectors.

The corpus is generated, never committed: run this before fuzzing (.ci/fuzz does). Each
target's input starts with options (one byte for decode, two for session: see the targets'
docs), then bytes from the vectors: single frames from frames.jsonl, and whole captured byte
streams from sessions/.

Usage: gen_corpus.py [VECTORS_DIR]   (default: ../tests/go-vectors relative to this file)
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# The greeting of a peer of this crate: a Keepalive (kind 1) with id "gmux" (little-endian) and
# its keepalive interval in milliseconds (30,000) in its length field.
GREETING = b"gmux" + (30_000).to_bytes(3, "little") + bytes([1])


def main():
    vectors = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "go-vectors")
    if not os.path.isdir(vectors):
        print(f"no vectors at {vectors}: corpus not generated", file=sys.stderr)
        return 1

    seeds = []  # (name, wire bytes, is a client-to-server capture)
    with open(os.path.join(vectors, "frames.jsonl")) as lines:
        for line in lines:
            if line.strip():
                vector = json.loads(line)
                # A header whose Data payload is described rather than stored gets it back
                # (byte i = i * 7 mod 256, as tests/go-vectors/README.md says).
                wire = bytes.fromhex(vector["wire_hex"])
                if vector["flags"] == 0 and len(wire) == 8 and vector["length"] > 0:
                    wire += bytes((i * 7) % 256 for i in range(vector["length"]))
                seeds.append((f"frame_{vector['name']}", wire, vector["id"] % 2 == 0))
    sessions = os.path.join(vectors, "sessions")
    all_frames = b"".join(wire for _, wire, _ in seeds)
    seeds.append(("frames_all", all_frames, False))
    for name in sorted(os.listdir(sessions)):
        for direction in ("client_to_server", "server_to_client"):
            path = os.path.join(sessions, name, f"{direction}.bin")
            if os.path.exists(path):
                with open(path, "rb") as capture:
                    seeds.append((f"{name}_{direction}", capture.read(), direction == "client_to_server"))

    written = 0
    for target in ("decode", "roundtrip", "session"):
        out = os.path.join(HERE, "corpus", target)
        os.makedirs(out, exist_ok=True)
        for name, wire, from_client in seeds:
            if target == "session" and not from_client:
                continue  # The session target plays a client talking to a server.
            # Options: decode and session get a few cut sizes; the round trip reads raw frames.
            # The session's second byte: no close, or the peer closing half-way through (alone,
            # or at the same moment as the application).
            if target == "roundtrip":
                option_bytes = [b""]
            elif target == "decode":
                option_bytes = [bytes([o]) for o in (0, 1, 6)]
            else:
                option_bytes = [bytes([o, 0]) for o in (0, 1, 6)]
                option_bytes += [bytes([0, c]) for c in (0x81, 0x83)]
            for options in option_bytes:
                suffix = "".join(f"_{o}" for o in options)
                with open(os.path.join(out, f"{name}{suffix}"), "wb") as seed:
                    seed.write(options + wire)
                written += 1
            if target == "session":
                # The same bytes from a peer of this crate, which greets first: the session
                # then acknowledges what it accepts, and the target checks every stream's fate
                # when the session closes (the peer goes quiet and the application closes, or
                # both close at once), and besides with the peer's own close.
                for options in (bytes([4, 0]), bytes([0, 0x81]), bytes([0, 0x83])):
                    suffix = "".join(f"_{o}" for o in options)
                    with open(os.path.join(out, f"greeted_{name}{suffix}"), "wb") as seed:
                        seed.write(options + GREETING + wire)
                    written += 1
    print(f"wrote {written} seeds from {len(seeds)} vectors into {os.path.join(HERE, 'corpus')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
